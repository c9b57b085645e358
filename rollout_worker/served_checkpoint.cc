#include "rollout_worker/served_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/file_util.h"
#include "sync/safetensors.h"

namespace weft::rollout_worker {
namespace {

namespace fs = std::filesystem;

// In the weights file's metadata: a worker wrote it (so it may rewrite it).
constexpr char kServedMarker[] = "weft_served_checkpoint";

std::map<std::string, std::string> ServedMetadata() {
  return {{"format", "pt"}, {kServedMarker, "1"}};
}

// Gives the bytes [offset, offset + size) of `fd` blocks of their own (zeros), so that writing
// them through a mapping needs nothing more from the file system.
Status Allocate(int fd, uint64_t offset, uint64_t size, const std::string& what) {
  if (size == 0) return Status::Ok();
  const int failed = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(size));
  if (failed == 0) return Status::Ok();
  if (failed != EOPNOTSUPP && failed != EINVAL)
    return Unavailable(what + ": cannot allocate " + std::to_string(size) +
                       " bytes: " + std::strerror(failed));
  // A file system without fallocate: zeros written.
  const std::vector<uint8_t> zeros(1 << 20, 0);
  for (uint64_t done = 0; done < size;) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(zeros.size(), size - done));
    const ssize_t n = ::pwrite(fd, zeros.data(), take, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Unavailable(what + ": cannot write: " + std::strerror(errno));
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

bool IsWeightFile(const fs::path& path) {
  const std::string name = path.filename().string();
  return path.extension() == ".safetensors" || name == "model.safetensors.index.json" ||
         path.extension() == ".bin" || path.extension() == ".pt" || path.extension() == ".pth";
}

// Copies the regular non-weight files of `from` into `to` (the engine's configuration and
// tokenizer travel with the weights). Nothing to do when both are the same directory.
Status CopyModelFiles(const std::string& from, const std::string& to) {
  std::error_code error;
  if (from.empty() || fs::equivalent(from, to, error)) return Status::Ok();
  if (!fs::is_directory(from, error))
    return NotFound("the engine's model directory " + from + " is not a directory on this host");
  for (const fs::directory_entry& entry : fs::directory_iterator(from, error)) {
    if (!entry.is_regular_file() || IsWeightFile(entry.path())) continue;
    const fs::path target = fs::path(to) / entry.path().filename();
    fs::copy_file(entry.path(), target, fs::copy_options::overwrite_existing, error);
    if (error) {
      return Unavailable("copying " + entry.path().string() + " to " + target.string() + ": " +
                         error.message());
    }
  }
  if (error) return Unavailable("listing " + from + ": " + error.message());
  return Status::Ok();
}

// Whether the tensors of `model` are exactly those `layout` places (by name: offset and size),
// each a view of the file mapped at `file` at its place.
template <typename Layout>
bool ViewsOf(const sync::ServedModel& model, const MappedFile& file, const Layout& layout) {
  if (layout.size() != model.tensors().size()) return false;
  for (const auto& t : model.tensors()) {
    auto found = layout.find(t.spec.name);
    if (found == layout.end() || found->second.size != t.bytes.size() ||
        t.bytes.data() != file.bytes().data() + found->second.offset)
      return false;
  }
  return true;
}

}  // namespace

bool ServedCheckpoint::IsMappedHere(const sync::ServedModel& model) const {
  return mapping_ != nullptr && ViewsOf(model, *mapping_, placed_);
}

NewWeightsFile::~NewWeightsFile() {
  if (!in_place_) ::unlink(path_.c_str());
}

Result<sync::TensorStorage> NewWeightsFile::Storage(const sync::TensorSpec& spec) const {
  auto found = layout_.find(spec.name);
  if (found == layout_.end())
    return InvalidArgument("tensor " + spec.name + " is not one of the model's");
  const TensorPlace& place = found->second;
  if (place.dtype != spec.dtype || place.shape != spec.shape) {
    auto text = [](sync::DType dtype, const std::vector<uint64_t>& shape) {
      return std::string(sync::Info(dtype).safetensors_name) + " " + ShapeText(shape);
    };
    return InvalidArgument("tensor " + spec.name + " is " + text(spec.dtype, spec.shape) +
                           " here, " + text(place.dtype, place.shape) + " in the model");
  }
  return sync::TensorStorage::View(mapping_->writable_bytes().subspan(place.offset, place.size),
                                   shared_from_this());
}

bool NewWeightsFile::Holds(const sync::ServedModel& model) const {
  return ViewsOf(model, *mapping_, layout_);
}

Result<std::shared_ptr<NewWeightsFile>> ServedCheckpoint::NewFile(
    const std::vector<sync::TensorSpec>& specs) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error)
    return Unavailable("creating the served checkpoint directory " + dir_ + ": " + error.message());
  if (!flush_mapped_) {
    WEFT_ASSIGN_OR_RETURN(const bool network, OnNetworkFileSystem(dir_));
    flush_mapped_ = network;
  }
  const std::string path = (fs::path(dir_) / kServedWeightsFile).string();
  WEFT_ASSIGN_OR_RETURN(sync::SafetensorsLayout layout,
                        sync::PlanSafetensors(specs, ServedMetadata()));
  auto file = std::shared_ptr<NewWeightsFile>(new NewWeightsFile());
  for (size_t i = 0; i < specs.size(); ++i) {
    file->layout_[specs[i].name] = {layout.offsets[i], layout.sizes[i], specs[i].dtype,
                                    specs[i].shape};
  }
  WEFT_ASSIGN_OR_RETURN(file->path_, WriteTemporaryFile(path, [&](int fd) -> Status {
                          WEFT_RETURN_IF_ERROR(WriteAll(fd, layout.header, path));
                          return Allocate(fd, layout.header.size(),
                                          layout.file_bytes - layout.header.size(), path);
                        }));
  Result<MappedFile> mapped = MappedFile::OpenWritable(file->path_);
  if (!mapped.ok()) return mapped.status();  // (the file goes with `file`)
  file->mapping_ = std::make_shared<MappedFile>(std::move(mapped).value());
  pending_ = file;
  return file;
}

