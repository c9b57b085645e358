#include "trainer_adapter/publisher.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/pins.h"
#include "policy_store/reader.h"
#include "policy_store/retention.h"
#include "policy_store/run_objects.h"
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

TEST_CASE("publish versions, then pull any of them from nothing or from an older copy") {
  Fixture f;
  auto publisher = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(4));
  REQUIRE(publisher.ok());
  std::vector<sync::ServedModel> published = {(*publisher)->served()};
  for (int v = 1; v <= 9; ++v) {
    f.adam.Step(1);
    auto manifest = (*publisher)->Publish(f.Master());
    REQUIRE(manifest.ok());
    CHECK(manifest->version == static_cast<uint64_t>(v));
    CHECK(manifest->keyframe.has_value() == (v % 4 == 0));
    CHECK(manifest->last_keyframe == static_cast<uint64_t>(v - v % 4));
    published.push_back((*publisher)->served());
  }
  StoreReader reader(*f.store, "run", 1);
  CHECK(*reader.Latest() == 9);
  CHECK(reader.Versions()->size() == 10);
  for (uint64_t target : {0, 3, 4, 7, 9}) {
    sync::ServedModel model;
    auto report = reader.Pull(target, std::nullopt, &model);
    REQUIRE(report.ok());
    CHECK(SameBytes(model, published[target]));
    CHECK(report->path.rfind("keyframe v" + std::to_string(target - target % 4), 0) == 0);
  }
  // From version 6 to 9: the skip delta 6 -> 8 and the delta 8 -> 9 beat the keyframe at 8, and
  // cost less than the plain chain 6 -> 7 -> 8 -> 9.
  sync::ServedModel model = published[6];
  auto report = reader.Pull(9, 6, &model);
  REQUIRE(report.ok());
  CHECK(report->path == "2 deltas from v6");
  CHECK(SameBytes(model, published[9]));
  uint64_t chain = 0;
  for (uint64_t v = 7; v <= 9; ++v) chain += reader.GetManifest(v)->delta->bytes;
  CHECK(report->bytes_downloaded < chain);
  // Skip deltas exist where the version is divisible by their span.
  auto eight = reader.GetManifest(8);
  REQUIRE(eight->skips.size() == 3);
  CHECK(eight->skips[0].base == 6);
  CHECK(eight->skips[1].base == 4);
  CHECK(eight->skips[2].base == 0);
  CHECK(reader.GetManifest(7)->skips.empty());
  CHECK(*reader.IdentifyVersion(published[5]) == std::optional<uint64_t>(5));
  CHECK(reader.Pull(2, 6, &model).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a corrupted blob is detected and nothing reaches the caller") {
  Fixture f;
  auto publisher = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50));
  REQUIRE(publisher.ok());
  sync::ServedModel v0 = (*publisher)->served();
  f.adam.Step(1);
  auto manifest = (*publisher)->Publish(f.Master());
  REQUIRE(manifest.ok());
  // Flip a byte of the version-1 delta on disk.
  std::string path = f.root + "/blobs/" + manifest->delta->sha256;
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(40);
    file.put('\x5A');
  }
  StoreReader reader(*f.store, "run", 1);
  sync::ServedModel model = v0;
  auto report = reader.Pull(1, 0, &model);
  CHECK(report.status().code() == StatusCode::kDataLoss);
  CHECK(report.status().message().find("corrupted") != std::string::npos);
  CHECK(SameBytes(model, v0));
}

TEST_CASE(
    "a second publisher of the same run or version gets a conflict, the store stays readable") {
  Fixture f;
  auto first = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50));
  REQUIRE(first.ok());
  CHECK(Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50))
            .status()
            .code() == StatusCode::kConflict);
  // Two writers racing for version 1 from the same state: the second one loses cleanly.
  sync::ServedModel a = (*first)->served(), b = (*first)->served();
  f.adam.Step(1);
  auto delta_a = a.Update(f.Master(), sync::CodecOptions{10, 1});
  f.adam.Step(1);
  auto delta_b = b.Update(f.Master(), sync::CodecOptions{10, 1});
  REQUIRE(delta_a.ok());
  REQUIRE(delta_b.ok());
  const policy_store::Manifest base = (*first)->last();
  REQUIRE(policy_store::PublishVersion(*f.store, "run", &base, a, &*delta_a, {}).ok());
  CHECK(policy_store::PublishVersion(*f.store, "run", &base, b, &*delta_b, {}).status().code() ==
        StatusCode::kConflict);
  // Rerunning the winner's publish (a publisher that died after writing) completes idempotently.
  CHECK(policy_store::PublishVersion(*f.store, "run", &base, a, &*delta_a, {}).ok());
  StoreReader reader(*f.store, "run", 1);
  sync::ServedModel model;
  REQUIRE(reader.Pull(1, std::nullopt, &model).ok());
  CHECK(SameBytes(model, a));
}

