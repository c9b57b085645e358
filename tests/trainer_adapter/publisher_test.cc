#include "trainer_adapter/publisher.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/reader.h"
#include "policy_store/retention.h"
#include "policy_store/store_server.h"

namespace weft::trainer_adapter {
namespace {

using policy_store::StoreReader;

struct Fixture {
  std::string root;
  std::unique_ptr<policy_store::DirectoryStore> store;
  examples::SyntheticAdam adam;

  Fixture()
      : root((std::filesystem::temp_directory_path() / ("weft_pub_" + std::to_string(getpid())))
                 .string()),
        adam({{"q", {64, 300}}, {"norm", {300}}}, Config(), 5, 1) {
    std::filesystem::remove_all(root);
    store = std::move(policy_store::DirectoryStore::Open(root)).value();
    for (int i = 0; i < 3; ++i) adam.Step(1);
  }
  ~Fixture() { std::filesystem::remove_all(root); }

  static examples::AdamConfig Config() {
    examples::AdamConfig config;
    config.learning_rate = 3e-6;
    return config;
  }
  std::vector<sync::MasterTensor> Master() { return examples::MasterView(adam); }
};

PublisherOptions Options(uint64_t interval) {
  PublisherOptions options;
  options.keyframes.interval = interval;
  options.keyframes.delta_budget = 100.0;  // keyframes by interval only, for predictable tests
  options.codec = sync::CodecOptions{10, 1};
  return options;
}

bool SameBytes(const sync::ServedModel& a, const sync::ServedModel& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (const auto& t : a.tensors()) {
    const auto* other = b.Find(t.spec.name);
    if (other == nullptr || other->bytes != t.bytes || other->digest != t.digest) return false;
  }
  return true;
}

TEST_CASE("publisher: every version a delta of the served state, proven by its digests") {
  Fixture f;
  auto publisher = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(4));
  REQUIRE(publisher.ok());
  CHECK((*publisher)->last().version == 0);
  CHECK((*publisher)->last().has_keyframe());
  // Version 0 writes everything: its stats say so.
  const PublishStats first = (*publisher)->last_stats();
  CHECK(first.version == 0);
  CHECK(first.elements == (*publisher)->served().element_count());
  CHECK(first.changed_elements == first.elements);
  CHECK(first.bytes_written == (*publisher)->last().keyframe_bytes());
  StoreReader reader(*f.store, "run", 1);
  sync::ServedModel replica;
  REQUIRE(reader.Pull(0, std::nullopt, &replica).ok());
  for (uint64_t v = 1; v <= 6; ++v) {
    f.adam.Step(1);
    auto manifest = (*publisher)->Publish(f.Master());
    REQUIRE(manifest.ok());
    CHECK(manifest->version == v);
    CHECK(manifest->delta_base == std::optional<uint64_t>(v - 1));
    const policy_store::Manifest held = *reader.GetManifest(v - 1);
    auto report = reader.Pull(v, v - 1, &replica, &held);
    REQUIRE(report.ok());
    CHECK(report->path == "1 delta from v" + std::to_string(v - 1));
    CHECK(SameBytes(replica, (*publisher)->served()));
    // The stats: the delta's bytes (and a keyframe's, every 4 versions), and a count of changed
    // elements that is neither none nor all.
    const PublishStats& stats = (*publisher)->last_stats();
    CHECK(stats.version == v);
    uint64_t blobs = manifest->delta->bytes + manifest->keyframe_bytes();
    for (const policy_store::SkipDelta& skip : manifest->skips) blobs += skip.blob.bytes;
    CHECK(stats.bytes_written == blobs);
    CHECK(stats.changed_elements > 0);
    CHECK(stats.changed_elements < stats.elements);
    CHECK(stats.density() > 0.0);
    CHECK(stats.seconds > 0.0);
  }
  // Masters that do not match the run are refused, and the publisher can go on.
  CHECK(!(*publisher)->Publish({{"other", {3}, std::vector<float>(3)}}).ok());
  f.adam.Step(1);
  CHECK((*publisher)->Publish(f.Master())->version == 7);
}

// Fails every write while `failing` holds.
class FailingStore : public policy_store::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override {
    if (failing) return Unavailable("the store is down");
    return inner().PutImmutable(key, bytes);
  }
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override {
    if (failing) return Unavailable("the store is down");
    return inner().CompareAndSwap(key, std::move(expected), desired);
  }
  bool failing = false;
};