Status ServedCheckpoint::PutInPlace(NewWeightsFile& file, const sync::ServedModel& model,
                                    const std::string& template_dir) {
  valid_ = false;
  mapping_.reset();
  if (flush_mapped_.value_or(false)) WEFT_RETURN_IF_ERROR(file.mapping_->Flush());
  WEFT_RETURN_IF_ERROR(PrepareDirectory(template_dir, file.path_));
  const std::string path = (fs::path(dir_) / kServedWeightsFile).string();
  if (::rename(file.path_.c_str(), path.c_str()) != 0)
    return Unavailable("renaming " + file.path_ + " to " + path + ": " + std::strerror(errno));
  file.in_place_ = true;
  file.path_ = path;
  placed_.clear();
  for (const auto& t : model.tensors()) {
    placed_[t.spec.name] = {file.layout_.at(t.spec.name), t.digest};
  }
  mapping_ = file.mapping_;
  pending_.reset();
  valid_ = true;
  last_whole_ = true;
  last_tensors_ = placed_.size();
  last_bytes_ = mapping_->bytes().size();
  return Status::Ok();
}

Status ServedCheckpoint::Write(const sync::ServedModel& model, const std::string& template_dir) {
  if (std::shared_ptr<NewWeightsFile> pending = pending_.lock();
      pending != nullptr && pending->Holds(model)) {
    Status placed = PutInPlace(*pending, model, template_dir);
    if (!placed.ok()) valid_ = false;
    return placed;
  }
  if (IsMappedHere(model)) {
    if (flush_mapped_.value_or(false)) {
      Status flushed = mapping_->Flush();
      if (!flushed.ok()) {
        valid_ = false;
        return flushed;
      }
    }
    last_whole_ = false;
    last_tensors_ = last_bytes_ = 0;
    for (const auto& t : model.tensors()) {
      Placed& placed = placed_[t.spec.name];
      if (placed.digest == t.digest) continue;
      placed.digest = t.digest;
      ++last_tensors_;
    }
    valid_ = true;
    return Status::Ok();
  }
  bool same_layout = valid_ && placed_.size() == model.tensors().size();
  for (const auto& t : model.tensors()) {
    if (!same_layout) break;
    auto found = placed_.find(t.spec.name);
    same_layout = found != placed_.end() && found->second.size == t.bytes.size() &&
                  found->second.dtype == t.spec.dtype && found->second.shape == t.spec.shape;
  }
  Status written = same_layout ? WriteChanged(model) : WriteWhole(model, template_dir);
  if (!written.ok()) valid_ = false;
  return written;
}

Status ServedCheckpoint::PrepareDirectory(const std::string& template_dir,
                                          const std::string& keep) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error)
    return Unavailable("creating the served checkpoint directory " + dir_ + ": " + error.message());
  // Weight files of another layout (shards, an index) would be loaded too: only ours may stay. In
  // the engine's own model directory they are its model: refused, rather than deleted.
  std::vector<fs::path> others;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(std::string(".") + kServedWeightsFile + ".tmp-", 0) == 0) {
      if (entry.path() != fs::path(keep))
        fs::remove(entry.path(), error);  // a whole write a crash cut short
    } else if (entry.is_regular_file() && IsWeightFile(entry.path()) &&
               name != kServedWeightsFile) {
      others.push_back(entry.path());
    }
  }
  const std::string path = (fs::path(dir_) / kServedWeightsFile).string();
  if (!template_dir.empty() && fs::equivalent(template_dir, dir_, error)) {
    // The engine was started from this directory: fine when it holds only what a worker wrote
    // (an engine restarted after loads), refused when it holds the engine's own model.
    bool ours = others.empty();
    if (ours && fs::exists(path, error)) {
      Result<sync::SafetensorsFile> mine = sync::SafetensorsFile::Open(path);
      ours = mine.ok() && mine->metadata().count(kServedMarker) > 0;
    }
    if (!ours) {
      return InvalidArgument(
          "the served checkpoint directory " + dir_ +
          " is the engine's own model directory (its weights are not the worker's to replace): "
          "give the worker a directory of its own (engine.checkpoint_dir)");
    }
  }
  WEFT_RETURN_IF_ERROR(CopyModelFiles(template_dir, dir_));
  for (const fs::path& other : others) fs::remove(other, error);
  return Status::Ok();
}

