// LinkShaper: makes one machine behave like regions joined by a WAN, for tests and benchmarks.
//
// A shaped link adds `latency` before every request (one round trip, the cost of a request on a
// long link) and limits the bytes received through it to `bytes_per_second`, shared by every
// request on the link (a token bucket with about 50 ms of burst), so sixteen parallel downloads
// share the bandwidth as they would share a real link. The pacing happens as bytes arrive, so a
// transfer is genuinely in flight for as long as the emulated link needs. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/http_client.h"
#include "common/mutex.h"

namespace weft::policy_store {

struct LinkShape {
  uint64_t bytes_per_second = 0;         // 0: unlimited
  std::chrono::microseconds latency{0};  // added before each request
  bool active() const { return bytes_per_second > 0 || latency.count() > 0; }
  std::string Describe() const;
};

class LinkShaper {
 public:
  explicit LinkShaper(LinkShape shape) : shape_(shape) {}

  const LinkShape& shape() const { return shape_; }
  // Waits for the link's latency.
  void BeforeRequest() const;
  // Accounts for `bytes` received and waits until the link would have delivered them.
  void Received(uint64_t bytes);

 private:
  using Clock = std::chrono::steady_clock;
  LinkShape shape_;
  Mutex mutex_;
  Clock::time_point free_at_
      GUARDED_BY(mutex_){};  // when the link has delivered everything accounted so far
};

// Sets a client's hooks so that its requests go through `shaper` (null: left as they are).
void ShapeClient(const std::shared_ptr<LinkShaper>& shaper, HttpClientOptions* options);

}  // namespace weft::policy_store
