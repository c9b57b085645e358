// Reads that survive bad links: the pull-through cache (single flight, corrupted files and
// transfers, eviction), HTTP resumption after a cut transfer, deadlines and link shaping.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/concurrent.h"
#include "common/units.h"
#include "policy_store/caching_store.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/link_shaper.h"
#include "policy_store/manifest.h"
#include "policy_store/run_objects.h"
#include "policy_store/store_server.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
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

TEST_CASE("cache: concurrent misses for one blob make one upstream fetch") {
  Upstream upstream;
  const auto blob = Pattern(1 << 20, 1);
  const std::string key = upstream.Put(blob);
  upstream.faulty.delay = std::chrono::milliseconds(200);
  const std::string dir = TempRoot("cache_flight");
  auto cache = std::move(CachingStore::Open(upstream.faulty, {dir, 64 << 20})).value();
  std::atomic<int> right{0};
  REQUIRE(ForEachConcurrently(16, 16, [&](size_t) {
            Result<std::vector<uint8_t>> got = cache->Get(key);
            if (got.ok() && *got == blob) right.fetch_add(1);
            return got.status();
          }).ok());
  CHECK(right.load() == 16);
  CHECK(upstream.faulty.gets.load() == 1);
  CHECK(cache->stats().upstream_bytes == blob.size());
  // Later reads are hits, and a restarted cache still has the blob.
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().hits >= 1);
  cache.reset();
  auto reopened = std::move(CachingStore::Open(upstream.faulty, {dir, 64 << 20})).value();
  CHECK(reopened->stats().cached_blobs == 1);
  CHECK(*reopened->Get(key) == blob);
  CHECK(upstream.faulty.gets.load() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "cache: a corrupted file is detected, reported and fetched again; corrupted transfers are "
    "retried") {
  Upstream upstream;
  const auto blob = Pattern(100000, 2);
  const std::string key = upstream.Put(blob);
  const std::string dir = TempRoot("cache_corrupt");
  auto cache = std::move(CachingStore::Open(upstream.faulty, {dir, 64 << 20})).value();
  REQUIRE(*cache->Get(key) == blob);
  {
    std::fstream file(dir + "/" + key, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(5000);
    file.put('\x7f');
  }
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().corrupted == 1);
  CHECK(upstream.faulty.gets.load() == 2);
  // The refetched copy replaced the corrupted file.
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().hits == 1);

  // A transfer corrupted once: fetched again. Corrupted every time: kDataLoss, nothing cached.
  const auto second = Pattern(5000, 3);
  const std::string second_key = upstream.Put(second);
  upstream.faulty.corrupt = 1;
  CHECK(*cache->Get(second_key) == second);
  const auto third = Pattern(7000, 4);
  const std::string third_key = upstream.Put(third);
  upstream.faulty.corrupt = 100;
  Result<std::vector<uint8_t>> bad = cache->Get(third_key);
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message().find("failed its hash") != std::string::npos);
  CHECK(!std::filesystem::exists(dir + "/" + third_key));
  upstream.faulty.corrupt = 0;
  CHECK(*cache->Get(third_key) == third);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "cache: bounded, least recently used first; manifests kept in memory; other keys pass "
    "through") {
  Upstream upstream;
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    blobs.push_back(Pattern(1000, static_cast<uint8_t>(10 + i)));
    keys.push_back(upstream.Put(blobs.back()));
  }
  const std::string dir = TempRoot("cache_lru");
  auto cache = std::move(CachingStore::Open(upstream.faulty, {dir, 3000})).value();
  for (int i = 0; i < 3; ++i) REQUIRE(cache->Get(keys[i]).ok());
  REQUIRE(cache->Get(keys[0]).ok());  // 0 is now the most recent: 1 goes first
  REQUIRE(cache->Get(keys[3]).ok());
  CHECK(cache->stats().cached_bytes == 3000);
  CHECK(cache->stats().evicted == 1);
  CHECK(!std::filesystem::exists(dir + "/" + keys[1]));
  CHECK(std::filesystem::exists(dir + "/" + keys[0]));
  // Larger than the whole cache: returned, not kept.
  const auto big = Pattern(5000, 99);
  const std::string big_key = upstream.Put(big);
  CHECK(*cache->Get(big_key) == big);
  CHECK(!std::filesystem::exists(dir + "/" + big_key));
  // A smaller limit on reopening evicts down to it.
  cache.reset();
  auto smaller = std::move(CachingStore::Open(upstream.faulty, {dir, 1000})).value();
  CHECK(smaller->stats().cached_blobs == 1);

  const std::string manifest_key = ManifestKey("r", 3);
  const std::string text = "{}";
  REQUIRE(
      upstream.store
          ->PutImmutable(manifest_key, {reinterpret_cast<const uint8_t*>(text.data()), text.size()})
          .ok());
  const int before = upstream.faulty.gets.load();
  REQUIRE(smaller->Get(manifest_key).ok());
  REQUIRE(smaller->Get(manifest_key).ok());
  CHECK(upstream.faulty.gets.load() == before + 1);
  REQUIRE(smaller->CompareAndSwap(LatestKey("r"), std::nullopt, "3\n").ok());
  REQUIRE(smaller->CompareAndSwap(LatestKey("r"), std::string("3\n"), "4\n").ok());
  CHECK(*smaller->Get(LatestKey("r")) == std::vector<uint8_t>{'4', '\n'});
  CHECK(smaller->Get("blobs/../x").status().code() == StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "direct reads: a blob corrupted in transit is fetched again; corrupted every time, an error") {
  Upstream upstream;
  const auto blob = Pattern(3000, 7);
  const BlobRef ref{Sha256Hex(blob), blob.size()};
  upstream.Put(blob);
  upstream.faulty.corrupt = 2;
  Result<std::vector<uint8_t>> got = FetchVerifiedBlob(upstream.faulty, ref, "test blob");
  REQUIRE(got.ok());
  CHECK(*got == blob);
  CHECK(upstream.faulty.gets.load() == 3);
  upstream.faulty.corrupt = 3;
  Status status = FetchVerifiedBlob(upstream.faulty, ref, "test blob").status();
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("test blob: blob " + ref.sha256 + " is corrupted") !=
        std::string::npos);
}