Status ServedCheckpoint::WriteWhole(const sync::ServedModel& model,
                                    const std::string& template_dir) {
  valid_ = false;
  mapping_.reset();  // (views of the file replaced keep it alive as long as they need it)
  WEFT_RETURN_IF_ERROR(PrepareDirectory(template_dir, ""));
  const std::string path = (fs::path(dir_) / kServedWeightsFile).string();
  WEFT_RETURN_IF_ERROR(sync::WriteSafetensors(path, model.AsTensorsToWrite(), ServedMetadata()));
  WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile file, sync::SafetensorsFile::Open(path));
  placed_.clear();
  for (const sync::SafetensorsTensor& t : file.tensors()) {
    const sync::ServedModel::Tensor* served = model.Find(t.name);
    if (served == nullptr) return Internal(path + " holds tensor " + t.name + " it was not given");
    placed_[t.name] = {{file.data_start() + t.data_offset, t.data.size(), t.dtype, t.shape},
                       served->digest};
  }
  valid_ = true;
  last_whole_ = true;
  last_tensors_ = placed_.size();
  last_bytes_ = file.bytes().size();
  return Status::Ok();
}

Status ServedCheckpoint::WriteChanged(const sync::ServedModel& model) {
  const std::string path = (fs::path(dir_) / kServedWeightsFile).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Unavailable("opening " + path + ": " + std::strerror(errno));
  last_whole_ = false;
  last_tensors_ = last_bytes_ = 0;
  Status status = Status::Ok();
  for (const auto& t : model.tensors()) {
    Placed& placed = placed_[t.spec.name];
    if (placed.digest == t.digest) continue;
    // The file's bytes of this tensor are undefined until the write completes: mark the file
    // invalid first, so that a failure leads to a whole write next time.
    valid_ = false;
    size_t done = 0;
    while (done < t.bytes.size()) {
      const ssize_t n = ::pwrite(fd, t.bytes.data() + done, t.bytes.size() - done,
                                 static_cast<off_t>(placed.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = Unavailable("writing tensor " + t.spec.name + " into " + path + ": " +
                             (n < 0 ? std::strerror(errno) : "no progress"));
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (!status.ok()) break;
    placed.digest = t.digest;
    ++last_tensors_;
    last_bytes_ += t.bytes.size();
  }
  ::close(fd);
  if (status.ok()) valid_ = true;
  return status;
}

Status CheckModelDirectory(const std::string& dir, const sync::ServedModel& model) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return NotFound("the engine's model directory " + dir +
                    " is not readable from this host (the worker must share the engine's "
                    "filesystem: run it on the same node, or on a shared directory)");
  }
  struct Found {
    sync::DType dtype;
    std::vector<uint64_t> shape;
    std::string file;
  };
  std::map<std::string, Found> found;
  std::vector<std::string> differences;
  size_t files = 0;
  std::vector<fs::path> paths;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const fs::path& path : paths) {
    ++files;
    WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile file, sync::SafetensorsFile::Open(path.string()));
    for (const sync::SafetensorsTensor& t : file.tensors()) {
      if (!found.emplace(t.name, Found{t.dtype, t.shape, path.filename().string()}).second)
        differences.push_back("tensor " + t.name + " appears in two files");
    }
  }
  if (files == 0) return NotFound("the engine's model directory " + dir + " holds no .safetensors");
  for (const auto& t : model.tensors()) {
    auto it = found.find(t.spec.name);
    if (it == found.end()) {
      differences.push_back("tensor " + t.spec.name + " of the policy is missing");
      continue;
    }
    if (it->second.shape != t.spec.shape) {
      differences.push_back("tensor " + t.spec.name + ": shape " + ShapeText(it->second.shape) +
                            " in the engine's model, " + ShapeText(t.spec.shape) +
                            " in the policy");
    }
    if (it->second.dtype != t.spec.dtype) {
      differences.push_back(
          "tensor " + t.spec.name + ": dtype " +
          std::string(sync::Info(it->second.dtype).safetensors_name) + " in the engine's model, " +
          std::string(sync::Info(t.spec.dtype).safetensors_name) + " in the policy");
    }
    found.erase(it);
  }
  for (const auto& [name, f] : found)
    differences.push_back("tensor " + name + " (" + f.file + ") is not in the policy");
  if (differences.empty()) return Status::Ok();
  std::string text;
  for (size_t i = 0; i < differences.size() && i < 6; ++i) text += "; " + differences[i];
  if (differences.size() > 6)
    text += "; and " + std::to_string(differences.size() - 6) + " more differences";
  return InvalidArgument("the engine serves another model than the policy (" + dir +
                         "): " + text.substr(2));
}

}  // namespace weft::rollout_worker
