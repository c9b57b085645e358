#include "common/mem_env.h"

#include <algorithm>

namespace weft {

struct MemEnv::File {
  std::vector<uint8_t> data;
  uint64_t synced = 0;  // data[0, synced) survives a crash
  bool removed = false;
  FileStamp stamp;  // all but its size
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
    env_.ChangedLocked(*file_);
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
    env_.ChangedLocked(*file_);
    return Status::Ok();
  }

 private:
  MemEnv& env_;
  const std::string path_;
  const std::shared_ptr<MemEnv::File> file_;
};

class MemReadableFile : public ReadableFile {
 public:
  MemReadableFile(MemEnv& env, std::shared_ptr<MemEnv::File> file)
      : env_(env), file_(std::move(file)) {}

  Result<uint64_t> Size() override {
    MutexLock lock(env_.mutex_);
    return file_->data.size();
  }

  Result<FileStamp> Stamp() override {
    MutexLock lock(env_.mutex_);
    FileStamp stamp = file_->stamp;
    stamp.size = file_->data.size();
    return stamp;
  }

  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    MutexLock lock(env_.mutex_);
    const std::vector<uint8_t>& data = file_->data;
    if (offset >= data.size()) return size_t{0};
    const size_t count = std::min<uint64_t>(out.size(), data.size() - offset);
    std::copy_n(data.begin() + static_cast<long>(offset), count, out.begin());
    return count;
  }

 private:
  MemEnv& env_;
  const std::shared_ptr<MemEnv::File> file_;
};

class MemFileLock : public FileLock {
 public:
  MemFileLock(MemEnv& env, std::string path, uint64_t holder)
      : env_(env), path_(std::move(path)), holder_(holder) {}
  ~MemFileLock() override {
    MutexLock lock(env_.mutex_);
    // (A crash released it already, and someone else may hold it now.)
    if (auto held = env_.locked_.find(path_); held != env_.locked_.end() && held->second == holder_)
      env_.locked_.erase(held);
    env_.unlocked_.notify_all();
  }

 private:
  MemEnv& env_;
  const std::string path_;
  const uint64_t holder_;
};

namespace {

// `path` without the '/'s it ends with (a directory named as "dir/").
std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Whether `path` lies under `dir_prefix` (a directory's path and a '/').
bool Under(const std::string& path, const std::string& dir_prefix) {
  return path.size() > dir_prefix.size() && path.compare(0, dir_prefix.size(), dir_prefix) == 0;
}

}  // namespace

MemEnv::MemEnv(int64_t wall_start_micros) : wall_(wall_start_micros) {}

Status MemEnv::TakeSync(const std::string& path) {
  if (failing_syncs_ > 0) {
    if (passing_syncs_ > 0) {
      --passing_syncs_;
    } else {
      --failing_syncs_;
      return Unavailable("cannot sync " + path + ": Input/output error");
    }
  }
  ++syncs_;
  return Status::Ok();
}

std::shared_ptr<MemEnv::File> MemEnv::NewFileLocked() {
  auto file = std::make_shared<File>();
  file->stamp.identity = ++next_identity_;
  ChangedLocked(*file);
  return file;
}

void MemEnv::ChangedLocked(File& file) {
  file.stamp.modified_micros = wall_;
  file.stamp.version = ++next_version_;
}

bool MemEnv::UnderFileLocked(const std::string& path) const {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    if (files_.count(path.substr(0, slash)) != 0) return true;
  }
  return false;
}

PathType MemEnv::TypeLocked(const std::string& path) const {
  if (UnderFileLocked(path)) return PathType::kNone;
  if (files_.count(path) != 0) return PathType::kFile;
  if (directories_.count(path) != 0) return PathType::kDirectory;
  const std::string prefix = path == "/" ? path : path + "/";
  if (auto file = files_.lower_bound(prefix); file != files_.end() && Under(file->first, prefix))
    return PathType::kDirectory;
  if (auto dir = directories_.lower_bound(prefix); dir != directories_.end() && Under(*dir, prefix))
    return PathType::kDirectory;
  return PathType::kNone;
}

Status MemEnv::CheckCreatableLocked(const std::string& path) const {
  if (UnderFileLocked(path)) return Unavailable("cannot create " + path + ": Not a directory");
  if (TypeLocked(path) == PathType::kDirectory)
    return Unavailable("cannot create " + path + ": Is a directory");
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
  WEFT_RETURN_IF_ERROR(CheckCreatableLocked(path));
  WEFT_RETURN_IF_ERROR(TakeSync(path));
  if (found != files_.end()) found->second->removed = true;  // writers of the old one write nowhere
  auto file = NewFileLocked();
  files_[path] = file;
  return std::unique_ptr<WritableFile>(new MemWritableFile(*this, path, std::move(file)));
}

Result<std::vector<uint8_t>> MemEnv::ReadFile(const std::string& path) {
  MutexLock lock(mutex_);
  auto found = files_.find(path);
  if (found == files_.end()) return NotFound(path + " does not exist");
  return found->second->data;
}

Result<std::vector<DirectoryEntry>> MemEnv::ListDirectory(const std::string& dir) {
  MutexLock lock(mutex_);
  if (fail_lookups_) return Unavailable("cannot list " + dir + ": Input/output error");
  const std::string path = WithoutTrailingSlashes(dir);
  if (TypeLocked(path) != PathType::kDirectory) return NotFound(dir + " is not a directory");
  const std::string prefix = path == "/" ? path : path + "/";
  std::map<std::string, PathType> found;
  // A name with more after it is a directory, whichever of the two maps holds it.
  auto add = [&](const std::string& under, PathType type) {
    const std::string rest = under.substr(prefix.size());
    const size_t slash = rest.find('/');
    found[rest.substr(0, slash)] = slash == std::string::npos ? type : PathType::kDirectory;
  };
  for (auto file = files_.lower_bound(prefix); file != files_.end() && Under(file->first, prefix);
       ++file)
    add(file->first, PathType::kFile);
  for (auto sub = directories_.lower_bound(prefix);
       sub != directories_.end() && Under(*sub, prefix); ++sub)
    add(*sub, PathType::kDirectory);
  std::vector<DirectoryEntry> entries;
  for (const auto& [name, type] : found) entries.push_back({name, type});
  return entries;
}

