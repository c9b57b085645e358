#include "policy_store/retention.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "policy_store/directory_store.h"
#include "policy_store/reader.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::SameBytes;
using testing::TestRun;

TEST_CASE("retention deletes what no pinned version needs, and nothing else") {
  const std::string root = TempRoot("retention");
  auto store = std::move(DirectoryStore::Open(root)).value();
  TestRun run(*store, "run", 4);
  run.Start();
  for (int v = 1; v <= 12; ++v) run.Next();
  StoreReader reader(*store, "run", 1);
  CHECK(CollectGarbage(*store, "run", {13}, false).status().code() == StatusCode::kInvalidArgument);
  // Version 9 is pinned; it is rebuilt from the keyframe at 8, so 0..7 can go.
  auto dry = CollectGarbage(*store, "run", {9, 11}, true);
  REQUIRE(dry.ok());
  CHECK(dry->kept_from == 8);
  CHECK(dry->versions_deleted == 8);
  CHECK(dry->blobs_deleted > 8);
  CHECK(reader.Versions()->size() == 13);  // a dry run deletes nothing
  auto done = CollectGarbage(*store, "run", {9, 11}, false);
  REQUIRE(done.ok());
  CHECK(done->versions_deleted == dry->versions_deleted);
  CHECK(done->bytes_freed == dry->bytes_freed);
  CHECK(reader.Versions()->front() == 8);
  for (uint64_t target : {8, 9, 12}) {
    sync::ServedModel model;
    REQUIRE(reader.Pull(target, std::nullopt, &model).ok());
    CHECK(SameBytes(model, run.published[target]));
  }
  // A reader still holding a collected version falls back to the keyframe.
  sync::ServedModel old = run.published[5];
  auto report = reader.Pull(12, 5, &old);
  REQUIRE(report.ok());
  CHECK(report->path == "keyframe v12");  // 12 is itself a keyframe (interval 4)
  CHECK(SameBytes(old, run.published[12]));
  // Running it again finds nothing more to delete.
  CHECK(CollectGarbage(*store, "run", {9}, false)->versions_deleted == 0);
  CHECK(CollectGarbage(*store, "nothing", {}, false).status().code() == StatusCode::kNotFound);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