TEST_CASE("publisher: a failed publish is retried from the last version published, in place") {
  Fixture f;
  FailingStore store(*f.store);
  auto publisher =
      std::move(Publisher::Start(store, "r", f.Master(), sync::ServingPlan{}, Options(100)))
          .value();
  StoreReader reader(*f.store, "r", 1);
  sync::ServedModel copy;
  REQUIRE(reader.Pull(0, std::nullopt, &copy).ok());

  // Down for one publish, retried with the same weights: the same version, as if nothing failed.
  f.adam.Step(1);
  store.failing = true;
  Result<policy_store::Manifest> failed = publisher->Publish(f.Master());
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  CHECK(publisher->last().version == 0);
  CHECK(*reader.Latest() == 0);
  store.failing = false;
  REQUIRE(publisher->Publish(f.Master()).ok());
  CHECK(publisher->last().version == 1);
  REQUIRE(reader.Pull(1, 0, &copy).ok());
  CHECK(SameBytes(copy, publisher->served()));

  // Down for two steps' publishes: the third goes out as one version from the last published,
  // the three steps' deltas squashed.
  for (int step = 0; step < 2; ++step) {
    f.adam.Step(1);
    store.failing = true;
    CHECK(!publisher->Publish(f.Master()).ok());
  }
  store.failing = false;
  f.adam.Step(1);
  REQUIRE(publisher->Publish(f.Master()).ok());
  CHECK(publisher->last().version == 2);
  REQUIRE(reader.Pull(2, 1, &copy).ok());
  CHECK(SameBytes(copy, publisher->served()));
  // And the served copy is the masters' conversion, as a fresh start would make it.
  auto fresh = sync::ServedModel::FromMaster(f.Master(), sync::ServingPlan{}, 1);
  REQUIRE(fresh.ok());
  CHECK(SameBytes(*fresh, publisher->served()));

  // A publish refused before anything changes (a tensor it does not serve) leaves it as it was.
  std::vector<sync::MasterTensor> wrong = f.Master();
  wrong.back().name = "unknown";
  CHECK(publisher->Publish(wrong).status().code() == StatusCode::kInvalidArgument);
  CHECK(SameBytes(*fresh, publisher->served()));
}

