#include "policy_store/catchup_deltas.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "common/byte_io.h"
#include "policy_store/directory_store.h"
#include "policy_store/pins.h"
#include "policy_store/reader.h"
#include "policy_store/retention.h"
#include "policy_store/run_objects.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::SameBytes;
using testing::TestRun;

TEST_CASE(
    "catch-up deltas: a pinned reader downloads one delta, the squash of everything it missed") {
  const std::string root = TempRoot("catchup");
  auto store = std::move(DirectoryStore::Open(root)).value();
  TestRun run(*store, "run", 100);
  run.Start();
  std::vector<LoadedDelta> plain;  // the deltas v-1 -> v, for the reference squash
  StoreReader reader(*store, "run", 1);
  for (int v = 1; v <= 12; ++v) {
    if (v == 3) {
      REQUIRE(SetPin(*store, "run", "worker-a", 2).ok());
      REQUIRE(SetPin(*store, "run", "worker-b", 2).ok());  // two holders, one base
    }
    if (v == 8) REQUIRE(SetPin(*store, "run", "worker-c", 5).ok());  // a new pin: from the chain
    run.Next();
    plain.push_back(std::move(FetchDelta(*store, *run.last.delta, "delta")).value());
  }
  auto squash_size = [&](int from, int to) {
    sync::ModelDelta squashed = plain[from].delta.Copy();
    for (int v = from + 2; v <= to; ++v) {
      squashed = std::move(sync::SquashModelDeltas(squashed, plain[v - 1].delta, 1)).value();
    }
    return sync::SerializedSize(squashed);
  };
  for (int base : {2, 5}) {
    sync::ServedModel model = run.published[base];
    auto report = reader.Pull(12, base, &model);
    REQUIRE(report.ok());
    CHECK(report->path == "1 catch-up delta from v" + std::to_string(base));
    CHECK(report->bytes_downloaded == squash_size(base, 12));
    CHECK(SameBytes(model, run.published[12]));
  }
  // An unpinned version has none and takes skip deltas.
  sync::ServedModel unpinned = run.published[3];
  auto report = reader.Pull(12, 3, &unpinned);
  REQUIRE(report.ok());
  CHECK(report->path.find("catch-up") == std::string::npos);
  CHECK(SameBytes(unpinned, run.published[12]));
  // A corrupted catch-up record is ignored; the reader plans around it.
  const std::string record = CatchupKey("run", 12, 5);
  REQUIRE(store->Delete(record).ok());
  const std::string junk = "{\"format\": 1}";
  REQUIRE(store->PutImmutable(record, TextBytes(junk)).ok());
  sync::ServedModel from_five = run.published[5];
  REQUIRE(reader.Pull(12, 5, &from_five).ok());
  CHECK(SameBytes(from_five, run.published[12]));
  // Pins in the store hold back retention; stale catch-up deltas are collected.
  auto collected = CollectGarbage(*store, "run", {}, false);
  REQUIRE(collected.ok());
  CHECK(collected->kept_from == 0);  // worker-a and worker-b hold version 2, from keyframe 0
  CHECK(store->List(CatchupPrefix("run", 11))->empty());
  CHECK(store->List(CatchupPrefix("run", 12))->size() == 1);  // from 2; the junk one went too
  std::filesystem::remove_all(root);
}

TEST_CASE("catch-up deltas: none for readers one version behind, too far behind, or past the cap") {
  const std::string root = TempRoot("catchup_limits");
  auto store = std::move(DirectoryStore::Open(root)).value();
  TestRun run(*store, "run", 100);
  run.policy.max_catchup_bases = 1;
  run.policy.max_catchup_lag = 4;
  run.Start();
  for (int v = 1; v <= 6; ++v) run.Next();
  REQUIRE(SetPin(*store, "run", "behind-one", 6).ok());
  REQUIRE(SetPin(*store, "run", "far", 1).ok());    // 7 - 1 > max_catchup_lag
  REQUIRE(SetPin(*store, "run", "near", 4).ok());   // newest first, and the cap is one
  REQUIRE(SetPin(*store, "run", "older", 3).ok());  // past the cap
  run.Next();
  std::vector<std::string> written = *store->List(CatchupPrefix("run", 7));
  REQUIRE(written.size() == 1);
  CHECK(written[0] == CatchupKey("run", 7, 4));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
