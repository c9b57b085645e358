#include "policy_store/planner.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "policy_store/directory_store.h"
#include "policy_store/pins.h"
#include "policy_store/run_objects.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::TestRun;

TEST_CASE("planner: the path of fewest bytes over deltas, skip deltas, catch-ups and keyframes") {
  const std::string root = TempRoot("planner");
  auto store = std::move(DirectoryStore::Open(root)).value();
  TestRun run(*store, "run", 8);
  run.Start();
  for (int v = 1; v <= 7; ++v) run.Next();
  REQUIRE(SetPin(*store, "run", "w", 8).ok());  // a reader that will hold version 8
  for (int v = 8; v <= 12; ++v) run.Next();
  const Manifest twelve = *ReadManifest(*store, "run", 12);

  // From nothing: the keyframe at 8, then 8 -> 12 by the skip delta of span 4.
  auto fresh = PlanPath(*store, "run", twelve, std::nullopt, true);
  REQUIRE(fresh.ok());
  CHECK(fresh->from_keyframe);
  CHECK(fresh->start == 8);
  REQUIRE(fresh->steps.size() == 1);
  CHECK(fresh->steps[0].base == 8);
  CHECK(fresh->Describe() == "keyframe v8 + 1 delta");
  // From 8, pinned: the catch-up delta 8 -> 12 is one blob, no larger than the skip delta.
  auto pinned = PlanPath(*store, "run", twelve, 8, true);
  REQUIRE(pinned.ok());
  CHECK(!pinned->from_keyframe);
  REQUIRE(pinned->steps.size() == 1);
  CHECK(pinned->Describe().find("from v8") != std::string::npos);
  // From 11: one plain delta.
  auto behind = PlanPath(*store, "run", twelve, 11, false);
  REQUIRE(behind.ok());
  CHECK(behind->Describe() == "1 delta from v11");
  CHECK(behind->steps[0].blob.sha256 == twelve.delta->sha256);
  // At the target already.
  CHECK(PlanPath(*store, "run", twelve, 12, false)->Describe() == "already at the target");
  // Deltas only need a start; a chain that does not exist is data loss.
  CHECK(PlanPath(*store, "run", twelve, std::nullopt, false).status().code() ==
        StatusCode::kInvalidArgument);
  REQUIRE(store->Delete(BlobKey(twelve.delta->sha256)).ok());  // blobs are not read by the plan
  Manifest broken = twelve;
  broken.delta.reset();
  broken.skips.clear();
  CHECK(PlanPath(*store, "run", broken, 11, false).status().code() == StatusCode::kDataLoss);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