// A scripted HTTP server: answers each connection with the next canned response and records the
// requests it saw. "CUT" in a response means: send what came before, then close.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> responses) : responses_(std::move(responses)) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    socklen_t length = sizeof(address);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    REQUIRE(listen(listener_, 8) == 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedServer() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void Serve() {
    for (const std::string& response : responses_) {
      int connection = accept(listener_, nullptr, nullptr);
      if (connection < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        ssize_t got = recv(connection, buffer, sizeof(buffer), 0);
        if (got <= 0) break;
        request.append(buffer, static_cast<size_t>(got));
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(request);
      }
      const std::string sent = response.substr(0, response.find("CUT"));
      (void)!send(connection, sent.data(), sent.size(), MSG_NOSIGNAL);
      close(connection);
    }
  }
  std::vector<std::string> responses_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::string> requests_;
};

TEST_CASE("HTTP store: a transfer cut midway resumes from the byte it reached") {
  const std::string body(1000, 'a');
  const std::string rest(600, 'b');
  ScriptedServer server({
      "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: \"e1\"\r\nConnection: close\r\n\r\n" +
          std::string(400, 'a') + "CUT",
      "HTTP/1.1 206 Partial Content\r\nContent-Length: 600\r\nContent-Range: bytes "
      "400-999/1000\r\nETag: \"e1\"\r\n"
      "Connection: close\r\n\r\n" +
          rest,
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<std::vector<uint8_t>> got = store.Get("blobs/x");
  REQUIRE(got.ok());
  CHECK(std::string(got->begin(), got->end()) == std::string(400, 'a') + rest);
  CHECK(store.resumed() == 1);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[1].find("Range: bytes=400-") != std::string::npos);
  CHECK(requests[1].find("If-Range: \"e1\"") != std::string::npos);
}

TEST_CASE(
    "HTTP store: a resumed object that changed is taken whole; a dead server fails at the "
    "deadline") {
  ScriptedServer server({
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: \"old\"\r\nConnection: close\r\n\r\n01234CUT",
      "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nETag: \"new\"\r\nConnection: close\r\n\r\nabcdefgh",
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<std::vector<uint8_t>> got = store.Get("runs/r/latest");
  REQUIRE(got.ok());
  CHECK(std::string(got->begin(), got->end()) == "abcdefgh");

  // Nothing listens there any more: retried until the deadline, then a clear error.
  const std::string url = server.url();
  HttpStoreOptions short_deadline;
  short_deadline.first_backoff = std::chrono::milliseconds(50);
  short_deadline.attempts = 1000;
  short_deadline.deadline = std::chrono::milliseconds(600);
  HttpStore gone("http://127.0.0.1:1", "", short_deadline);
  const auto start = std::chrono::steady_clock::now();
  Status status = gone.Get("blobs/x").status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK(status.message().find("gave up after") != std::string::npos);
  CHECK(seconds >= 0.3);
  CHECK(seconds < 30);
}

TEST_CASE(
    "link shaping: bandwidth is shared by every request on the link, latency added per request") {
  std::string root = TempRoot("shaped");
  auto backend = std::move(DirectoryStore::Open(root)).value();
  const auto blob = Pattern(400000, 5);
  REQUIRE(backend->PutImmutable("blobs/b", blob).ok());
  auto server = std::move(StoreServer::Start(*backend, {})).value();
  HttpStoreOptions options;
  options.shaper = std::make_shared<LinkShaper>(LinkShape{2000000, std::chrono::milliseconds(20)});
  HttpStore store("http://127.0.0.1:" + std::to_string(server->port()), "", options);
  const auto start = std::chrono::steady_clock::now();
  // Four concurrent reads of 0.4 MB over a 2 MB/s link: at least 1.6 MB / 2 MB/s less the burst.
  REQUIRE(ForEachConcurrently(4, 4, [&](size_t) { return store.Get("blobs/b").status(); }).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds >= 0.7);
  CHECK(store.bytes_received() == 4 * blob.size());
  server->Stop();
  std::filesystem::remove_all(root);
}

TEST_CASE("units: sizes and durations") {
  CHECK(*ParseByteSize("512") == 512);
  CHECK(*ParseByteSize("64MiB") == 64ull << 20);
  CHECK(*ParseByteSize("1.5G") == 1500000000ull);
  CHECK(*ParseByteSize("100 mb") == 100000000ull);
  CHECK(ParseByteSize("ten").status().message().find("'ten' is not a byte size") !=
        std::string::npos);
  CHECK(!ParseByteSize("-1").ok());
  CHECK(!ParseByteSize("5 parsecs").ok());
  CHECK(ParseDuration("40ms")->count() == 40000);
  CHECK(ParseDuration("2.5s")->count() == 2500000);
  CHECK(ParseDuration("1m")->count() == 60000000);
  CHECK(!ParseDuration("5").ok());
}

}  // namespace
}  // namespace weft::policy_store
