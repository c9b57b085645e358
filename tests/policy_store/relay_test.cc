#include "policy_store/relay.h"

#include <doctest/doctest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/concurrent.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A relay's upstream store that counts the opens of each key, and holds back the keys it is told
// to hang (an upstream that never answers for them) until released.
class GatedStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::unique_ptr<ObjectReader>> OpenRead(const std::string& key) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++opens_[key];
      released_.wait(lock, [&] { return hung_.count(key) == 0; });
    }
    return inner().OpenRead(key);
  }
  bool ReadsRanges() const override { return true; }
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override {
    return inner().GetRange(key, first, length);
  }
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override {
    return inner().GetRangeInto(key, first, out);
  }
  void Hang(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    hung_.insert(key);
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    hung_.clear();
    released_.notify_all();
  }
  int opens(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return opens_[key];
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  std::set<std::string> hung_;
  std::map<std::string, int> opens_;
};

std::string UrlOf(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

// An upstream that answers every request with `header` and then streams zeros until the reader
// goes away (or `limit` bytes): a server announcing more than it should, or endlessly slow.
class EndlessServer {
 public:
  explicit EndlessServer(std::string header, uint64_t limit = uint64_t{64} << 20)
      : header_(std::move(header)), limit_(limit) {
    listener_ = weft::testing::ListenOnLoopback(16, &port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~EndlessServer() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
    for (std::thread& t : connections_) t.join();
  }
  std::string url() const { return UrlOf(port_); }
  int requests() const { return requests_.load(); }

 private:
  void Serve() {
    while (true) {
      const int connection = accept(listener_, nullptr, nullptr);
      if (connection < 0) return;
      connections_.emplace_back([this, connection] {
        std::string request;
        char buffer[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t got = recv(connection, buffer, sizeof(buffer), 0);
          if (got <= 0) break;
          request.append(buffer, static_cast<size_t>(got));
        }
        ++requests_;
        std::string zeros(64 << 10, '\0');
        bool open = send(connection, header_.data(), header_.size(), MSG_NOSIGNAL) > 0;
        for (uint64_t sent = 0; open && sent < limit_; sent += zeros.size())
          open = send(connection, zeros.data(), zeros.size(), MSG_NOSIGNAL) > 0;
        close(connection);
      });
    }
  }
  std::string header_;
  uint64_t limit_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::vector<std::thread> connections_;
  std::atomic<int> requests_{0};
};

TEST_CASE("relay: one upstream fetch per blob for a region's readers; read-only; counters served") {
  const std::string root = TempRoot("relay_origin");
  auto origin = std::move(DirectoryStore::Open(root)).value();
  testing::TestRun run(*origin, "run", 2);
  run.Start();
  for (int v = 1; v <= 3; ++v) run.Next();
  auto server = std::move(StoreServer::Start(*origin, {})).value();

  RelayOptions options;
  options.upstream = "http://127.0.0.1:" + std::to_string(server->port());
  options.cache_dir = TempRoot("relay_cache");
  options.cache_bytes = uint64_t{64} << 20;
  options.link = LinkShape{0, std::chrono::milliseconds(5)};
  options.threads = 8;
  auto relay = Relay::Start(options);
  REQUIRE(relay.ok());
  CHECK((*relay)->Describe() == "relay of " + options.upstream + " (cache " + options.cache_dir +
                                    ", at most 64.0 MiB; upstream link shaped to unlimited, +5.0 "
                                    "ms per request)");
  const std::string url = "http://127.0.0.1:" + std::to_string((*relay)->port());
  // Four readers at once, from nothing.
  std::vector<sync::ServedModel> models(4);
  std::vector<PullReport> reports(4);
  REQUIRE(ForEachConcurrently(4, 4, [&](size_t i) -> Status {
            HttpStore store(url, "");
            WEFT_ASSIGN_OR_RETURN(reports[i],
                                  StoreReader(store, "run", 1).Pull(3, std::nullopt, &models[i]));
            return Status::Ok();
          }).ok());
  for (const sync::ServedModel& model : models) CHECK(testing::SameBytes(model, run.published[3]));
  const CacheStats stats = (*relay)->stats();
  CHECK(stats.misses + stats.hits == 4 * reports[0].fetched.size());
  CHECK(stats.upstream_bytes >= reports[0].bytes_downloaded);
  CHECK(stats.upstream_bytes < 2 * reports[0].bytes_downloaded);  // not once per reader
  auto served = weft::testing::Raw(url + "/v1/stats", "GET");
  REQUIRE(served.status == 200);
  CHECK(nlohmann::json::parse(served.text())["hits"] == stats.hits);
  // Read-only: writes are refused.
  HttpStore writer(url, "any", FastRetries());
  CHECK(writer.PutImmutable("blobs/x", TextBytes("x")).message().find("read-only") !=
        std::string::npos);
  (*relay)->Stop();
  server->Stop();
  RelayOptions bad;
  bad.upstream = "file:///tmp/store";
  CHECK(Relay::Start(bad).status().message() ==
        "the upstream must be an http(s):// store server or an s3:// store, not "
        "'file:///tmp/store'");
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(options.cache_dir);
}

TEST_CASE("relay: a 4xx from upstream is passed on at once, not retried; nor is a directory 503") {
  const std::string root = TempRoot("relay_dir_origin");
  auto origin = std::move(DirectoryStore::Open(root)).value();
  REQUIRE(origin->PutImmutable("runs/run/versions/a", TextBytes("1")).ok());
  auto server = std::move(StoreServer::Start(*origin, {})).value();
  RelayOptions options;
  options.upstream = "http://127.0.0.1:" + std::to_string(server->port());
  options.cache_dir = TempRoot("relay_dir_cache");
  options.threads = 4;
  auto relay = std::move(Relay::Start(options)).value();
  const std::string url = "http://127.0.0.1:" + std::to_string(relay->port());
  for (const std::string& key :
       std::vector<std::string>{"runs/run", "runs/run/versions", "runs/run/versions/missing",
                                "blobs/" + std::string(64, '0')}) {
    CAPTURE(key);
    const auto start = std::chrono::steady_clock::now();
    auto reply = weft::testing::Raw(url + "/v1/objects/" + key, "GET");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(reply.status == 404);
    CHECK(reply.text().find(root) == std::string::npos);  // no path of the upstream's disk
    CHECK(seconds < 2);
  }
  // Refused upstream as malformed: 400 through the relay, at once.
  CHECK(weft::testing::Raw(url + "/v1/objects/runs/.hidden", "GET").status == 400);
  HttpStore store(url, "");
  CHECK(store.Get("runs/run").status().code() == StatusCode::kNotFound);
  CHECK(store.retries() == 0);
  CHECK(relay->stats().upstream_fetches <= 5);
  relay->Stop();
  server->Stop();
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(options.cache_dir);
}

TEST_CASE(
    "relay: a hung upstream delays only its own objects; hits, misses, livez answer at once") {
  Upstream origin;
  const std::vector<uint8_t> cached = Pattern(300000, 1);
  const std::string cached_key = origin.Put(cached);
  std::vector<std::string> hung;
  for (uint8_t i = 0; i < 4; ++i) hung.push_back(origin.Put(Pattern(200000, 10 + i)));
  const std::vector<uint8_t> other = Pattern(250000, 20);
  const std::string other_key = origin.Put(other);
  GatedStore gated(*origin.store);
  StoreServerOptions upstream_options;
  upstream_options.threads = 2;
  auto upstream = std::move(StoreServer::Start(gated, upstream_options)).value();
  RelayOptions options;
  options.upstream = UrlOf(upstream->port());
  options.cache_dir = TempRoot("relay_hung");
  options.threads = 2;
  options.deadline = std::chrono::milliseconds(6000);
  auto relay = std::move(Relay::Start(options)).value();
  const std::string url = UrlOf(relay->port());
  HttpStoreOptions client_options = FastRetries();
  client_options.attempts = 1;
  client_options.deadline = std::chrono::seconds(30);
  HttpStore reader(url, "", client_options);
  REQUIRE(*reader.Get(cached_key) == cached);

  for (const std::string& key : hung) gated.Hang(key);
  // Two readers per hung blob, more than the relay has I/O threads.
  std::vector<std::thread> waiting;
  std::atomic<int> failed{0};
  std::vector<double> took(8);
  for (int i = 0; i < 8; ++i) {
    waiting.emplace_back([&, i] {
      const auto start = Clock::now();
      HttpStore store(url, "", client_options);
      if (!store.Get(hung[i % 4]).ok()) ++failed;
      took[i] = SecondsSince(start);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = Clock::now();
  CHECK(weft::testing::Raw(url + "/livez", "GET").status == 200);
  CHECK(weft::testing::Raw(url + "/metrics", "GET").status == 200);
  CHECK(*reader.Get(cached_key) == cached);  // a hit
  CHECK(*reader.Get(other_key) == other);    // another miss
  CHECK(SecondsSince(start) < 3.0);          // (the hung reads wait 6 s)
  for (std::thread& t : waiting) t.join();
  // The hung reads end with the relay's deadline for the upstream, with an error, not before.
  CHECK(failed.load() == 8);
  for (double seconds : took) {
    CHECK(seconds > 5.0);
    CHECK(seconds < 20);
  }
  // One upstream open per hung blob, however many readers waited for it.
  for (const std::string& key : hung) CHECK(gated.opens(key) == 1);
  gated.Release();
  CHECK(*reader.Get(hung[0]) == Pattern(200000, 10));
  relay->Stop();
  upstream->Stop();
  std::filesystem::remove_all(options.cache_dir);
}

TEST_CASE("relay: bytes that are not their blob are refused once, clearly, and never cached") {
  TestStore origin_store("relay_tampered");
  testing::TestRun run(*origin_store.store, "run", 4);
  run.Start();
  for (int v = 1; v <= 2; ++v) run.Next();
  const Manifest manifest = std::move(ReadManifest(*origin_store.store, "run", 0)).value();
  const BlobRef keyframe = manifest.keyframe.front();
  // The keyframe's bytes replaced at rest in the origin, same size, other content.
  std::vector<uint8_t> other = std::move(origin_store.store->Get(BlobKey(keyframe.sha256))).value();
  other[other.size() / 2] ^= 0x10;
  origin_store.Overwrite(BlobKey(keyframe.sha256), other);
  GatedStore counted(*origin_store.store);
  auto upstream = std::move(StoreServer::Start(counted, {})).value();
  RelayOptions options;
  options.upstream = UrlOf(upstream->port());
  options.cache_dir = TempRoot("relay_tampered_cache");
  auto relay = std::move(Relay::Start(options)).value();
  const std::string url = UrlOf(relay->port());

  const auto start = Clock::now();
  HttpStore store(url, "");
  sync::ServedModel model;
  Result<PullReport> pulled = StoreReader(store, "run", 1).Pull(2, std::nullopt, &model);
  const double seconds = SecondsSince(start);
  REQUIRE(!pulled.ok());
  CHECK(pulled.status().code() == StatusCode::kDataLoss);
  const std::string message = pulled.status().message();
  CAPTURE(message);
  CHECK(message.find("blob " + keyframe.sha256 + " from " + url) != std::string::npos);
  CHECK(message.find(Sha256Hex(other)) != std::string::npos);  // the hash it had
  CHECK(seconds < 5);
  CHECK(model.tensors().empty());
  // The upstream was asked once; nothing was cached; the relay counted it.
  CHECK(counted.opens(BlobKey(keyframe.sha256)) == 1);
  CHECK(!std::filesystem::exists(options.cache_dir + "/blobs/" + keyframe.sha256));
  CHECK(relay->stats().upstream_mismatches == 1);
  CHECK(relay->stats().refused >= 1);
  CHECK(weft::testing::Raw(url + "/metrics", "GET")
            .text()
            .find("weft_relay_upstream_hash_mismatches_total 1") != std::string::npos);
  // The answer itself: 502, final, naming the blob and both hashes.
  weft::testing::RawConnection raw(relay->port());
  raw.Send("GET /v1/objects/blobs/" + keyframe.sha256 +
           " HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  const std::string answer = raw.ReadAll();
  CHECK(weft::testing::StatusOf(answer) == 502);
  CHECK(answer.find("X-Weft-Error: blob-hash-mismatch") != std::string::npos);
  CHECK(answer.find(keyframe.sha256) != std::string::npos);
  CHECK(answer.find(Sha256Hex(other)) != std::string::npos);
  relay->Stop();
  upstream->Stop();
  std::filesystem::remove_all(options.cache_dir);
}

TEST_CASE("relay: an upstream announcing more than the cache holds is read range by range") {
  // 8 GiB announced, zeros streamed for as long as anyone reads.
  EndlessServer endless(
      "HTTP/1.1 200 OK\r\nContent-Length: 8589934592\r\nETag: \"e\"\r\nConnection: "
      "close\r\n\r\n");
  RelayOptions options;
  options.upstream = endless.url();
  options.cache_dir = TempRoot("relay_endless");
  options.cache_bytes = uint64_t{64} << 20;
  auto relay = std::move(Relay::Start(options)).value();
  const uint64_t before = ResidentBytes();
  HttpStore store(UrlOf(relay->port()), "", FastRetries());
  const std::string key = "blobs/" + std::string(64, 'c');
  // (This upstream ignores ranges: the relay's reads skip what comes before theirs.)
  for (uint64_t first : {uint64_t{0}, uint64_t{2} << 20}) {
    Result<ObjectRange> range = store.GetRange(key, first, 3 << 20);
    REQUIRE_MESSAGE(range.ok(), range.status().ToString());
    CHECK(range->object_size == uint64_t{8} << 30);
    CHECK(range->bytes == std::vector<uint8_t>(3 << 20, 0));
  }
  CHECK(ResidentGrowthSince(before) < (uint64_t{96} << 20));
  CHECK(relay->stats().passed_through >= 6);  // a megabyte a read
  CHECK(endless.requests() <= 8);             // the probe, then one per megabyte
  CHECK(relay->stats().cached_blobs == 0);
  relay->Stop();
  std::filesystem::remove_all(options.cache_dir);
}

}  // namespace
}  // namespace weft::policy_store
