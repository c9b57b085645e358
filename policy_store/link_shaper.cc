#include "policy_store/link_shaper.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace weft::policy_store {

std::string LinkShape::Describe() const {
  char text[96];
  if (bytes_per_second > 0) {
    std::snprintf(text, sizeof(text), "%.1f MB/s, +%.1f ms per request", bytes_per_second / 1e6,
                  latency.count() / 1000.0);
  } else {
    std::snprintf(text, sizeof(text), "unlimited, +%.1f ms per request", latency.count() / 1000.0);
  }
  return text;
}

void LinkShaper::BeforeRequest() const {
  if (shape_.latency.count() > 0) std::this_thread::sleep_for(shape_.latency);
}

void LinkShaper::Received(uint64_t bytes) {
  if (shape_.bytes_per_second == 0 || bytes == 0) return;
  const auto burst = std::chrono::milliseconds(50);
  Clock::time_point wake;
  {
    MutexLock lock(mutex_);
    const Clock::time_point now = Clock::now();
    const auto cost = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
        static_cast<double>(bytes) / static_cast<double>(shape_.bytes_per_second)));
    free_at_ = std::max(free_at_, now - burst) + cost;
    wake = free_at_ - burst;
  }
  std::this_thread::sleep_until(wake);
}

void ShapeClient(const std::shared_ptr<LinkShaper>& shaper, HttpClientOptions* options) {
  if (!shaper) return;
  options->before_request = [shaper] { shaper->BeforeRequest(); };
  options->received = [shaper](uint64_t bytes) { shaper->Received(bytes); };
}

}  // namespace weft::policy_store
