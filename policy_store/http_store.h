// HttpStore: an ObjectStore reached over HTTP, from a `weft store serve` server or any server that
// speaks the Store API of docs/api.md (reads also work through plain HTTP caches and relays).
//
// Every request has a deadline; connection failures and 5xx answers are retried with exponential
// backoff, then reported as kUnavailable naming the URL. Answers map to Status codes: 404
// kNotFound, 409 kConflict, other 4xx kInvalidArgument with the server's message. Writes send the
// writer token (Authorization: Bearer). Thread-safe (one libcurl handle per request).
#pragma once

#include <chrono>
#include <string>

#include "policy_store/object_store.h"

namespace weft::policy_store {

struct HttpStoreOptions {
  int attempts = 4;
  std::chrono::milliseconds first_backoff{100};
  std::chrono::milliseconds timeout{60000};  // per request
};

class HttpStore : public ObjectStore {
 public:
  // `base_url` like "http://127.0.0.1:8080" (no trailing slash).
  HttpStore(std::string base_url, std::string writer_token, HttpStoreOptions options = {});

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<bool> Exists(const std::string& key) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return base_url_; }

  struct Reply {
    long status = 0;
    std::vector<uint8_t> body;
  };
  // One request with retries; `method` is GET, HEAD, PUT, POST or DELETE.
  Result<Reply> Request(const std::string& method, const std::string& path,
                        std::span<const uint8_t> body, bool authorize);

 private:
  std::string base_url_;
  std::string writer_token_;
  HttpStoreOptions options_;
  bool loopback_ = false;
};

}  // namespace weft::policy_store
