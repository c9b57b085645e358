#include "policy_store/retention.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "policy_store/directory_store.h"
#include "policy_store/manifest.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
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

TEST_CASE("unpublished versions: found, finished as they are, or discarded") {
  const std::string root = TempRoot("unpublished");
  auto store = std::move(DirectoryStore::Open(root)).value();
  TestRun run(*store, "run", 4);
  run.Start();
  run.Next();
  run.Next();
  // A publisher that wrote version 2's manifest and died before moving latest: latest is 1.
  auto roll_back = [&] {
    REQUIRE(store->CompareAndSwap(LatestKey("run"), VersionText(2), VersionText(1)).ok());
  };
  roll_back();
  Unpublished found = FindUnpublished(*store, "run").value();
  CHECK(found.latest == 1);
  CHECK(found.manifests == std::vector<uint64_t>{2});
  CHECK(std::find(found.keys.begin(), found.keys.end(), ManifestKey("run", 2)) != found.keys.end());
  // Finished: latest moves to it, and it reads as published.
  CHECK(FinishUnpublished(*store, "run").value() == 2);
  CHECK(ReadLatest(*store, "run").value() == 2);
  StoreReader reader(*store, "run", 1);
  sync::ServedModel model;
  REQUIRE(reader.Pull(2, std::nullopt, &model).ok());
  CHECK(SameBytes(model, run.published[2]));
  CHECK(FindUnpublished(*store, "run")->keys.empty());
  CHECK(FinishUnpublished(*store, "run").status().code() == StatusCode::kNotFound);
  // Discarded: its objects go, latest stays, and nothing is left to finish.
  roll_back();
  Unpublished gone = DiscardUnpublished(*store, "run").value();
  CHECK(gone.keys == found.keys);
  CHECK(*reader.Versions() == std::vector<uint64_t>{0, 1});
  CHECK(ReadLatest(*store, "run").value() == 1);
  CHECK(FindUnpublished(*store, "run")->keys.empty());
  // A version whose blob is missing cannot be finished.
  run.last = reader.GetManifest(1).value();
  run.served = run.published[1];
  run.Next();
  roll_back();
  const Manifest two = reader.GetManifest(2).value();
  REQUIRE(store->Delete(BlobKey(two.Blobs().front().sha256)).ok());
  CHECK(FinishUnpublished(*store, "run").status().code() == StatusCode::kDataLoss);
  CHECK(ReadLatest(*store, "run").value() == 1);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
