// ServedCheckpoint: the host-local directory a serving engine loads its weights from, kept at the
// version the worker holds.
//
// The directory is the engine's own layout: the non-weight files of the model directory the engine
// was started from (config.json, tokenizer files, generation_config.json, ...) copied once, and
// the served tensors in one `model.safetensors`, in the engine's number format, exactly the bytes
// whose digests the worker proved (its metadata marks it as the worker's). The engine's own model
// directory is never written into. The first write (and any write after a failure) writes the
// whole file atomically; later ones rewrite in place only the tensors whose digest changed, at
// their offsets in the file, so a version that changes a few tensors costs those tensors' bytes.
// The worker never writes while an engine loads from the directory (it loads replicas only after
// a write returns); an engine that restarts mid-write reads a torn file, which the worker
// overwrites with a reload once the engine is back.
//
// CheckModelDirectory compares what an engine loaded (the safetensors files of its model
// directory) with a served model, so that a worker refuses an engine serving another model before
// it loads anything into it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "sync/digest.h"
#include "sync/served_model.h"

namespace weft::rollout_worker {

inline constexpr char kServedWeightsFile[] = "model.safetensors";

class ServedCheckpoint {
 public:
  explicit ServedCheckpoint(std::string dir) : dir_(std::move(dir)) {}

  // Brings the directory to `model`. `template_dir` (the directory the engine was started from;
  // may be the checkpoint directory itself) supplies the non-weight files on the first write.
  // Errors name the file; after one the next write starts over with a whole file.
  Status Write(const sync::ServedModel& model, const std::string& template_dir);

  const std::string& dir() const { return dir_; }
  // What the last Write wrote: tensors and bytes (the whole file's bytes for a whole write).
  uint64_t last_tensors_written() const { return last_tensors_; }
  uint64_t last_bytes_written() const { return last_bytes_; }
  bool last_write_whole() const { return last_whole_; }

 private:
  Status WriteWhole(const sync::ServedModel& model, const std::string& template_dir);
  Status WriteChanged(const sync::ServedModel& model);

  struct Placed {
    uint64_t offset = 0;  // of the tensor's bytes in the file
    uint64_t size = 0;
    sync::DType dtype = sync::DType::kF32;
    std::vector<uint64_t> shape;
    sync::Digest digest;
  };
  std::string dir_;
  bool valid_ = false;  // the file holds exactly `placed_`
  std::map<std::string, Placed> placed_;
  uint64_t last_tensors_ = 0, last_bytes_ = 0;
  bool last_whole_ = false;
};

// Checks that the safetensors files in `dir` hold exactly the tensors of `model`: the same names,
// shapes and dtypes. The error lists the first differences ("tensor x: shape [4, 8] in the
// engine's model, [8, 8] in the policy") and names the directory.
Status CheckModelDirectory(const std::string& dir, const sync::ServedModel& model);

}  // namespace weft::rollout_worker