TEST_CASE("a publisher killed between its blobs and its pointer leaves the last version readable") {
  Fixture f;
  auto publisher = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(50));
  REQUIRE(publisher.ok());
  // Version 1's blobs and manifest written, `latest` not yet moved: as if killed just before.
  sync::ServedModel next = (*publisher)->served();
  f.adam.Step(1);
  auto delta = next.Update(f.Master(), sync::CodecOptions{10, 1});
  REQUIRE(delta.ok());
  auto bytes = sync::SerializeModelDelta(*delta);
  REQUIRE(f.store->PutImmutable(policy_store::BlobKey(policy_store::Sha256Hex(bytes)), bytes).ok());
  StoreReader reader(*f.store, "run", 1);
  CHECK(*reader.Latest() == 0);
  sync::ServedModel model;
  REQUIRE(reader.Pull(*reader.Latest(), std::nullopt, &model).ok());
  CHECK(SameBytes(model, (*publisher)->served()));
  // The restarted publisher completes version 1.
  REQUIRE((*publisher)->Publish(f.Master()).ok());
  CHECK(*reader.Latest() == 1);
}

TEST_CASE("retention deletes what no pinned version needs, and nothing else") {
  Fixture f;
  auto publisher = Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(4));
  REQUIRE(publisher.ok());
  std::vector<sync::ServedModel> published = {(*publisher)->served()};
  for (int v = 1; v <= 12; ++v) {
    f.adam.Step(1);
    REQUIRE((*publisher)->Publish(f.Master()).ok());
    published.push_back((*publisher)->served());
  }
  StoreReader reader(*f.store, "run", 1);
  CHECK(policy_store::CollectGarbage(*f.store, "run", {13}, false).status().code() ==
        StatusCode::kInvalidArgument);
  // Version 9 is pinned; it is rebuilt from the keyframe at 8, so 0..7 can go.
  auto dry = policy_store::CollectGarbage(*f.store, "run", {9, 11}, true);
  REQUIRE(dry.ok());
  CHECK(dry->kept_from == 8);
  CHECK(dry->versions_deleted == 8);
  CHECK(dry->blobs_deleted > 8);
  CHECK(reader.Versions()->size() == 13);  // a dry run deletes nothing
  auto done = policy_store::CollectGarbage(*f.store, "run", {9, 11}, false);
  REQUIRE(done.ok());
  CHECK(done->versions_deleted == dry->versions_deleted);
  CHECK(done->bytes_freed == dry->bytes_freed);
  CHECK(reader.Versions()->front() == 8);
  for (uint64_t target : {8, 9, 12}) {
    sync::ServedModel model;
    REQUIRE(reader.Pull(target, std::nullopt, &model).ok());
    CHECK(SameBytes(model, published[target]));
  }
  // A reader still holding a collected version falls back to the keyframe.
  sync::ServedModel old = published[5];
  auto report = reader.Pull(12, 5, &old);
  REQUIRE(report.ok());
  CHECK(report->path == "keyframe v12");  // 12 is itself a keyframe (interval 4)
  CHECK(SameBytes(old, published[12]));
  // Running it again finds nothing more to delete.
  CHECK(policy_store::CollectGarbage(*f.store, "run", {9}, false)->versions_deleted == 0);
}

TEST_CASE("publish and pull through a store server over HTTP") {
  Fixture f;
  policy_store::StoreServerOptions server_options;
  server_options.writer_token = "token";
  auto server = policy_store::StoreServer::Start(*f.store, server_options);
  REQUIRE(server.ok());
  policy_store::HttpStore remote("http://127.0.0.1:" + std::to_string((*server)->port()), "token");
  auto publisher = Publisher::Start(remote, "run", f.Master(), sync::ServingPlan{}, Options(3));
  REQUIRE(publisher.ok());
  std::vector<sync::ServedModel> published = {(*publisher)->served()};
  for (int v = 1; v <= 5; ++v) {
    f.adam.Step(1);
    REQUIRE((*publisher)->Publish(f.Master()).ok());
    published.push_back((*publisher)->served());
  }
  StoreReader reader(remote, "run", 1);
  sync::ServedModel model;
  REQUIRE(reader.Pull(5, std::nullopt, &model).ok());
  CHECK(SameBytes(model, published[5]));
  sync::ServedModel older = published[4];
  auto report = reader.Pull(5, 4, &older);
  REQUIRE(report.ok());
  CHECK(report->path == "1 delta from v4");
  CHECK(SameBytes(older, published[5]));
  (*server)->Stop();
}

