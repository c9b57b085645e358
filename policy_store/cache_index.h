// CacheIndex: what a relay's blob cache holds, by key, with each blob's size and a value of its
// owner's, least recently used first. It is the cache policy of the relay (CachingStore) and of
// the simulator's relays (sim/network.cc), kept in one place:
//   - a blob larger than max_bytes is never held (Fits): its readers read through to the upstream;
//   - a blob is added once all its bytes are there (a fetch under way holds no room in the index:
//     its temporary file is beyond max_bytes);
//   - adding a blob evicts the least recently used others until the total is within max_bytes;
//     the blob just added is never evicted by its own addition;
//   - a read of a held blob makes it the most recently used (Touch).
// Pure and single-threaded: its owner locks. Key must be hashable and copyable.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace weft::policy_store {

// The value of an index that keeps nothing beside each blob's size.
struct NoValue {};

template <typename Key, typename Value = NoValue>
class CacheIndex {
 public:
  explicit CacheIndex(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Whether a blob of `bytes` may be held at all.
  bool Fits(uint64_t bytes) const { return bytes <= max_bytes_; }

  // The value of `key`, made the most recently used; null when it is not held.
  Value* Touch(const Key& key) {
    auto found = entries_.find(key);
    if (found == entries_.end()) return nullptr;
    lru_.splice(lru_.end(), lru_, found->second.position);
    return &found->second.value;
  }
  // The value of `key`, its place unchanged; null when it is not held.
  Value* Find(const Key& key) {
    auto found = entries_.find(key);
    return found == entries_.end() ? nullptr : &found->second.value;
  }
  bool Contains(const Key& key) const { return entries_.count(key) != 0; }

  // Holds `key`, `bytes` long, as the most recently used (one already held is touched and keeps
  // its size and value), then evicts the others, least recently used first, until the total is
  // within max_bytes. Returns the keys evicted, in that order.
  std::vector<Key> Add(const Key& key, uint64_t bytes, Value value = Value()) {
    if (Touch(key) == nullptr) {
      lru_.push_back(key);
      entries_.emplace(key, Entry{bytes, std::prev(lru_.end()), std::move(value)});
      bytes_ += bytes;
    }
    std::vector<Key> evicted;
    while (bytes_ > max_bytes_ && lru_.front() != key) evicted.push_back(EvictOldest());
    return evicted;
  }
  // Evicts, least recently used first, until the total is within max_bytes (after a smaller
  // limit). Returns the keys evicted, in that order.
  std::vector<Key> Shrink() {
    std::vector<Key> evicted;
    while (bytes_ > max_bytes_ && !lru_.empty()) evicted.push_back(EvictOldest());
    return evicted;
  }
  // Stops holding `key`; false when it was not held.
  bool Erase(const Key& key) {
    auto found = entries_.find(key);
    if (found == entries_.end()) return false;
    bytes_ -= found->second.bytes;
    lru_.erase(found->second.position);
    entries_.erase(found);
    return true;
  }

  uint64_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    typename std::list<Key>::iterator position;
    Value value;
  };

  Key EvictOldest() {
    Key victim = lru_.front();
    Erase(victim);
    return victim;
  }

  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::list<Key> lru_;  // least recently used first
  std::unordered_map<Key, Entry> entries_;
};

}  // namespace weft::policy_store
