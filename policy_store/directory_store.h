// DirectoryStore: an ObjectStore in a local directory, the embedded default.
//
// Object `a/b/c` is the file ROOT/a/b/c. Writes go to a temporary file in the same directory,
// are fsynced, renamed over the target and the directory is fsynced, so a crash leaves either the
// old object or the new one. PutImmutable uses link(2), which fails if the target exists, so two
// writers racing for one key cannot both win. CompareAndSwap holds an exclusive flock on
// ROOT/.lock while it compares and replaces. Thread- and process-safe.
#pragma once

#include <string>

#include "policy_store/object_store.h"

namespace weft::policy_store {

class DirectoryStore : public ObjectStore {
 public:
  // Creates the directory if needed.
  static Result<std::unique_ptr<DirectoryStore>> Open(const std::string& root);

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<bool> Exists(const std::string& key) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return "dir:" + root_; }

 private:
  explicit DirectoryStore(std::string root) : root_(std::move(root)) {}
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }

  std::string root_;
};

}  // namespace weft::policy_store
