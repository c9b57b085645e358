// Helpers shared by the policy store tests.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_io.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/manifest.h"
#include "policy_store/s3_store.h"
#include "policy_store/store_server.h"
#include "tests/temp_path.h"

namespace weft::policy_store {

// A fresh, empty path under the temporary directory, unique to this process.
inline std::string TempRoot(const std::string& name) { return ::weft::testing::TempPath(name); }

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

// This process's resident memory now, from /proc/self/status (0 where it cannot be read).
inline uint64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

// How far resident memory grew since `before` (a ResidentBytes() reading), 0 if it shrank. The
// reading is taken once: two readings could straddle a change and underflow.
inline uint64_t ResidentGrowthSince(uint64_t before) {
  const uint64_t now = ResidentBytes();
  return now > before ? now - before : 0;
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

// A directory store of blobs, in a fresh directory, or in `env` (a MemEnv, say) when one is given.
struct Upstream {
  explicit Upstream(Env* env = nullptr) : env(env) {}
  Env* env;
  std::string root = TempRoot("upstream");
  std::unique_ptr<DirectoryStore> store = std::move(DirectoryStore::Open(root, true, env)).value();
  FaultyStore faulty{*store};
  std::string Put(const std::vector<uint8_t>& bytes) {
    const std::string key = BlobKey(Sha256Hex(bytes));
    REQUIRE(store->PutImmutable(key, bytes).ok());
    return key;
  }
  ~Upstream() {
    if (env == nullptr) std::filesystem::remove_all(root);
  }
};

// The store the backend-neutral tests (publish, reader) run on: a fresh directory, or, when the
// environment variable WEFT_TEST_STORE names an s3:// store, a fresh prefix under it, emptied
// again afterwards. The S3 suite (tests/policy_store/s3_test.sh) runs them that way against a
// real S3 service.
// The settings of the s3:// store the environment variable WEFT_TEST_STORE names, under a fresh
// prefix below its own ("NAME-RANDOM"); none when it names no s3:// store.
inline std::optional<s3::Settings> TestS3Settings(const std::string& name) {
  const char* uri = std::getenv("WEFT_TEST_STORE");
  if (uri == nullptr || std::string(uri).rfind("s3://", 0) != 0) return std::nullopt;
  Result<s3::Settings> settings = s3::ResolveSettings(uri, s3::ProcessEnvironment());
  REQUIRE_MESSAGE(settings.ok(), settings.status().ToString());
  const std::string fresh = name + "-" + std::to_string(std::random_device{}());
  settings->prefix = settings->prefix.empty() ? fresh : settings->prefix + "/" + fresh;
  return *settings;
}

struct TestStore {
  std::string root;  // the directory; empty on S3
  std::unique_ptr<ObjectStore> store;
  S3Store* s3 = nullptr;

  explicit TestStore(const std::string& name = "store") {
    if (std::optional<s3::Settings> settings = TestS3Settings(name)) {
      auto opened = std::make_unique<S3Store>(std::move(*settings));
      s3 = opened.get();
      store = std::move(opened);
      return;
    }
    root = TempRoot(name);
    store = std::move(DirectoryStore::Open(root)).value();
  }
  ~TestStore() {
    if (s3 == nullptr) {
      std::filesystem::remove_all(root);
      return;
    }
    for (const std::string& key : Keys()) (void)store->Delete(key);
  }
  bool local() const { return s3 == nullptr; }

  // Every key of the store's usual namespaces.
  std::vector<std::string> Keys() const {
    std::vector<std::string> all;
    for (const char* prefix : {"blobs/", "runs/", "things/"}) {
      Result<std::vector<std::string>> keys = store->List(prefix);
      REQUIRE(keys.ok());
      all.insert(all.end(), keys->begin(), keys->end());
    }
    return all;
  }
  // Every object of the store's usual namespaces, by key, with its bytes.
  std::map<std::string, std::vector<uint8_t>> Objects() const {
    std::map<std::string, std::vector<uint8_t>> objects;
    for (const std::string& key : Keys()) objects[key] = std::move(store->Get(key)).value();
    return objects;
  }

  // Replaces an object behind the store's back (corruption at rest).
  void Overwrite(const std::string& key, const std::vector<uint8_t>& bytes) {
    if (s3 != nullptr) {
      S3Store::Call call;
      call.method = "PUT";
      call.key = key;
      call.body = bytes;
      Result<HttpReply> reply = s3->Send(call);
      REQUIRE(reply.ok());
      REQUIRE(reply->status == 200);
      return;
    }
    const std::string path = root + "/" + key;
    std::filesystem::remove(path);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
};

}  // namespace weft::policy_store
