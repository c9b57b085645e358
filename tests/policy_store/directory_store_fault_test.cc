// The directory store on a disk that fails: an in-memory Env (common/mem_env.h) crashed before
// every change a write makes, with every byte of what was not synced torn off or kept; failing its
// syncs; full. An object is absent or whole, never partial, and the store goes on afterwards.
#include "policy_store/directory_store.h"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/mem_env.h"
#include "common/mutex.h"
#include "tests/policy_store/store_contract.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

// A MemEnv seen through a count of the changes made to it. Before change number `crash_at`, the
// disk a crash would leave then (`keep` bytes kept of each file's unsynced tail) is set aside, and
// from then on every change fails, as for a process that has died. Counts the bytes read too.
class CrashPointEnv : public Env {
 public:
  explicit CrashPointEnv(MemEnv& live) : live_(live) {}

  void CrashAt(uint64_t change, uint64_t keep) {
    MutexLock lock(mutex_);
    changes_ = 0;
    crash_at_ = change;
    keep_ = keep;
  }
  // The disk set aside at the crash; null when the crash point was never reached.
  std::unique_ptr<MemEnv> TakeDisk() {
    MutexLock lock(mutex_);
    return std::move(disk_);
  }
  uint64_t bytes_read() const {
    MutexLock lock(mutex_);
    return bytes_read_;
  }

  // Every change asks first.
  Status Change() {
    MutexLock lock(mutex_);
    if (!disk_ && changes_++ == crash_at_) disk_ = live_.DiskAfterCrash(keep_);
    if (disk_) return Unavailable("the process crashed");
    return Status::Ok();
  }
  void Read(uint64_t bytes) {
    MutexLock lock(mutex_);
    bytes_read_ += bytes;
  }

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     bool create) override {
    WEFT_RETURN_IF_ERROR(Change());
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, live_.OpenWritable(path, create));
    return Wrap(std::move(file));
  }
  Result<std::vector<uint8_t>> ReadFile(const std::string& path) override {
    return live_.ReadFile(path);
  }
  Status Remove(const std::string& path) override {
    WEFT_RETURN_IF_ERROR(Change());
    return live_.Remove(path);
  }
  Status WriteAtomic(const std::string& path,
                     std::span<const std::span<const uint8_t>> parts) override {
    WEFT_RETURN_IF_ERROR(Change());
    return live_.WriteAtomic(path, parts);
  }
  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, live_.OpenReadable(path));
    return std::unique_ptr<ReadableFile>(new CountedReader(*this, std::move(file)));
  }
  Result<std::unique_ptr<WritableFile>> CreateTemporary(const std::string& path) override {
    WEFT_RETURN_IF_ERROR(Change());
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, live_.CreateTemporary(path));
    return Wrap(std::move(file));
  }
  Status RenameIfAbsent(const std::string& from, const std::string& to) override {
    WEFT_RETURN_IF_ERROR(Change());
    return live_.RenameIfAbsent(from, to);
  }
  Result<PathType> TypeOf(const std::string& path) override { return live_.TypeOf(path); }
  Status CreateDirectories(const std::string& path) override {
    WEFT_RETURN_IF_ERROR(Change());
    return live_.CreateDirectories(path);
  }
  Result<std::vector<DirectoryEntry>> ListDirectory(const std::string& dir) override {
    return live_.ListDirectory(dir);
  }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    return live_.LockFile(path);
  }
  int64_t WallMicros() override { return live_.WallMicros(); }
  int64_t MonotonicMicros() override { return live_.MonotonicMicros(); }
  void SleepFor(std::chrono::microseconds duration) override { live_.SleepFor(duration); }

 private:
  class CountedWriter : public WritableFile {
   public:
    CountedWriter(CrashPointEnv& env, std::unique_ptr<WritableFile> file)
        : env_(env), file_(std::move(file)) {}
    Status Append(std::span<const uint8_t> bytes) override {
      WEFT_RETURN_IF_ERROR(env_.Change());
      return file_->Append(bytes);
    }
    Status Sync() override {
      WEFT_RETURN_IF_ERROR(env_.Change());
      return file_->Sync();
    }
    Status Truncate(uint64_t size) override {
      WEFT_RETURN_IF_ERROR(env_.Change());
      return file_->Truncate(size);
    }

   private:
    CrashPointEnv& env_;
    std::unique_ptr<WritableFile> file_;
  };

  class CountedReader : public ReadableFile {
   public:
    CountedReader(CrashPointEnv& env, std::unique_ptr<ReadableFile> file)
        : env_(env), file_(std::move(file)) {}
    Result<uint64_t> Size() override { return file_->Size(); }
    Result<FileStamp> Stamp() override { return file_->Stamp(); }
    Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
      WEFT_ASSIGN_OR_RETURN(size_t got, file_->ReadAt(offset, out));
      env_.Read(got);
      return got;
    }

   private:
    CrashPointEnv& env_;
    std::unique_ptr<ReadableFile> file_;
  };

  std::unique_ptr<WritableFile> Wrap(std::unique_ptr<WritableFile> file) {
    return std::unique_ptr<WritableFile>(new CountedWriter(*this, std::move(file)));
  }

  MemEnv& live_;
  mutable Mutex mutex_;
  uint64_t changes_ GUARDED_BY(mutex_) = 0;
  uint64_t crash_at_ GUARDED_BY(mutex_) = UINT64_MAX;
  uint64_t keep_ GUARDED_BY(mutex_) = 0;
  std::unique_ptr<MemEnv> disk_ GUARDED_BY(mutex_);
  uint64_t bytes_read_ GUARDED_BY(mutex_) = 0;
};

