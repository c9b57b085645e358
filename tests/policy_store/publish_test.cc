#include "policy_store/publish.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>

#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/pins.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::SameBytes;
using testing::TestRun;

using Dir = TestStore;

// Counts the blobs read through it: a publisher that keeps what it squashes reads none back.
class CountingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    if (key.rfind("blobs/", 0) == 0) blob_reads.fetch_add(1);
    return inner().Get(key);
  }
  std::atomic<int> blob_reads{0};
};

TEST_CASE("publish: a second publisher of the same version gets a conflict; a rerun completes") {
  Dir d("publish");
  TestRun run(*d.store, "run", 50);
  const Manifest base = run.Start();
  // Version 0 again, the same bytes: accepted (a rerun); other bytes: a conflict.
  CHECK(PublishVersion(*d.store, "run", nullptr, run.served, nullptr, run.policy).ok());
  run.Step();
  sync::ServedModel other = std::move(sync::ServedModel::FromMaster(run.Master(), {}, 1)).value();
  CHECK(PublishVersion(*d.store, "run", nullptr, other, nullptr, run.policy).status().code() ==
        StatusCode::kConflict);
  // Two writers racing for version 1 from the same state: the second one loses cleanly.
  sync::ServedModel a = run.served, b = run.served;
  run.Step();
  auto delta_a = a.Update(run.Master(), run.codec);
  run.Step();
  auto delta_b = b.Update(run.Master(), run.codec);
  REQUIRE(delta_a.ok());
  REQUIRE(delta_b.ok());
  REQUIRE(PublishVersion(*d.store, "run", &base, a, &*delta_a, run.policy).ok());
  CHECK(PublishVersion(*d.store, "run", &base, b, &*delta_b, run.policy).status().code() ==
        StatusCode::kConflict);
  // Rerunning the winner's publish (a publisher that died after writing) completes idempotently.
  CHECK(PublishVersion(*d.store, "run", &base, a, &*delta_a, run.policy).ok());
  StoreReader reader(*d.store, "run", 1);
  sync::ServedModel model;
  REQUIRE(reader.Pull(1, std::nullopt, &model).ok());
  CHECK(SameBytes(model, a));
  CHECK(PublishVersion(*d.store, "run", &base, a, nullptr, run.policy).status().code() ==
        StatusCode::kInvalidArgument);  // a version after the first needs its delta
}

TEST_CASE("publish: a publisher killed between its blobs and its pointer leaves the last version") {
  Dir d("publish");
  TestRun run(*d.store, "run", 50);
  run.Start();
  // Version 1's delta blob written, `latest` not yet moved: as if killed just before.
  sync::ServedModel next = run.served;
  run.Step();
  auto delta = next.Update(run.Master(), run.codec);
  REQUIRE(delta.ok());
  REQUIRE(PutBlob(*d.store, sync::SerializeModelDelta(*delta)).ok());
  StoreReader reader(*d.store, "run", 1);
  CHECK(*reader.Latest() == 0);
  sync::ServedModel model;
  REQUIRE(reader.Pull(*reader.Latest(), std::nullopt, &model).ok());
  CHECK(SameBytes(model, run.published[0]));
  // The restarted publisher completes version 1.
  run.Next();
  CHECK(*reader.Latest() == 1);
}

TEST_CASE(
    "publish: skip and catch-up deltas come from memory, byte for byte what the store gives") {
  // The same run published twice: once keeping the deltas it squashes, once reading them back.
  Dir kept("publish_kept"), read("publish_read");
  CountingStore counted(*kept.store);
  TestRun with(counted, "run", 8), without(*read.store, "run", 8);
  without.recent = RecentDeltas(0);  // holds nothing: every squash reads the store
  with.Start();
  without.Start();
  for (int v = 1; v <= 17; ++v) {
    if (v == 6) {
      for (ObjectStore* store : {static_cast<ObjectStore*>(kept.store.get()),
                                 static_cast<ObjectStore*>(read.store.get())}) {
        REQUIRE(SetPin(*store, "run", "reader-a", 3).ok());
        REQUIRE(SetPin(*store, "run", "reader-b", 5).ok());
      }
    }
    const Manifest a = with.Next(), b = without.Next();
    CHECK(a.ToJson() == b.ToJson());
  }
  CHECK(kept.Objects() == read.Objects());
  // Version 16 had skip deltas of spans 2, 4, 8 and 16, and every version after 5 catch-up deltas
  // for both pins: built from memory, the publisher read no blob back (the one catch-up built
  // from the chain of a new pin excepted).
  CHECK(ReadManifest(*kept.store, "run", 16)->skips.size() == 4);
  CHECK(!kept.store->List(CatchupPrefix("run", 17))->empty());
  CHECK(counted.blob_reads.load() <= 4);
  CHECK(with.recent.bytes() > 0);
}

TEST_CASE("publish: a whole model as the next version of a run") {
  Dir d("publish");
  TestRun run(*d.store, "run", 50);
  sync::ServedModel v0 = std::move(sync::ServedModel::FromMaster(run.Master(), {}, 1)).value();
  auto first = PublishModel(*d.store, "run", v0, run.policy, 1);
  REQUIRE(first.ok());
  CHECK(first->version == 0);
  CHECK(first->keyframe.has_value());
  run.Step();
  sync::ServedModel v1 = std::move(sync::ServedModel::FromMaster(run.Master(), {}, 1)).value();
  CHECK(PublishModel(*d.store, "run", v1, run.policy, 1, 3).status().message() ==
        "run 'run' is at version 0; the next version is 1, not 3");
  auto second = PublishModel(*d.store, "run", v1, run.policy, 1, 1);
  REQUIRE(second.ok());
  CHECK(second->version == 1);
  CHECK(second->delta.has_value());
  CHECK(!second->keyframe.has_value());
  sync::ServedModel pulled = v0;
  REQUIRE(StoreReader(*d.store, "run", 1).Pull(1, 0, &pulled).ok());
  CHECK(SameBytes(pulled, v1));
  // A model with other tensors is refused, naming the tensor.
  sync::ServedModel other = sync::ServedModel::FromTensors(
      {{"q", sync::DType::kBF16, {2}}, {"norm", sync::DType::kBF16, {300}}},
      {std::vector<uint8_t>(4), std::vector<uint8_t>(600)}, 1);
  Status refused = PublishModel(*d.store, "run", other, run.policy, 1).status();
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("tensor 'q' has a different dtype or shape") != std::string::npos);
  CHECK(refused.message().find("a different tensor set needs a new run") != std::string::npos);
  CHECK(PublishModel(*d.store, "../run", v1, run.policy, 1).status().code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::policy_store
