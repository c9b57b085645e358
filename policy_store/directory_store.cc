#include "policy_store/directory_store.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

#include "common/byte_io.h"
#include "common/mutex.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

// A compare-and-swap names the values it compares in its messages: in full when short and
// printable, otherwise by size and SHA-256, so that a conflict never echoes a large object.
constexpr uint64_t kShownValueBytes = 256;

// Objects are compared and hashed this much at a time.
constexpr uint64_t kPieceBytes = uint64_t{1} << 20;

// No key is longer (ValidateKey): List goes no deeper, which also ends a loop of symbolic links.
constexpr size_t kMaxKeyBytes = 512;

// Every compare-and-swap of a directory store in this process moves this generation on and wakes
// the watchers (WaitForChange), whatever Env holds the files.
struct SwapSignal {
  Mutex mutex;
  std::condition_variable changed;
  uint64_t generation GUARDED_BY(mutex) = 0;
};
SwapSignal& Swaps() {
  static SwapSignal* signal = new SwapSignal;
  return *signal;
}

// Changes to the files of one directory of the machine, seen through inotify (writers in other
// processes: a trainer publishing into the directory a store server serves). Invalid when inotify
// cannot watch it (the directory does not exist yet, no watches left).
class DirectoryEvents {
 public:
  explicit DirectoryEvents(const std::string& directory)
      : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_ >= 0 &&
        inotify_add_watch(fd_, directory.c_str(),
                          IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MODIFY) < 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~DirectoryEvents() {
    if (fd_ >= 0) close(fd_);
  }
  DirectoryEvents(const DirectoryEvents&) = delete;
  DirectoryEvents& operator=(const DirectoryEvents&) = delete;
  bool valid() const { return fd_ >= 0; }
  // Waits up to `wait` for an event, and drains those that came.
  void Wait(std::chrono::milliseconds wait) {
    pollfd watched{fd_, POLLIN, 0};
    if (poll(&watched, 1, static_cast<int>(wait.count())) <= 0) return;
    alignas(inotify_event) char buffer[4096];
    while (read(fd_, buffer, sizeof buffer) > 0) {
    }
  }

 private:
  int fd_;
};

std::string ShownValue(std::string_view value) {
  const bool printable = std::all_of(value.begin(), value.end(),
                                     [](char c) { return (c >= 0x20 && c < 0x7f) || c == '\n'; });
  if (value.size() <= kShownValueBytes && printable) return "'" + std::string(value) + "'";
  return std::to_string(value.size()) + " bytes with SHA-256 " + Sha256Hex(TextBytes(value));
}

// `message` with the paths under `root` named by their keys instead.
std::string HiddenText(const std::string& root, std::string message) {
  const std::string prefix = root + "/";
  for (size_t at = message.find(prefix); at != std::string::npos; at = message.find(prefix, at))
    message.erase(at, prefix.size());
  for (size_t at = message.find(root); at != std::string::npos; at = message.find(root, at))
    message.replace(at, root.size(), "the store");
  return message;
}

// `status` as an error about `key`: its message names the key first, and files by their keys.
Status Hidden(const std::string& root, const std::string& key, const Status& status) {
  std::string message = HiddenText(root, status.message());
  if (message.rfind(key + ": ", 0) != 0) message = key + ": " + message;
  return Status(status.code(), std::move(message));
}

// Up to out.size() bytes of `file` from `first` into `out`, fewer only where the file ends first:
// how many.
Result<uint64_t> ReadUpTo(ReadableFile& file, uint64_t first, std::span<uint8_t> out) {
  uint64_t done = 0;
  while (done < out.size()) {
    WEFT_ASSIGN_OR_RETURN(size_t got, file.ReadAt(first + done, out.subspan(done)));
    if (got == 0) break;  // it ended sooner (it shrank meanwhile)
    done += got;
  }
  return done;
}

