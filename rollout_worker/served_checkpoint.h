// ServedCheckpoint: the directory a serving engine loads its weights from (on its host, or on a
// file system its hosts share), kept at the version the worker holds.
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
// The file can also be the worker's only copy (DirectoryWeightSink, weight_sink.h): a keyframe
// arrives straight into a new file (NewFile), mapped for writing, which the Write of that model
// puts in place; each later version is applied to the same model in place (each changed element
// written once, into the file's pages), and the Write that follows writes nothing but, on a
// network file system whose other hosts may hold the replicas, the changed pages back to the file
// (set_flush_mapped_writes).
//
// CheckModelDirectory compares what an engine loaded (the safetensors files of its model
// directory) with a served model, so that a worker refuses an engine serving another model before
// it loads anything into it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/status.h"
#include "sync/digest.h"
#include "sync/served_model.h"

namespace weft::rollout_worker {

inline constexpr char kServedWeightsFile[] = "model.safetensors";

// Where a tensor's bytes are in a weights file.
struct TensorPlace {
  uint64_t offset = 0;  // from the start of the file
  uint64_t size = 0;
  sync::DType dtype = sync::DType::kF32;
  std::vector<uint64_t> shape;
};

// A weights file being filled (ServedCheckpoint::NewFile): laid out for its tensors, allocated in
// full and mapped for writing, beside the directory's current file until a Write of a model whose
// tensors are its views puts it in place. Removed when the last reference to it goes (the views
// hold one), unless it was put in place.
class NewWeightsFile : public std::enable_shared_from_this<NewWeightsFile> {
 public:
  ~NewWeightsFile();
  NewWeightsFile(const NewWeightsFile&) = delete;
  NewWeightsFile& operator=(const NewWeightsFile&) = delete;

  // A view of the bytes of tensor `spec` in the file (thread-safe); kInvalidArgument when the
  // file has no tensor of that name, or has it with another dtype or shape.
  Result<sync::TensorStorage> Storage(const sync::TensorSpec& spec) const;
  // Whether every tensor of `model`, and only those, are views of this file at their places.
  bool Holds(const sync::ServedModel& model) const;

 private:
  friend class ServedCheckpoint;
  NewWeightsFile() = default;

  std::string path_;
  std::shared_ptr<MappedFile> mapping_;
  std::map<std::string, TensorPlace> layout_;
  bool in_place_ = false;
};

class ServedCheckpoint {
 public:
  explicit ServedCheckpoint(std::string dir) : dir_(std::move(dir)) {}

  // Brings the directory to `model`. `template_dir` (the directory the engine was started from;
  // may be the checkpoint directory itself) supplies the non-weight files on the first write.
  // Errors name the file; after one the next write starts over with a whole file. A model whose
  // tensors are views of a NewFile puts that file in place; one whose tensors are the current
  // file's own bytes (changed in place) is already there: only its digests are taken.
  Status Write(const sync::ServedModel& model, const std::string& template_dir);

  // A new weights file for `specs` (laid out as a whole write would), for a model to arrive into
  // without passing through host memory: a keyframe's bytes are placed straight into its views
  // (NewWeightsFile::Storage), and the Write of that model then puts the file in place (the
  // checks and the engine's files of a whole write; no byte copied). Only the newest such file
  // can be put in place.
  Result<std::shared_ptr<NewWeightsFile>> NewFile(const std::vector<sync::TensorSpec>& specs);
  // The file's bytes are about to change in place (through the model that came from a NewFile):
  // until the next Write of that model, the file holds no version, and a Write of another model
  // rewrites it whole.
  void WillChangeInPlace() { valid_ = false; }
  // Whether a Write of a model in a mapped file (a NewFile's, or the current file changed in
  // place) first flushes the mapping to the file, waiting for it: needed where the engine's
  // replicas may read the directory from other hosts, which see the changes only once written
  // back. Unless set here, NewFile decides it from the directory's file system (on for network
  // file systems, file_util.h's OnNetworkFileSystem; off where every reader shares this host's
  // page cache).
  void set_flush_mapped_writes(bool flush) { flush_mapped_ = flush; }
  std::optional<bool> flush_mapped_writes() const { return flush_mapped_; }

  const std::string& dir() const { return dir_; }
  // What the last Write wrote: tensors and bytes (the whole file's bytes for a whole write; none
  // for a model mapped here, whose changed tensors are counted).
  uint64_t last_tensors_written() const { return last_tensors_; }
  uint64_t last_bytes_written() const { return last_bytes_; }
  bool last_write_whole() const { return last_whole_; }

 private:
  Status WriteWhole(const sync::ServedModel& model, const std::string& template_dir);
  Status WriteChanged(const sync::ServedModel& model);
  // Makes the directory ready for a new weights file (created, a crash's leftovers but `keep`
  // removed, the engine's own model directory refused, its non-weight files copied, weight files
  // of other layouts removed).
  Status PrepareDirectory(const std::string& template_dir, const std::string& keep);
  Status PutInPlace(NewWeightsFile& file, const sync::ServedModel& model,
                    const std::string& template_dir);
  // Whether every tensor of `model` is a view of the mapped file at its place in it.
  bool IsMappedHere(const sync::ServedModel& model) const;

  struct Placed : TensorPlace {
    sync::Digest digest;  // of the bytes there
  };
  std::string dir_;
  bool valid_ = false;  // the file holds exactly `placed_`
  // The layout of the file (kept when the file's bytes change in place, which never moves them).
  std::map<std::string, Placed> placed_;
  // The file, when it came from a NewFile (reset when replaced).
  std::shared_ptr<MappedFile> mapping_;
  std::weak_ptr<NewWeightsFile> pending_;  // the newest NewFile, until put in place
  uint64_t last_tensors_ = 0, last_bytes_ = 0;
  bool last_whole_ = false;
  std::optional<bool> flush_mapped_;
};

// Checks that the safetensors files in `dir` hold exactly the tensors of `model`: the same names,
// shapes and dtypes. The error lists the first differences ("tensor x: shape [4, 8] in the
// engine's model, [8, 8] in the policy") and names the directory.
Status CheckModelDirectory(const std::string& dir, const sync::ServedModel& model);

}  // namespace weft::rollout_worker
