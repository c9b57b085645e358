// ForwardingStore: an ObjectStore that passes every call to another one; derive from it to
// change a few calls (count what is read, inject faults, add a cache) and keep the rest. GetRange
// is not passed on: it reads through this store's Get (ObjectStore's default), so that a class
// that changes Get sees every read; one that wants ranges read alone overrides GetRange and
// ReadsRanges too.
#pragma once

#include "policy_store/object_store.h"

namespace weft::policy_store {

class ForwardingStore : public ObjectStore {
 public:
  explicit ForwardingStore(ObjectStore& inner) : inner_(inner) {}

  Result<std::vector<uint8_t>> Get(const std::string& key) override { return inner_.Get(key); }
  Result<bool> Exists(const std::string& key) override { return inner_.Exists(key); }
  Result<std::vector<std::string>> List(const std::string& prefix) override {
    return inner_.List(prefix);
  }
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override {
    return inner_.PutImmutable(key, bytes);
  }
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override {
    return inner_.CompareAndSwap(key, std::move(expected), desired);
  }
  Status Delete(const std::string& key) override { return inner_.Delete(key); }
  std::string Describe() const override { return inner_.Describe(); }

 protected:
  ObjectStore& inner() const { return inner_; }

 private:
  ObjectStore& inner_;
};

}  // namespace weft::policy_store
