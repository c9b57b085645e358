// Helpers shared by the policy store tests.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/manifest.h"
#include "policy_store/store_server.h"
#include "tests/temp_path.h"

namespace weft::policy_store {

// A fresh, empty path under the temporary directory, unique to this process.
inline std::string TempRoot(const std::string& name) { return testing::TempPath(name); }

inline std::span<const uint8_t> Bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

// A store server on an ephemeral loopback port, backed by a directory store.
struct Served {
  std::string root;
  std::unique_ptr<DirectoryStore> backend;
  std::unique_ptr<StoreServer> server;
  std::string url;

  explicit Served(std::string token) : root(TempRoot("http")) {
    backend = std::move(DirectoryStore::Open(root)).value();
    StoreServerOptions options;
    options.writer_token = std::move(token);
    options.max_body_bytes = 1 << 20;
    server = std::move(StoreServer::Start(*backend, options)).value();
    url = "http://127.0.0.1:" + std::to_string(server->port());
  }
  ~Served() {
    server->Stop();
    std::filesystem::remove_all(root);
  }
};

inline HttpStoreOptions FastRetries() {
  HttpStoreOptions options;
  options.attempts = 2;
  options.first_backoff = std::chrono::milliseconds(10);
  options.deadline = std::chrono::milliseconds(10000);
  return options;
}

inline std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + seed);
  return bytes;
}

// An upstream that counts reads, can be slow, and can flip a byte of the next `corrupt` reads.
class FaultyStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    gets.fetch_add(1);
    std::this_thread::sleep_for(delay);
    Result<std::vector<uint8_t>> bytes = inner().Get(key);
    if (bytes.ok() && !bytes->empty() && corrupt.load() > 0) {
      corrupt.fetch_sub(1);
      (*bytes)[bytes->size() / 2] ^= 0x40;
    }
    return bytes;
  }
  std::string Describe() const override { return "faulty:" + inner().Describe(); }

  std::atomic<int> gets{0};
  std::atomic<int> corrupt{0};
  std::chrono::milliseconds delay{0};
};

struct Upstream {
  std::string root = TempRoot("upstream");
  std::unique_ptr<DirectoryStore> store = std::move(DirectoryStore::Open(root)).value();
  FaultyStore faulty{*store};
  std::string Put(const std::vector<uint8_t>& bytes) {
    const std::string key = BlobKey(Sha256Hex(bytes));
    REQUIRE(store->PutImmutable(key, bytes).ok());
    return key;
  }
  ~Upstream() { std::filesystem::remove_all(root); }
};

}  // namespace weft::policy_store