// The object `reader` reads, named as ShownValue names it: from `read` when it was read whole,
// else hashed a piece at a time.
Result<std::string> DescribeValue(ObjectReader& reader, const std::optional<std::string>& read) {
  if (read) return ShownValue(*read);
  Sha256 hash;
  std::vector<uint8_t> buffer(std::min<uint64_t>(reader.size(), kPieceBytes));
  for (uint64_t at = 0; at < reader.size();) {
    WEFT_ASSIGN_OR_RETURN(size_t got, reader.ReadAt(at, buffer));
    hash.Update(std::span<const uint8_t>(buffer).first(got));
    at += got;
  }
  return std::to_string(reader.size()) + " bytes with SHA-256 " + hash.HexDigest();
}

// Whether files `a` and `b` hold the same bytes, compared a piece at a time.
Result<bool> SameBytes(Env& env, const std::string& a, const std::string& b) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> first, env.OpenReadable(a));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> second, env.OpenReadable(b));
  WEFT_ASSIGN_OR_RETURN(uint64_t size, first->Size());
  WEFT_ASSIGN_OR_RETURN(uint64_t other_size, second->Size());
  if (size != other_size) return false;
  std::vector<uint8_t> mine(std::min(size, kPieceBytes)), theirs(mine.size());
  for (uint64_t at = 0; at < size;) {
    const uint64_t want = std::min<uint64_t>(mine.size(), size - at);
    WEFT_ASSIGN_OR_RETURN(uint64_t got, ReadUpTo(*first, at, std::span(mine).first(want)));
    WEFT_ASSIGN_OR_RETURN(uint64_t other_got, ReadUpTo(*second, at, std::span(theirs).first(want)));
    if (got != want || other_got != want) return false;  // one shrank meanwhile
    if (!std::equal(mine.begin(), mine.begin() + static_cast<long>(want), theirs.begin()))
      return false;
    at += want;
  }
  return true;
}

// A new temporary file beside `path`, named so that List skips it: the file, its name in `temp`.
Result<std::unique_ptr<WritableFile>> CreateTemporaryBeside(Env& env, const std::string& path,
                                                            std::string* temp) {
  const std::filesystem::path target(path);
  return CreateTemporaryNamed(
      env, (target.parent_path() / ("." + target.filename().string() + ".tmp-")).string(), temp);
}

// Moves the synced temporary file `temp` into place as the immutable object `key` at `path`, or
// removes it: true when it created the object, false when the key already held the same bytes,
// kConflict when it holds others (or is a directory: a prefix of other keys).
Result<bool> Publish(Env& env, const std::string& root, const std::string& key,
                     const std::string& path, const std::string& temp) {
  const Status moved = env.RenameIfAbsent(temp, path);
  if (moved.ok()) return true;
  Result<bool> same = false;
  if (moved.code() == StatusCode::kConflict) same = SameBytes(env, temp, path);
  (void)env.Remove(temp);  // (A temporary file left by a failure here is never listed.)
  if (moved.code() != StatusCode::kConflict) return Hidden(root, key, moved);
  if (!same.ok()) {
    // The object there is no file, or could not be read to compare.
    if (same.status().code() == StatusCode::kInvalidArgument)
      return Conflict(key + " is a prefix of other keys, not an object");
    return Hidden(root, key, same.status());
  }
  if (*same) return false;  // the same immutable object, written again
  return Conflict(key + " already exists with different content");
}

// A temporary file beside an object, written a piece at a time, synced and moved into place at
// Commit.
class DirectoryWriter : public ObjectWriter {
 public:
  DirectoryWriter(Env& env, std::string root, std::string key, std::string path, std::string temp,
                  std::unique_ptr<WritableFile> file)
      : env_(env),
        root_(std::move(root)),
        key_(std::move(key)),
        path_(std::move(path)),
        temp_(std::move(temp)),
        file_(std::move(file)) {}
  ~DirectoryWriter() override {
    file_.reset();
    if (!temp_.empty()) (void)env_.Remove(temp_);
  }

  Status Write(std::span<const uint8_t> bytes) override {
    if (!file_) return Internal(key_ + ": written after it was committed");
    const Status written = file_->Append(bytes);
    if (!written.ok()) return Hidden(root_, key_, written);
    return Status::Ok();
  }

