// DirectoryStore: an ObjectStore in a local directory, the embedded default.
//
// Object `a/b/c` is the file ROOT/a/b/c, reached through an Env (common/env.h: the machine's
// files unless told otherwise; tests crash it at any byte on a MemEnv). A write goes to a
// temporary file in the object's directory, is synced, and only then moved into place with
// Env::RenameIfAbsent, which refuses to replace anything: a crash leaves the object absent or
// whole, and of two writers racing for one key only one can win. NewImmutableWriter writes its
// temporary file the same way, a piece at a time, and moves it into place at Commit (the file is
// adopted, never copied). CompareAndSwap holds the Env's exclusive lock on ROOT/.lock while it
// compares and replaces (Env::WriteAtomic). Files whose path has a component starting with '.'
// (the lock, temporary files, which a crash can leave behind) are the store's own: List never
// returns them. A key naming a directory (a prefix of other keys) is no object: Get answers
// kNotFound. Ranges are read alone, in bounded memory whatever the object's size. Error messages
// name keys, never the directory's path on disk (a store server passes them to its clients).
// Thread- and process-safe.
#pragma once

#include <memory>
#include <string>

#include "common/env.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

class DirectoryStore : public ObjectStore {
 public:
  // With `create`, creates the directory if needed; without, a directory that does not exist is
  // kNotFound (and nothing is created). `env` holds the files (null: Env::Default()) and must
  // outlive the store and its readers and writers.
  static Result<std::unique_ptr<DirectoryStore>> Open(const std::string& root, bool create = true,
                                                      Env* env = nullptr);

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override;
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override;
  bool ReadsRanges() const override { return true; }
  // The file, opened once: one version of the object even if the key is replaced meanwhile.
  Result<uint64_t> ReadTo(const std::string& key, uint64_t first, uint64_t length,
                          BodyTarget& target) override;
  Result<std::unique_ptr<ObjectReader>> OpenRead(const std::string& key) override;
  bool Local() const override { return true; }
  Result<bool> Exists(const std::string& key) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  // Waits for the file to change: writers in other processes are seen through inotify (the
  // machine's files), those of this process at once; the file is read again at least every 100 ms.
  Result<ObjectWatch> WaitForChange(const std::string& key, const std::optional<std::string>& known,
                                    std::chrono::milliseconds wait,
                                    const std::atomic<bool>* cancel = nullptr) override;
  Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key) override;
  std::string Describe() const override { return "dir:" + root_; }

 private:
  struct OpenedObject {
    std::unique_ptr<ReadableFile> file;
    uint64_t size = 0;
  };

  DirectoryStore(Env& env, std::string root) : env_(env), root_(std::move(root)) {}
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }
  // The object's file, opened for reading: kNotFound unless `key` is a file.
  Result<OpenedObject> OpenFile(const std::string& key) const;
  // A reader of the object's open file, its errors naming the key, not the path.
  std::unique_ptr<ObjectReader> ObjectFileReader(std::unique_ptr<ReadableFile> file, uint64_t size,
                                                 const std::string& key) const;
  // The object's directory, created if needed; kConflict if a prefix of the key is an object.
  Status EnsureParent(const std::string& key) const;

  Env& env_;
  std::string root_;
};

}  // namespace weft::policy_store