TEST_CASE("publisher: a second publisher of the same run gets a conflict") {
  Fixture f;
  auto first = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50));
  REQUIRE(first.ok());
  CHECK(Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50))
            .status()
            .code() == StatusCode::kConflict);
  PublisherOptions bad = Options(50);
  bad.rank = 2;
  bad.world = 2;
  CHECK(Publisher::Start(*f.store, "other", f.Master(), sync::ServingPlan{}, bad).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE(
    "publisher: sharded trainers, each rank publishing its tensors, the parts form one version") {
  // Three ranks over a store server, each holding some of the tensors of one model; a single
  // unsharded publisher of the whole model in another run is the reference.
  Fixture f;
  examples::SyntheticAdam adam({{"a", {64, 300}}, {"b", {300}}, {"c", {40, 70}}, {"d", {128}}},
                               Fixture::Config(), 9, 1);
  for (int i = 0; i < 3; ++i) adam.Step(1);
  auto master_of = [&](std::vector<size_t> which) {
    std::vector<sync::MasterTensor> master;
    for (size_t t : which)
      master.push_back({adam.tensor(t).name, adam.tensor(t).shape, adam.weights(t)});
    return master;
  };
  const std::vector<std::vector<size_t>> ranks = {{0}, {1, 2}, {3}};
  policy_store::StoreServerOptions server_options;
  server_options.writer_token = "token";
  server_options.threads = 4;
  auto server = std::move(policy_store::StoreServer::Start(*f.store, server_options)).value();
  const std::string url = "http://127.0.0.1:" + std::to_string(server->port());
  auto whole = std::move(Publisher::Start(*f.store, "whole", master_of({0, 1, 2, 3}),
                                          sync::ServingPlan{}, Options(3)))
                   .value();
  std::vector<std::unique_ptr<policy_store::HttpStore>> links;
  std::vector<std::unique_ptr<Publisher>> publishers(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    links.push_back(std::make_unique<policy_store::HttpStore>(url, "token"));
  auto all_ranks = [&](const std::function<Status(size_t)>& step) {
    std::vector<Status> results(ranks.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks.size(); ++r)
      threads.emplace_back([&, r] { results[r] = step(r); });
    for (auto& thread : threads) thread.join();
    for (const Status& status : results) REQUIRE_MESSAGE(status.ok(), status.message());
  };
  all_ranks([&](size_t r) {
    PublisherOptions options = Options(3);
    options.rank = r;
    options.world = ranks.size();
    options.shard_deadline = std::chrono::milliseconds(20000);
    auto started =
        Publisher::Start(*links[r], "sharded", master_of(ranks[r]), sync::ServingPlan{}, options);
    if (started.ok()) publishers[r] = std::move(*started);
    return started.status();
  });
  for (int v = 1; v <= 7; ++v) {
    adam.Step(1);
    REQUIRE(whole->Publish(master_of({0, 1, 2, 3})).ok());
    all_ranks([&](size_t r) { return publishers[r]->Publish(master_of(ranks[r])).status(); });
    for (const auto& publisher : publishers)
      CHECK(publisher->last().version == static_cast<uint64_t>(v));
  }
  // The sharded run holds the same versions as the whole one: keyframes at 0, 3, 6, deltas and
  // skips between; a reader pulls them the usual way, from nothing or from an older copy.
  StoreReader sharded(*f.store, "sharded", 1);
  StoreReader reference(*f.store, "whole", 1);
  CHECK(*sharded.Latest() == 7);
  // Each keyframe is the three ranks' keyframes, as its parts.
  for (uint64_t v : {0, 3, 6}) CHECK(sharded.GetManifest(v)->keyframe.size() == 3);
  CHECK(!sharded.GetManifest(5)->has_keyframe());
  CHECK(sharded.GetManifest(4)->skips.size() == 2);
  sync::ServedModel expected;
  REQUIRE(reference.Pull(7, std::nullopt, &expected).ok());
  sync::ServedModel model;
  REQUIRE(sharded.Pull(7, std::nullopt, &model).ok());
  CHECK(SameBytes(model, expected));
  sync::ServedModel from_two;
  REQUIRE(sharded.Pull(2, std::nullopt, &from_two).ok());
  REQUIRE(sharded.Pull(7, 2, &from_two).ok());
  CHECK(SameBytes(from_two, expected));
  // Committed parts are garbage; parts of a version not yet committed are not.
  const std::string prefix = "runs/sharded/shards/";
  sync::ServedModel part =
      sync::ServedModel::FromTensors({publishers[0]->served().tensors()[0].spec},
                                     {publishers[0]->served().tensors()[0].bytes.ToVector()}, 1);
  sync::ModelDelta no_change;
  REQUIRE(policy_store::PublishShard(*f.store, "sharded", &publishers[0]->last(), 0, 3, part,
                                     &no_change, Options(3).keyframes)
              .ok());
  auto collected = policy_store::CollectGarbage(*f.store, "sharded", {}, false);
  REQUIRE(collected.ok());
  CHECK(f.store->List(prefix)->size() == 1);
  // A commit whose ranks never arrive times out naming them.
  auto stuck = policy_store::CommitShards(*f.store, "sharded", &publishers[0]->last(), 3,
                                          Options(3).keyframes, 1, std::chrono::milliseconds(100));
  CHECK(stuck.status().code() == StatusCode::kTimeout);
  CHECK(stuck.status().message().find("ranks 1, 2 of 3") != std::string::npos);
  sync::ServedModel after_gc;
  REQUIRE(sharded.Pull(7, std::nullopt, &after_gc).ok());
  CHECK(SameBytes(after_gc, expected));
  server->Stop();
}

}  // namespace
}  // namespace weft::trainer_adapter
