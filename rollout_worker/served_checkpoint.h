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
// The file can also be the worker's only copy (DirectoryWeightSink, weight_sink.h): Map gives its
// tensors as a model whose bytes are the file's, mapped for writing; the next version is applied
// to that model in place (each changed element written once, straight into the file's pages), and
// the Write that follows writes nothing.
//
// CheckModelDirectory compares what an engine loaded (the safetensors files of its model
// directory) with a served model, so that a worker refuses an engine serving another model before
// it loads anything into it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/file_util.h"
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
  // Errors name the file; after one the next write starts over with a whole file. A model whose
  // tensors are the file's own bytes (Map) is already there: only its digests are taken.
  Status Write(const sync::ServedModel& model, const std::string& template_dir);

  // The tensors of the weights file as the last Write left it, in file order, as views of the
  // file mapped for writing (the mapping lives as long as the model or this object does). The
  // digests are the ones that Write was given. Unavailable when no Write has completed since the
  // file last changed, or the file cannot be mapped.
  Result<sync::ServedModel> Map();
  // The file's bytes are about to change in place (through a model from Map): until the next
  // Write of that model, the file holds no version, and a Write of another model rewrites it
  // whole.
  void WillChangeInPlace() { valid_ = false; }

  const std::string& dir() const { return dir_; }
  // What the last Write wrote: tensors and bytes (the whole file's bytes for a whole write; none
  // for a model mapped here, whose changed tensors are counted).
  uint64_t last_tensors_written() const { return last_tensors_; }
  uint64_t last_bytes_written() const { return last_bytes_; }
  bool last_write_whole() const { return last_whole_; }

 private:
  Status WriteWhole(const sync::ServedModel& model, const std::string& template_dir);
  Status WriteChanged(const sync::ServedModel& model);
  // Whether every tensor of `model` is a view of the mapped file at its place in it.
  bool IsMappedHere(const sync::ServedModel& model) const;

  struct Placed {
    uint64_t offset = 0;  // of the tensor's bytes in the file
    uint64_t size = 0;
    sync::DType dtype = sync::DType::kF32;
    std::vector<uint64_t> shape;
    sync::Digest digest;
  };
  std::string dir_;
  bool valid_ = false;  // the file holds exactly `placed_`
  // The layout of the file (kept when the file's bytes change in place, which never moves them).
  std::map<std::string, Placed> placed_;
  std::shared_ptr<MappedFile>
      mapping_;  // the file, mapped for writing by Map; reset on a whole write
  uint64_t last_tensors_ = 0, last_bytes_ = 0;
  bool last_whole_ = false;
};

// Checks that the safetensors files in `dir` hold exactly the tensors of `model`: the same names,
// shapes and dtypes. The error lists the first differences ("tensor x: shape [4, 8] in the
// engine's model, [8, 8] in the policy") and names the directory.
Status CheckModelDirectory(const std::string& dir, const sync::ServedModel& model);

}  // namespace weft::rollout_worker
