// What the benchmark programs share: stopping on an error, timing, and the raw downloads their
// verified pulls are measured against.
#pragma once

#include <curl/curl.h>
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/concurrent.h"
#include "common/status.h"
#include "policy_store/manifest.h"

namespace weft::bench {

using Clock = std::chrono::steady_clock;

// Unless `status` is Ok: prints "PROGRAM: WHAT: MESSAGE" and exits with 1.
inline void Check(const Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
               status.message().c_str());
  std::exit(1);
}

// The process's anonymous resident memory now, in bytes (RssAnon of /proc/self/status).
inline uint64_t AnonymousResident() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

// Samples AnonymousResident every 2 ms while it lives; peak() is the largest seen.
class PeakSampler {
 public:
  PeakSampler()
      : thread_([this] {
          while (!stop_) {
            peak_ = std::max<uint64_t>(peak_, AnonymousResident());
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }) {}
  ~PeakSampler() {
    stop_ = true;
    thread_.join();
  }
  uint64_t peak() const { return std::max<uint64_t>(peak_, AnonymousResident()); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

inline double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// This program's own path, to start it again as a child (a measurement in a process of its own).
inline std::string SelfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) std::abort();
  path[n] = 0;
  return path;
}

// Plain libcurl GETs of the blobs (no verification, no decoding), 16 at once, the bytes counted
// and dropped: `url(key)` is where a blob is, `setup` adds what a request needs besides (headers,
// a signature). Fails unless every answer is a 200 with the blob's size.
inline Status DownloadAll(const std::vector<policy_store::BlobRef>& blobs,
                          const std::function<std::string(const std::string&)>& url,
                          const std::function<void(CURL*, curl_slist**)>& setup = {}) {
  return ForEachConcurrently(blobs.size(), 16, [&](size_t i) -> Status {
    CURL* curl = curl_easy_init();
    curl_slist* headers = nullptr;
    uint64_t got = 0;
    const std::string where = url(policy_store::BlobKey(blobs[i].sha256));
    curl_easy_setopt(curl, CURLOPT_URL, where.c_str());
    curl_easy_setopt(curl, CURLOPT_PROXY, "");
    curl_easy_setopt(
        curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t count, void* user) {
          *static_cast<uint64_t*>(user) += size * count;
          return size * count;
        });
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &got);
    if (setup) setup(curl, &headers);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    const CURLcode code = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (code == CURLE_OK && status == 200 && got == blobs[i].bytes) return Status::Ok();
    return Unavailable("raw download of " + where + " failed: " + curl_easy_strerror(code) +
                       ", HTTP " + std::to_string(status) + ", " + std::to_string(got) + " of " +
                       std::to_string(blobs[i].bytes) + " bytes");
  });
}

}  // namespace weft::bench
