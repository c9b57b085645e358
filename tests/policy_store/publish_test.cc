#include "policy_store/publish.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

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
  CHECK(first->has_keyframe());
  run.Step();
  sync::ServedModel v1 = std::move(sync::ServedModel::FromMaster(run.Master(), {}, 1)).value();
  CHECK(PublishModel(*d.store, "run", v1, run.policy, 1, 3).status().message() ==
        "run 'run' is at version 0; the next version is 1, not 3");
  auto second = PublishModel(*d.store, "run", v1, run.policy, 1, 1);
  REQUIRE(second.ok());
  CHECK(second->version == 1);
  CHECK(second->delta.has_value());
  CHECK(!second->has_keyframe());
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

// Logs the blobs read through it (every key, with the bytes it returned), and can damage the next
// reads of one blob: a flipped byte, or the last byte cut off.
class ReadLog : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    Result<std::vector<uint8_t>> bytes = inner().Get(key);
    std::lock_guard<std::mutex> lock(mutex);
    if (!bytes.ok() || key.rfind("blobs/", 0) != 0) return bytes;
    blob_bytes[key] += bytes->size();
    if (key == damage_key && damage > 0 && !bytes->empty()) {
      --damage;
      if (cut)
        bytes->pop_back();
      else
        (*bytes)[bytes->size() / 3] ^= 0x10;
    }
    return bytes;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mutex);
    blob_bytes.clear();
  }

  std::mutex mutex;
  std::map<std::string, uint64_t> blob_bytes;  // bytes read, by blob key
  std::string damage_key;
  int damage = 0;
  bool cut = false;
};