Status MemEnv::Remove(const std::string& path) {
  MutexLock lock(mutex_);
  if (TypeLocked(path) == PathType::kDirectory)
    return InvalidArgument("cannot remove " + path + ": it is a directory");
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
  auto file = NewFileLocked();
  for (std::span<const uint8_t> part : parts)
    file->data.insert(file->data.end(), part.begin(), part.end());
  WEFT_RETURN_IF_ERROR(CheckCreatableLocked(path));
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

Result<std::unique_ptr<ReadableFile>> MemEnv::OpenReadable(const std::string& path) {
  MutexLock lock(mutex_);
  const PathType type = TypeLocked(path);
  if (type == PathType::kNone) return NotFound(path + ": no such file");
  if (type != PathType::kFile) return InvalidArgument(path + ": not a regular file");
  return std::unique_ptr<ReadableFile>(new MemReadableFile(*this, files_.at(path)));
}

Result<std::unique_ptr<WritableFile>> MemEnv::CreateTemporary(const std::string& path) {
  MutexLock lock(mutex_);
  if (UnderFileLocked(path)) return Unavailable("cannot create " + path + ": Not a directory");
  if (TypeLocked(path) != PathType::kNone) return Conflict("cannot create " + path + ": it exists");
  auto file = NewFileLocked();
  files_[path] = file;
  return std::unique_ptr<WritableFile>(new MemWritableFile(*this, path, std::move(file)));
}

Status MemEnv::RenameIfAbsent(const std::string& from, const std::string& to) {
  MutexLock lock(mutex_);
  if (TypeLocked(from) != PathType::kFile)
    return NotFound("cannot move " + from + ": it does not exist");
  if (UnderFileLocked(to))
    return Unavailable("cannot move " + from + " to " + to + ": Not a directory");
  if (TypeLocked(to) != PathType::kNone)
    return Conflict("cannot move " + from + " to " + to + ": it exists");
  WEFT_RETURN_IF_ERROR(TakeSync(to));
  auto found = files_.find(from);
  found->second->stamp.version = ++next_version_;
  files_[to] = std::move(found->second);
  files_.erase(found);
  return Status::Ok();
}

Result<PathType> MemEnv::TypeOf(const std::string& path) {
  MutexLock lock(mutex_);
  if (fail_lookups_) return Unavailable("cannot stat " + path + ": Input/output error");
  return TypeLocked(WithoutTrailingSlashes(path));
}

Status MemEnv::CreateDirectories(const std::string& path) {
  MutexLock lock(mutex_);
  const std::string target = WithoutTrailingSlashes(path);
  std::vector<std::string> missing;
  for (size_t end = target.find('/', 1);; end = target.find('/', end + 1)) {
    const std::string prefix = target.substr(0, end);
    const PathType type = TypeLocked(prefix);
    if (type == PathType::kFile || UnderFileLocked(prefix))
      return Conflict("cannot create directory " + prefix + ": something else is there");
    if (type == PathType::kNone) missing.push_back(prefix);
    if (end == std::string::npos) break;
  }
  if (missing.empty()) return Status::Ok();
  WEFT_RETURN_IF_ERROR(TakeSync(target));
  directories_.insert(missing.begin(), missing.end());
  return Status::Ok();
}

Result<std::unique_ptr<FileLock>> MemEnv::LockFile(const std::string& path) {
  MutexLock lock(mutex_);
  WEFT_RETURN_IF_ERROR(CheckCreatableLocked(path));
  if (files_.count(path) == 0) files_[path] = NewFileLocked();
  unlocked_.wait(lock.native(), [&]() REQUIRES(mutex_) { return locked_.count(path) == 0; });
  const uint64_t holder = ++next_lock_;
  locked_[path] = holder;
  return std::unique_ptr<FileLock>(new MemFileLock(*this, path, holder));
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
    survivor->stamp = file->stamp;
    survivor->data = std::move(file->data);
    survivor->synced = survivor->data.size();
    file = std::move(survivor);
  }
  locked_.clear();  // the process that held them is gone
  unlocked_.notify_all();
}

std::unique_ptr<MemEnv> MemEnv::DiskAfterCrash(uint64_t keep) const {
  auto copy = std::make_unique<MemEnv>();
  MutexLock lock(mutex_);
  MutexLock copy_lock(copy->mutex_);
  copy->wall_ = wall_;
  copy->monotonic_ = monotonic_;
  copy->directories_ = directories_;
  copy->next_identity_ = next_identity_;
  copy->next_version_ = next_version_;
  for (const auto& [path, file] : files_) {
    auto survivor = std::make_shared<File>();
    survivor->stamp = file->stamp;
    const uint64_t kept = file->synced + std::min(keep, file->data.size() - file->synced);
    survivor->data.assign(file->data.begin(), file->data.begin() + static_cast<long>(kept));
    survivor->synced = kept;
    copy->files_[path] = std::move(survivor);
  }
  return copy;
}

void MemEnv::FailSyncs(int count, int after) {
  MutexLock lock(mutex_);
  failing_syncs_ = count;
  passing_syncs_ = after;
}

void MemEnv::FailLookups(bool on) {
  MutexLock lock(mutex_);
  fail_lookups_ = on;
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