std::string Text(const Result<std::vector<uint8_t>>& bytes) {
  REQUIRE_MESSAGE(bytes.ok(), bytes.status().ToString());
  return std::string(bytes->begin(), bytes->end());
}

std::unique_ptr<DirectoryStore> OpenOn(Env& env, bool create = true) {
  auto store = DirectoryStore::Open("/store", create, &env);
  REQUIRE_MESSAGE(store.ok(), store.status().ToString());
  return std::move(store).value();
}

// The names under the store's directory `dir` on `env` that are temporary files (none when the
// directory does not exist).
std::vector<std::string> Temporaries(Env& env, const std::string& dir) {
  std::vector<std::string> found;
  Result<std::vector<std::string>> names = env.List("/store/" + dir);
  if (!names.ok()) {
    REQUIRE(names.status().code() == StatusCode::kNotFound);
    return found;
  }
  for (const std::string& name : *names)
    if (name.find(".tmp-") != std::string::npos) found.push_back(name);
  return found;
}

// The three ways a key is written, each of them a new object or, for the compare-and-swap, a new
// value of one that holds kOld.
const std::string kOld = "the value before";
const std::string kObject = "the bytes of an object, sixty-four of them in all, or nearly so!";

struct Writing {
  std::string name;
  std::string key;
  std::function<Status(ObjectStore&)> write;
  bool replaces;  // the key held kOld before
};

std::vector<Writing> Writings() {
  return {
      {"PutImmutable", "blobs/a/object",
       [](ObjectStore& store) { return store.PutImmutable("blobs/a/object", TextBytes(kObject)); },
       false},
      {"NewImmutableWriter", "blobs/b/object",
       [](ObjectStore& store) -> Status {
         WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                               store.NewImmutableWriter("blobs/b/object"));
         for (size_t at = 0; at < kObject.size(); at += 20)
           WEFT_RETURN_IF_ERROR(writer->Write(TextBytes(kObject.substr(at, 20))));
         return writer->Commit().status();
       },
       false},
      {"CompareAndSwap", "runs/r/latest",
       [](ObjectStore& store) { return store.CompareAndSwap("runs/r/latest", kOld, kObject); },
       true},
  };
}