TEST_CASE("publish: a keyframe in per-rank parts, which the committing rank never reads") {
  Dir d("publish");
  ReadLog log(*d.store);
  // Four ranks, each holding some of the tensors; a keyframe every other version.
  TestRun run(*d.store, "run", 2,
              {{"embed", {64, 100}},
               {"q", {48, 64}},
               {"k", {48, 64}},
               {"norm", {300}},
               {"out", {100, 64}}});
  const std::vector<std::vector<size_t>> owned = {{0}, {1, 2}, {3}, {4}};
  const uint64_t world = owned.size();
  auto shard_master = [&](size_t rank) {
    const std::vector<sync::MasterTensor> all = run.Master();
    std::vector<sync::MasterTensor> master;
    for (size_t t : owned[rank]) master.push_back(all[t]);
    return master;
  };
  std::vector<sync::ServedModel> shards;
  for (size_t r = 0; r < world; ++r)
    shards.push_back(std::move(sync::ServedModel::FromMaster(shard_master(r), {}, 1)).value());
  std::vector<Manifest> committed;
  std::vector<std::optional<sync::ModelDelta>> deltas(world);  // each rank's last delta
  auto publish_part = [&](size_t r) {
    const Manifest* previous = committed.empty() ? nullptr : &committed.back();
    REQUIRE(PublishShard(*d.store, "run", previous, r, world, shards[r],
                         deltas[r] ? &*deltas[r] : nullptr, run.policy)
                .ok());
  };
  RecentDeltas recent;  // what rank 0 squashes skip deltas from, as a publisher keeps it
  auto commit = [&] {
    log.Clear();
    return CommitShards(log, "run", committed.empty() ? nullptr : &committed.back(), world,
                        run.policy, 1, std::chrono::milliseconds(200), &recent);
  };
  // Every rank publishes its part of the next version (`skip`: one that does not), then rank 0
  // commits through the read log. Returns the commit's result.
  auto publish = [&](std::optional<size_t> skip) -> Result<Manifest> {
    for (size_t r = 0; r < world; ++r) {
      if (!committed.empty()) {
        Result<sync::ModelDelta> made = shards[r].Update(shard_master(r), run.codec);
        REQUIRE(made.ok());
        deltas[r] = std::move(*made);
      }
      if (skip != r) publish_part(r);
    }
    return commit();
  };
  auto whole = [&] {
    return std::move(sync::ServedModel::FromMaster(run.Master(), {}, 1)).value();
  };
  for (int v = 0; v <= 4; ++v) {
    if (v > 0) run.Step();
    Result<Manifest> manifest = publish(std::nullopt);
    REQUIRE_MESSAGE(manifest.ok(), manifest.status().ToString());
    committed.push_back(*manifest);
    // The keyframe is the ranks' keyframes, in rank order, as its parts: not one byte of them was
    // read. The deltas were (they are merged), and nothing else.
    std::set<std::string> deltas;
    for (size_t r = 0; r < world; ++r) {
      const Manifest part = std::move(ReadPart(*d.store, ShardKey("run", v, r, world))).value();
      if (v % 2 == 0) {
        REQUIRE(manifest->keyframe.size() == world);
        CHECK(manifest->keyframe[r].sha256 == part.keyframe.front().sha256);
      }
      if (part.delta) deltas.insert(BlobKey(part.delta->sha256));
    }
    if (v % 2 != 0) CHECK(!manifest->has_keyframe());
    for (const auto& read : log.blob_bytes)
      CHECK_MESSAGE(deltas.count(read.first) == 1, read.first);
  }
  // The manifest of a keyframe in parts is format version 2; a reader pulls it from nothing,
  // part by part, and lands on the whole model.
  const std::vector<uint8_t> text = std::move(d.store->Get(ManifestKey("run", 4))).value();
  CHECK(std::string(text.begin(), text.end()).find("weft.manifest.v2") != std::string::npos);
  const sync::ServedModel expected = whole();
  StoreReader reader(log, "run", 2);
  sync::ServedModel model;
  Result<PullReport> pulled = reader.Pull(4, std::nullopt, &model);
  REQUIRE_MESSAGE(pulled.ok(), pulled.status().ToString());
  CHECK(pulled->path == "keyframe v4 (4 parts)");
  CHECK(pulled->fetched.size() == world);
  CHECK(SameBytes(model, expected));
  // From a copy of version 1: the deltas.
  sync::ServedModel held;
  REQUIRE(reader.Pull(1, std::nullopt, &held).ok());
  REQUIRE(reader.Pull(4, 1, &held).ok());
  CHECK(SameBytes(held, expected));

  // A part damaged on every read: the pull fails naming it, and the copy held is unchanged. Cut
  // short once: fetched again, and the pull succeeds.
  const std::string part3 = BlobKey(committed.back().keyframe[2].sha256);
  for (bool cut : {false, true}) {
    log.damage_key = part3;
    log.cut = cut;
    log.damage = cut ? 1 : 100;
    sync::ServedModel copy = held;
    Result<PullReport> damaged = reader.Pull(4, std::nullopt, &copy);
    if (cut) {
      REQUIRE_MESSAGE(damaged.ok(), damaged.status().ToString());
      CHECK(SameBytes(copy, expected));
    } else {
      CHECK(damaged.status().code() == StatusCode::kDataLoss);
      CHECK(damaged.status().message().find("keyframe of version 4, part 3 of 4") !=
            std::string::npos);
      CHECK(SameBytes(copy, held));
    }
    log.damage = 0;
  }

  // A rank killed while writing its part (its keyframe blob written, its part manifest not): the
  // commit times out naming it and `latest` stays; rerun, the rank completes its part, and the
  // commit goes through.
  run.Step();
  Result<Manifest> five = publish(std::nullopt);
  REQUIRE(five.ok());
  committed.push_back(*five);
  run.Step();
  Result<Manifest> stuck = publish(2);
  CHECK(stuck.status().code() == StatusCode::kTimeout);
  CHECK_MESSAGE(stuck.status().message().find("ranks 2 of 4") != std::string::npos,
                stuck.status().ToString());
  REQUIRE(PutBlob(*d.store, std::move(KeyframeBytes(shards[2])).value()).ok());
  CHECK(*reader.Latest() == 5);
  publish_part(2);
  Result<Manifest> six = commit();
  REQUIRE_MESSAGE(six.ok(), six.status().ToString());
  CHECK(six->keyframe.size() == world);
  sync::ServedModel fresh;
  REQUIRE(reader.Pull(6, std::nullopt, &fresh).ok());
  CHECK(SameBytes(fresh, whole()));
  REQUIRE(reader.Pull(6, 4, &held).ok());
  CHECK(SameBytes(held, whole()));
}

}  // namespace
}  // namespace weft::policy_store