TEST_CASE("sharded trainers: each rank publishes its tensors, the parts form one version") {
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
  for (uint64_t v : {0, 3, 6}) CHECK(sharded.GetManifest(v)->keyframe.has_value());
  CHECK(!sharded.GetManifest(5)->keyframe.has_value());
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
  sync::ServedModel part = sync::ServedModel::FromTensors(
      {publishers[0]->served().tensors()[0].spec}, {publishers[0]->served().tensors()[0].bytes}, 1);
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

TEST_CASE(
    "catch-up deltas: a pinned reader downloads one delta, the squash of everything it missed") {
  Fixture f;
  auto publisher =
      std::move(Publisher::Start(*f.store, "run", f.Master(), sync::ServingPlan{}, Options(100)))
          .value();
  std::vector<sync::ServedModel> published = {publisher->served()};
  std::vector<std::vector<uint8_t>> plain;  // delta blobs v-1 -> v, for the reference squash
  StoreReader reader(*f.store, "run", 1);
  for (int v = 1; v <= 12; ++v) {
    if (v == 3) {
      REQUIRE(policy_store::SetPin(*f.store, "run", "worker-a", 2).ok());
      REQUIRE(policy_store::SetPin(*f.store, "run", "worker-b", 2).ok());  // two holders, one base
    }
    if (v == 8)
      REQUIRE(policy_store::SetPin(*f.store, "run", "worker-c", 5)
                  .ok());  // a new pin: built from the chain
    f.adam.Step(1);
    REQUIRE(publisher->Publish(f.Master()).ok());
    published.push_back(publisher->served());
    plain.push_back(
        std::move(policy_store::FetchVerifiedBlob(*f.store, *reader.GetManifest(v)->delta, "delta"))
            .value());
  }
  auto squash_size = [&](int from, int to) {
    std::optional<sync::ModelDelta> squashed;
    for (int v = from + 1; v <= to; ++v) {
      auto d = std::move(sync::ParseModelDelta(plain[v - 1])).value();
      squashed =
          squashed ? std::move(sync::SquashModelDeltas(*squashed, d, 1)).value() : std::move(d);
    }
    return sync::SerializedSize(*squashed);
  };
  for (int base : {2, 5}) {
    sync::ServedModel model = published[base];
    auto report = reader.Pull(12, base, &model);
    REQUIRE(report.ok());
    CHECK(report->path == "1 catch-up delta from v" + std::to_string(base));
    CHECK(report->bytes_downloaded == squash_size(base, 12));
    CHECK(SameBytes(model, published[12]));
  }
  // An unpinned version has none and takes skip deltas.
  sync::ServedModel unpinned = published[3];
  auto report = reader.Pull(12, 3, &unpinned);
  REQUIRE(report.ok());
  CHECK(report->path.find("catch-up") == std::string::npos);
  CHECK(SameBytes(unpinned, published[12]));
  // A corrupted catch-up record is ignored; a corrupted catch-up blob is caught by its hash.
  const std::string record = policy_store::CatchupKey("run", 12, 5);
  REQUIRE(f.store->Delete(record).ok());
  const std::string junk = "{\"format\": 1}";
  REQUIRE(
      f.store->PutImmutable(record, {reinterpret_cast<const uint8_t*>(junk.data()), junk.size()})
          .ok());
  sync::ServedModel from_five = published[5];
  REQUIRE(reader.Pull(12, 5, &from_five).ok());
  CHECK(SameBytes(from_five, published[12]));
  // Pins in the store hold back retention; stale catch-up deltas are collected.
  auto collected = policy_store::CollectGarbage(*f.store, "run", {}, false);
  REQUIRE(collected.ok());
  CHECK(collected->kept_from ==
        0);  // worker-a and worker-b hold version 2, rebuilt from keyframe 0
  CHECK(f.store->List(policy_store::CatchupPrefix("run", 11))->empty());
  CHECK(f.store->List(policy_store::CatchupPrefix("run", 12))->size() ==
        1);  // from 2; the junk one went too
  REQUIRE(policy_store::RemovePin(*f.store, "run", "worker-a").ok());
  CHECK(policy_store::ListPins(*f.store, "run")->size() == 2);
  CHECK(policy_store::SetPin(*f.store, "run", "../escape", 3).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::trainer_adapter
