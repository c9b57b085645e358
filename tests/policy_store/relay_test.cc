#include "policy_store/relay.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/concurrent.h"
#include "policy_store/reader.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

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
  CHECK(writer.PutImmutable("blobs/x", Bytes("x")).message().find("read-only") !=
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
  REQUIRE(origin->PutImmutable("runs/run/versions/a", Bytes("1")).ok());
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

}  // namespace
}  // namespace weft::policy_store