TEST_CASE(
    "directory store on a crashing disk: a write crashed before any of its changes, with any "
    "bytes of what it had not synced kept, leaves the object absent or whole") {
  for (const Writing& writing : Writings()) {
    CAPTURE(writing.name);
    uint64_t crash_points = 0;
    for (uint64_t crash_at = 0;; ++crash_at) {
      bool finished = false;
      for (uint64_t keep = 0; keep <= kObject.size() + 1; ++keep) {
        CAPTURE(crash_at);
        CAPTURE(keep);
        MemEnv live;
        REQUIRE(OpenOn(live)->CompareAndSwap("runs/r/latest", std::nullopt, kOld).ok());
        CrashPointEnv env(live);
        auto store = OpenOn(env);
        env.CrashAt(crash_at, keep);
        const Status written = writing.write(*store);
        std::unique_ptr<MemEnv> disk = env.TakeDisk();
        if (!disk) {
          // The crash point lies past the write's last change: it finished, and said so.
          REQUIRE_MESSAGE(written.ok(), written.ToString());
          finished = true;
          disk = live.DiskAfterCrash(keep);
        } else {
          CHECK(!written.ok());
        }
        store.reset();
        auto reopened = OpenOn(*disk, false);
        Result<std::vector<uint8_t>> found = reopened->Get(writing.key);
        if (writing.replaces) {
          const std::string value = Text(found);
          CHECK_MESSAGE((value == kOld || value == kObject), value);
          if (finished) CHECK(value == kObject);
        } else if (found.ok() || finished) {
          CHECK(Text(found) == kObject);  // never a part of it
        } else {
          CHECK(found.status().code() == StatusCode::kNotFound);
        }
        // Whatever a crash left behind is the store's own: never listed, never in the way.
        const std::string dir = writing.key.substr(0, writing.key.rfind('/') + 1);
        const std::vector<std::string> listed = std::move(reopened->List(dir)).value();
        for (const std::string& key : listed) CHECK(key.find(".tmp-") == key.npos);
        if (writing.replaces) {
          const std::string now = Text(reopened->Get(writing.key));
          REQUIRE(reopened->CompareAndSwap(writing.key, now, "after").ok());
          CHECK(Text(reopened->Get(writing.key)) == "after");
        } else {
          REQUIRE(reopened->PutImmutable(writing.key, TextBytes(kObject)).ok());
          CHECK(Text(reopened->Get(writing.key)) == kObject);
        }
        REQUIRE(reopened->PutImmutable(dir + "another", TextBytes("more")).ok());
        CHECK(Text(reopened->Get(dir + "another")) == "more");
      }
      if (finished) {
        crash_points = crash_at;
        break;
      }
    }
    // Each write made a few changes (directories, a file, its bytes, its sync, its move) to crash
    // between.
    CHECK(crash_points >= (writing.replaces ? 1u : 4u));
  }
}