  Result<bool> Commit() override {
    if (!file_) return Internal(key_ + ": committed twice");
    // Synced before it is moved: the move must never make visible bytes a crash could tear.
    const Status synced = file_->Sync();
    file_.reset();
    if (!synced.ok()) return Hidden(root_, key_, synced);
    Result<bool> created = Publish(env_, root_, key_, path_, temp_);
    temp_.clear();  // moved into place, or removed
    return created;
  }

 private:
  Env& env_;
  std::string root_;
  std::string key_;
  std::string path_;
  std::string temp_;
  std::unique_ptr<WritableFile> file_;
};

}  // namespace

Result<std::unique_ptr<DirectoryStore>> DirectoryStore::Open(const std::string& root, bool create,
                                                             Env* env) {
  Env& files = env ? *env : Env::Default();
  std::error_code error;
  std::string normal = std::filesystem::absolute(root, error).lexically_normal().string();
  if (error) return InvalidArgument(root + ": cannot make it absolute: " + error.message());
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (create) {
    const Status made = files.CreateDirectories(normal);
    if (!made.ok())
      return InvalidArgument(root + ": cannot create the store directory: " + made.message());
  }
  WEFT_ASSIGN_OR_RETURN(PathType type, files.TypeOf(normal));
  if (type == PathType::kNone)
    return NotFound("no store at " + root + ": the directory does not exist");
  if (type != PathType::kDirectory) return InvalidArgument(root + ": not a directory");
  return std::unique_ptr<DirectoryStore>(new DirectoryStore(files, std::move(normal)));
}

Result<DirectoryStore::OpenedObject> DirectoryStore::OpenFile(const std::string& key) const {
  Result<std::unique_ptr<ReadableFile>> file = env_.OpenReadable(PathOf(key));
  if (!file.ok()) {
    // Missing, a directory (a prefix of other keys), or under a file: no such object.
    if (file.status().code() == StatusCode::kNotFound ||
        file.status().code() == StatusCode::kInvalidArgument)
      return NotFound(key + ": no such object");
    return Hidden(root_, key, file.status());
  }
  Result<uint64_t> size = (*file)->Size();
  if (!size.ok()) return Hidden(root_, key, size.status());
  return OpenedObject{std::move(file).value(), *size};
}

std::unique_ptr<ObjectReader> DirectoryStore::ObjectFileReader(std::unique_ptr<ReadableFile> file,
                                                               uint64_t size,
                                                               const std::string& key) const {
  return FileReader(std::move(file), size, key, [root = root_, key](const Status& status) {
    return Hidden(root, key, status);
  });
}

Result<std::unique_ptr<ObjectReader>> DirectoryStore::OpenRead(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(OpenedObject object, OpenFile(key));
  return ObjectFileReader(std::move(object.file), object.size, key);
}

Result<uint64_t> DirectoryStore::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                        BodyTarget& target) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(OpenedObject object, OpenFile(key));
  const uint64_t size = object.size;
  const std::unique_ptr<ObjectReader> file = ObjectFileReader(std::move(object.file), size, key);
  ObjectReader& reader = *file;
  WEFT_RETURN_IF_ERROR(target.ObjectSize(size));
  const uint64_t end = size - std::min(size, first) < length ? size : first + length;
  std::vector<uint8_t> buffer(std::min<uint64_t>(end > first ? end - first : 0, kPieceBytes));
  for (uint64_t at = first; at < end;) {
    const std::span<uint8_t> piece =
        std::span<uint8_t>(buffer).first(std::min<uint64_t>(buffer.size(), end - at));
    WEFT_ASSIGN_OR_RETURN(size_t read, reader.ReadAt(at, piece));
    WEFT_RETURN_IF_ERROR(target.Write(piece.first(read)));
    at += read;
  }
  return size;
}

Status DirectoryStore::EnsureParent(const std::string& key) const {
  const Status made =
      env_.CreateDirectories(std::filesystem::path(PathOf(key)).parent_path().string());
  if (made.code() == StatusCode::kConflict) return Conflict(key + ": a prefix of it is an object");
  if (!made.ok()) return Hidden(root_, key, made);
  return Status::Ok();
}

