// DirectoryStore: an ObjectStore in a local directory, the embedded default.
//
// Object `a/b/c` is the file ROOT/a/b/c. Writes go to a temporary file in the same directory,
// are fsynced, renamed over the target and the directory is fsynced, so a crash leaves either the
// old object or the new one. PutImmutable uses link(2), which fails if the target exists, so two
// writers racing for one key cannot both win; NewImmutableWriter writes its temporary file the
// same way, a piece at a time, and links it into place at Commit (the file is adopted, never
// copied). CompareAndSwap holds an exclusive flock on ROOT/.lock while it compares and replaces.
// Files whose path has a component starting with '.' (the lock, temporary files) are the store's
// own: List never returns them. A key naming a directory (a prefix of other keys) is no object:
// Get answers kNotFound. Error messages name keys, never the directory's path on disk (a store
// server passes them to its clients). Thread- and process-safe.
#pragma once

#include <string>

#include "common/file_util.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

class DirectoryStore : public ObjectStore {
 public:
  // With `create`, creates the directory if needed; without, a directory that does not exist is
  // kNotFound (and nothing is created).
  static Result<std::unique_ptr<DirectoryStore>> Open(const std::string& root, bool create = true);

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
  Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key) override;
  std::string Describe() const override { return "dir:" + root_; }

 private:
  explicit DirectoryStore(std::string root) : root_(std::move(root)) {}
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }
  // A Status whose message names files under the root by their keys instead.
  Status Hidden(const Status& status) const;
  // The object's bytes: kNotFound unless `key` is a regular file.
  Result<ObjectRange> Read(const std::string& key, uint64_t first, uint64_t length) const;
  // The object's file, opened for reading: kNotFound unless `key` is a regular file.
  Result<OpenedFile> OpenFile(const std::string& key) const;
  // The object's directory, created if needed; kConflict if a prefix of the key is an object.
  Status EnsureParent(const std::string& key) const;

  std::string root_;
};

}  // namespace weft::policy_store
