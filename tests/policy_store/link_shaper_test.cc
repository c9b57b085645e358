#include "policy_store/link_shaper.h"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>

#include "common/concurrent.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

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

}  // namespace
}  // namespace weft::policy_store