Result<std::vector<uint8_t>> DirectoryStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(OpenedObject object, OpenFile(key));
  std::vector<uint8_t> bytes(object.size);
  Result<uint64_t> read = ReadUpTo(*object.file, 0, bytes);
  if (!read.ok()) return Hidden(root_, key, read.status());
  bytes.resize(*read);
  return bytes;
}

Result<ObjectRange> DirectoryStore::GetRange(const std::string& key, uint64_t first,
                                             uint64_t length) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(OpenedObject object, OpenFile(key));
  ObjectRange range;
  range.object_size = object.size;
  range.bytes.resize(first >= object.size ? 0 : std::min(length, object.size - first));
  Result<uint64_t> read = ReadUpTo(*object.file, first, range.bytes);
  if (!read.ok()) return Hidden(root_, key, read.status());
  range.bytes.resize(*read);
  return range;
}

Result<RangeRead> DirectoryStore::GetRangeInto(const std::string& key, uint64_t first,
                                               std::span<uint8_t> out) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (out.empty()) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(OpenedObject object, OpenFile(key));
  const uint64_t count = first >= object.size ? 0 : std::min(out.size(), object.size - first);
  Result<uint64_t> read = ReadUpTo(*object.file, first, out.first(count));
  if (!read.ok()) return Hidden(root_, key, read.status());
  return RangeRead{*read, object.size};
}

Result<bool> DirectoryStore::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  Result<PathType> type = env_.TypeOf(PathOf(key));
  if (!type.ok()) return Hidden(root_, key, type.status());
  return *type == PathType::kFile;
}

Result<std::vector<std::string>> DirectoryStore::List(const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("list prefix must end in '/'");
  WEFT_RETURN_IF_ERROR(ValidateKey(prefix.substr(0, prefix.size() - 1)));
  std::vector<std::string> keys;
  // Directory `dir` holds the keys under `under` (a key prefix ending in '/').
  std::function<Status(const std::string&, const std::string&)> walk =
      [&](const std::string& dir, const std::string& under) -> Status {
    Result<std::vector<DirectoryEntry>> entries = env_.ListDirectory(dir);
    if (!entries.ok()) {
      if (entries.status().code() == StatusCode::kNotFound) return Status::Ok();  // not one
      return entries.status();
    }
    for (const DirectoryEntry& entry : *entries) {
      // The store's own files (temporaries of writes in progress) and whatever lies under them.
      if (entry.name.front() == '.') continue;
      const std::string key = under + entry.name;
      if (entry.type == PathType::kFile) keys.push_back(key);
      if (entry.type == PathType::kDirectory && key.size() < kMaxKeyBytes)
        WEFT_RETURN_IF_ERROR(walk(dir + "/" + entry.name, key + "/"));
    }
    return Status::Ok();
  };
  const Status walked = walk(PathOf(prefix.substr(0, prefix.size() - 1)), prefix);
  if (!walked.ok())
    return Unavailable(prefix + ": cannot list: " + HiddenText(root_, walked.message()));
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status DirectoryStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  std::string temp;
  Result<std::unique_ptr<WritableFile>> file = CreateTemporaryBeside(env_, path, &temp);
  if (!file.ok()) return Hidden(root_, key, file.status());
  // Synced before it is moved: the move must never make visible bytes a crash could tear.
  Status written = (*file)->Append(bytes);
  if (written.ok()) written = (*file)->Sync();
  file->reset();
  if (!written.ok()) {
    (void)env_.Remove(temp);
    return Hidden(root_, key, written);
  }
  return Publish(env_, root_, key, path, temp).status();
}

Result<std::unique_ptr<ObjectWriter>> DirectoryStore::NewImmutableWriter(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  std::string temp;
  Result<std::unique_ptr<WritableFile>> file = CreateTemporaryBeside(env_, path, &temp);
  if (!file.ok()) return Hidden(root_, key, file.status());
  return std::unique_ptr<ObjectWriter>(
      new DirectoryWriter(env_, root_, key, path, std::move(temp), std::move(file).value()));
}