// A write the disk refused: unavailable, its error naming the key first and `reason`, never the
// directory; the object as it was before (the old value, or none).
void CheckRefused(DirectoryStore& store, const Writing& writing, const Status& written,
                  const std::string& reason) {
  CHECK(written.code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(written.message().rfind(writing.key + ": ", 0) == 0, written.message());
  CHECK_MESSAGE(written.message().find(reason) != std::string::npos, written.message());
  CHECK(written.message().find("/store") == std::string::npos);
  if (writing.replaces) {
    CHECK(Text(store.Get(writing.key)) == kOld);
  } else {
    CHECK(store.Get(writing.key).status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE(
    "directory store with failing syncs: the write fails naming the key, and nothing of it is "
    "visible or left behind") {
  for (const Writing& writing : Writings()) {
    CAPTURE(writing.name);
    // The syncs the write makes when none fails: each of them is made to fail in turn.
    int syncs = 0;
    {
      MemEnv env;
      auto store = OpenOn(env);
      REQUIRE(store->CompareAndSwap("runs/r/latest", std::nullopt, kOld).ok());
      const uint64_t before = env.syncs();
      REQUIRE(writing.write(*store).ok());
      syncs = static_cast<int>(env.syncs() - before);
    }
    CHECK(syncs >= (writing.replaces ? 1 : 3));  // directories, the file, its move
    for (int after = 0; after < syncs; ++after) {
      CAPTURE(after);
      MemEnv env;
      auto store = OpenOn(env);
      REQUIRE(store->CompareAndSwap("runs/r/latest", std::nullopt, kOld).ok());
      env.FailSyncs(1, after);
      CheckRefused(*store, writing, writing.write(*store), "Input/output error");
      const std::string dir = writing.key.substr(0, writing.key.rfind('/'));
      CHECK(Temporaries(env, dir).empty());
      // The disk works again: so does the store.
      REQUIRE(writing.write(*store).ok());
      CHECK(Text(store->Get(writing.key)) == kObject);
    }
  }
}

TEST_CASE(
    "directory store on a full disk: the write fails naming the key and the disk, leaves "
    "nothing, and succeeds once there is room") {
  for (const Writing& writing : Writings()) {
    CAPTURE(writing.name);
    MemEnv env;
    auto store = OpenOn(env);
    REQUIRE(store->CompareAndSwap("runs/r/latest", std::nullopt, kOld).ok());
    REQUIRE(env.CreateDirectories("/store/blobs/a").ok());
    REQUIRE(env.CreateDirectories("/store/blobs/b").ok());
    const uint64_t used = env.used_bytes();
    env.SetCapacity(used + kObject.size() / 2);
    CheckRefused(*store, writing, writing.write(*store), "No space left on device");
    CHECK(env.used_bytes() == used);  // nothing partial kept, not even a temporary file
    CHECK(Temporaries(env, writing.key.substr(0, writing.key.rfind('/'))).empty());
    env.SetCapacity(UINT64_MAX);
    REQUIRE(writing.write(*store).ok());
    CHECK(Text(store->Get(writing.key)) == kObject);
  }
}

TEST_CASE("directory store on an in-memory Env: the same contract as on the machine's files") {
  MemEnv env;
  auto store = OpenOn(env);
  CheckStoreSemantics(*store);
  CheckRacingSwaps(*store, 4, 50);
  // Opening without creating: only a directory that is there.
  MemEnv empty;
  CHECK(DirectoryStore::Open("/store", false, &empty).status().code() == StatusCode::kNotFound);
  CHECK(!empty.Exists("/store").value());
  REQUIRE(empty.CreateDirectories("/store").ok());
  CHECK(DirectoryStore::Open("/store", false, &empty).ok());
  const std::span<const uint8_t> nothing[] = {TextBytes("")};
  REQUIRE(empty.WriteAtomic("/file", nothing).ok());
  CHECK(DirectoryStore::Open("/file", false, &empty).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("directory store: a range of a large object reads that range, never the whole object") {
  MemEnv live;
  CrashPointEnv env(live);
  auto store = OpenOn(env);
  constexpr uint64_t kSize = uint64_t{8} << 20;
  const std::vector<uint8_t> big = Pattern(kSize, 5);
  {
    auto writer = std::move(store->NewImmutableWriter("blobs/big")).value();
    for (uint64_t at = 0; at < kSize; at += uint64_t{1} << 20)
      REQUIRE(writer->Write(std::span(big).subspan(at, uint64_t{1} << 20)).ok());
    REQUIRE(writer->Commit().ok());
  }
  const uint64_t first = uint64_t{5} << 20;
  ObjectRange range = std::move(store->GetRange("blobs/big", first, 10)).value();
  CHECK(range.object_size == kSize);
  CHECK(range.bytes == std::vector<uint8_t>(big.begin() + first, big.begin() + first + 10));
  std::vector<uint8_t> into(7);
  CHECK(store->GetRangeInto("blobs/big", kSize - 3, into)->read == 3);
  CHECK(std::equal(into.begin(), into.begin() + 3, big.end() - 3));
  struct Collect : BodyTarget {
    std::vector<uint8_t> bytes;
    Status Write(std::span<const uint8_t> piece) override {
      bytes.insert(bytes.end(), piece.begin(), piece.end());
      return Status::Ok();
    }
    Status Rewind() override {
      bytes.clear();
      return Status::Ok();
    }
  } collected;
  CHECK(*store->ReadTo("blobs/big", first, 3 << 20, collected) == kSize);
  CHECK(collected.bytes ==
        std::vector<uint8_t>(big.begin() + first, big.begin() + first + (3 << 20)));
  auto reader = std::move(store->OpenRead("blobs/big")).value();
  CHECK(reader->size() == kSize);
  uint8_t one = 0;
  CHECK(*reader->ReadAt(kSize - 1, {&one, 1}) == 1);
  CHECK(one == big.back());
  // 10 + 3 + 3 MiB + 1: the ranges asked for, no more.
  CHECK(env.bytes_read() == 10 + 3 + (uint64_t{3} << 20) + 1);
}

}  // namespace
}  // namespace weft::policy_store
