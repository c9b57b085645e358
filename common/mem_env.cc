#include "common/mem_env.h"

#include <algorithm>

namespace weft {

struct MemEnv::File {
  std::vector<uint8_t> data;
  uint64_t synced = 0;  // data[0, synced) survives a crash
  bool removed = false;
};

class MemWritableFile : public WritableFile {
 public:
  MemWritableFile(MemEnv& env, std::string path, std::shared_ptr<MemEnv::File> file)
      : env_(env), path_(std::move(path)), file_(std::move(file)) {}

  Status Append(std::span<const uint8_t> bytes) override {
    MutexLock lock(env_.mutex_);
    if (file_->removed) return Status::Ok();  // as into an unlinked file: nobody reads it again
    if (env_.UsedLocked() + bytes.size() > env_.capacity_)
      return Unavailable("cannot write " + path_ + ": No space left on device");
    file_->data.insert(file_->data.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }

  Status Sync() override {
    MutexLock lock(env_.mutex_);
    if (file_->removed) return Status::Ok();
    WEFT_RETURN_IF_ERROR(env_.TakeSync(path_));
    file_->synced = file_->data.size();
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    MutexLock lock(env_.mutex_);
    WEFT_RETURN_IF_ERROR(env_.TakeSync(path_));
    file_->data.resize(std::min<uint64_t>(size, file_->data.size()));
    file_->synced = file_->data.size();
    return Status::Ok();
  }

 private:
  MemEnv& env_;
  const std::string path_;
  const std::shared_ptr<MemEnv::File> file_;
};

MemEnv::MemEnv(int64_t wall_start_micros) : wall_(wall_start_micros) {}

Status MemEnv::TakeSync(const std::string& path) {
  if (failing_syncs_ > 0) {
    --failing_syncs_;
    return Unavailable("cannot sync " + path + ": Input/output error");
  }
  ++syncs_;
  return Status::Ok();
}

uint64_t MemEnv::UsedLocked() const {
  uint64_t used = 0;
  for (const auto& [path, file] : files_) used += file->data.size();
  return used;
}

Result<std::unique_ptr<WritableFile>> MemEnv::OpenWritable(const std::string& path, bool create) {
  MutexLock lock(mutex_);
  auto found = files_.find(path);
  if (!create) {
    if (found == files_.end()) return NotFound(path + " does not exist");
    return std::unique_ptr<WritableFile>(new MemWritableFile(*this, path, found->second));
  }
  WEFT_RETURN_IF_ERROR(TakeSync(path));
  if (found != files_.end()) found->second->removed = true;  // writers of the old one write nowhere
  auto file = std::make_shared<File>();
  files_[path] = file;
  return std::unique_ptr<WritableFile>(new MemWritableFile(*this, path, std::move(file)));
}

Result<std::vector<uint8_t>> MemEnv::ReadFile(const std::string& path) {
  MutexLock lock(mutex_);
  auto found = files_.find(path);
  if (found == files_.end()) return NotFound(path + " does not exist");
  return found->second->data;
}

bool MemEnv::Exists(const std::string& path) {
  MutexLock lock(mutex_);
  return files_.count(path) != 0;
}

std::vector<std::string> MemEnv::List(const std::string& dir) {
  MutexLock lock(mutex_);
  const std::string prefix = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::vector<std::string> names;
  for (const auto& [path, file] : files_) {
    if (path.size() <= prefix.size() || path.compare(0, prefix.size(), prefix) != 0) continue;
    std::string name = path.substr(prefix.size());
    name = name.substr(0, name.find('/'));
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return names;
}

Status MemEnv::Remove(const std::string& path) {
  MutexLock lock(mutex_);
  auto found = files_.find(path);
  if (found == files_.end()) return Status::Ok();
  WEFT_RETURN_IF_ERROR(TakeSync(path));
  found->second->removed = true;
  files_.erase(found);
  return Status::Ok();
}

Status MemEnv::WriteAtomic(const std::string& path,
                           std::span<const std::span<const uint8_t>> parts) {
  MutexLock lock(mutex_);
  auto file = std::make_shared<File>();
  for (std::span<const uint8_t> part : parts)
    file->data.insert(file->data.end(), part.begin(), part.end());
  auto found = files_.find(path);
  const uint64_t replaced = found == files_.end() ? 0 : found->second->data.size();
  if (UsedLocked() - replaced + file->data.size() > capacity_)
    return Unavailable("cannot write " + path + ": No space left on device");
  WEFT_RETURN_IF_ERROR(TakeSync(path));
  file->synced = file->data.size();
  if (found != files_.end()) found->second->removed = true;
  files_[path] = std::move(file);
  return Status::Ok();
}

int64_t MemEnv::WallMicros() {
  MutexLock lock(mutex_);
  return wall_;
}

int64_t MemEnv::MonotonicMicros() {
  MutexLock lock(mutex_);
  return monotonic_;
}

void MemEnv::SleepFor(std::chrono::microseconds duration) { Advance(duration); }

void MemEnv::Crash(uint64_t keep) {
  MutexLock lock(mutex_);
  for (auto& [path, file] : files_) {
    const uint64_t tail = file->data.size() - file->synced;
    file->data.resize(file->synced + std::min(keep, tail));
    // What survived is on disk now; a file handed out before the crash writes nowhere.
    file->removed = true;
    auto survivor = std::make_shared<File>();
    survivor->data = std::move(file->data);
    survivor->synced = survivor->data.size();
    file = std::move(survivor);
  }
}

std::unique_ptr<MemEnv> MemEnv::DiskAfterCrash(uint64_t keep) const {
  auto copy = std::make_unique<MemEnv>();
  MutexLock lock(mutex_);
  MutexLock copy_lock(copy->mutex_);
  copy->wall_ = wall_;
  copy->monotonic_ = monotonic_;
  for (const auto& [path, file] : files_) {
    auto survivor = std::make_shared<File>();
    const uint64_t kept = file->synced + std::min(keep, file->data.size() - file->synced);
    survivor->data.assign(file->data.begin(), file->data.begin() + static_cast<long>(kept));
    survivor->synced = kept;
    copy->files_[path] = std::move(survivor);
  }
  return copy;
}

void MemEnv::FailSyncs(int count) {
  MutexLock lock(mutex_);
  failing_syncs_ = count;
}

void MemEnv::SetCapacity(uint64_t bytes) {
  MutexLock lock(mutex_);
  capacity_ = bytes;
}

void MemEnv::Advance(std::chrono::microseconds duration) {
  MutexLock lock(mutex_);
  if (duration.count() > 0) {
    wall_ += duration.count();
    monotonic_ += duration.count();
  }
}

void MemEnv::JumpWall(std::chrono::microseconds duration) {
  MutexLock lock(mutex_);
  wall_ += duration.count();
}

uint64_t MemEnv::syncs() const {
  MutexLock lock(mutex_);
  return syncs_;
}

uint64_t MemEnv::used_bytes() const {
  MutexLock lock(mutex_);
  return UsedLocked();
}

}  // namespace weft