Status DirectoryStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                      const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  Result<std::unique_ptr<FileLock>> lock = env_.LockFile(root_ + "/.lock");
  if (!lock.ok()) return Hidden(root_, key, lock.status());
  Result<PathType> type = env_.TypeOf(path);
  if (!type.ok()) return Hidden(root_, key, type.status());
  if (*type != PathType::kNone && *type != PathType::kFile)
    return Conflict(key + " is a prefix of other keys, not an object");
  // What the key holds, read only as far as `expected` could match it: an object larger than that
  // (whatever was put there) is named by its size and hash, never read into memory whole.
  std::optional<std::string> actual;
  std::string found = "absent";
  Result<OpenedObject> current = OpenFile(key);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound) return current.status();
  if (current.ok()) {
    const uint64_t size = current->size;
    const std::unique_ptr<ObjectReader> file =
        ObjectFileReader(std::move(current->file), size, key);
    ObjectReader& reader = *file;
    const uint64_t limit = expected ? expected->size() : 0;
    if (size <= std::max<uint64_t>(limit, kShownValueBytes)) {
      std::string bytes(size, '\0');
      for (uint64_t at = 0; at < bytes.size();) {
        WEFT_ASSIGN_OR_RETURN(
            size_t got,
            reader.ReadAt(at, {reinterpret_cast<uint8_t*>(bytes.data()) + at, bytes.size() - at}));
        at += got;
      }
      actual = std::move(bytes);
    }
    WEFT_ASSIGN_OR_RETURN(found, DescribeValue(reader, actual));
  }
  if (actual != expected) {
    return Conflict(key + " changed concurrently (expected " +
                    (expected ? ShownValue(*expected) : "absent") + ", found " + found + ")");
  }
  const std::span<const uint8_t> parts[] = {TextBytes(desired)};
  const Status written = env_.WriteAtomic(path, parts);
  if (!written.ok()) return Hidden(root_, key, written);
  SwapSignal& swaps = Swaps();
  {
    MutexLock signal(swaps.mutex);
    ++swaps.generation;
  }
  swaps.changed.notify_all();
  return Status::Ok();
}

Result<ObjectWatch> DirectoryStore::WaitForChange(const std::string& key,
                                                  const std::optional<std::string>& known,
                                                  std::chrono::milliseconds wait,
                                                  const std::atomic<bool>* cancel) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + wait;
  // Writers in other processes are seen through inotify where the files are the machine's; the
  // swaps of this process through their signal. Either way the object is read again at least every
  // kRecheck, so that an event missed (a directory created meanwhile) costs that much at most.
  constexpr std::chrono::milliseconds kRecheck(100);
  std::optional<DirectoryEvents> events;
  if (&env_ == &Env::Default()) {
    const std::string path = PathOf(key);
    events.emplace(path.substr(0, path.rfind('/')));
  }
  SwapSignal& swaps = Swaps();
  while (true) {
    uint64_t generation;
    {
      MutexLock signal(swaps.mutex);
      generation = swaps.generation;
    }
    WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, ReadWatched(*this, key));
    if (value != known) return ObjectWatch{std::move(value), true};
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return ObjectWatch{std::move(value), true};
    if (cancel != nullptr && cancel->load()) return Unavailable(key + ": watch cancelled");
    const auto nap = std::min<std::chrono::milliseconds>(
        kRecheck, std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    if (events && events->valid()) {
      events->Wait(nap);
    } else {
      MutexLock signal(swaps.mutex);
      swaps.changed.wait_for(signal.native(), nap, [&]() REQUIRES(swaps.mutex) {
        return swaps.generation != generation;
      });
    }
  }
}

Status DirectoryStore::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const Status removed = env_.Remove(PathOf(key));
  // Missing, under a file, or a directory (a prefix of other keys): no such object to delete.
  if (removed.ok() || removed.code() == StatusCode::kInvalidArgument) return Status::Ok();
  return Hidden(root_, key, removed);
}

}  // namespace weft::policy_store
