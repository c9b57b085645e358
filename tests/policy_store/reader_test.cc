#include "policy_store/reader.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "common/file_util.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/run_objects.h"
#include "policy_store/store_server.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::SameBytes;
using testing::TestRun;

using Dir = TestStore;

TEST_CASE("reader: any version from nothing or from an older copy, along the cheapest path") {
  Dir d("reader");
  TestRun run(*d.store, "run", 4);
  run.Start();
  for (int v = 1; v <= 9; ++v) {
    const Manifest m = run.Next();
    CHECK(m.version == static_cast<uint64_t>(v));
    CHECK(m.has_keyframe() == (v % 4 == 0));
    CHECK(m.last_keyframe == static_cast<uint64_t>(v - v % 4));
  }
  StoreReader reader(*d.store, "run", 1);
  CHECK(*reader.Latest() == 9);
  CHECK(reader.Versions()->size() == 10);
  for (uint64_t target : {0, 3, 4, 7, 9}) {
    sync::ServedModel model;
    auto report = reader.Pull(target, std::nullopt, &model);
    REQUIRE(report.ok());
    CHECK(SameBytes(model, run.published[target]));
    CHECK(report->path.rfind("keyframe v" + std::to_string(target - target % 4), 0) == 0);
    CHECK(!report->from.has_value());
    CHECK(report->manifest.version == target);
  }
  // From version 6 to 9: the skip delta 6 -> 8 and the delta 8 -> 9 beat the keyframe at 8, and
  // cost less than the plain chain 6 -> 7 -> 8 -> 9.
  sync::ServedModel model = run.published[6];
  auto report = reader.Pull(9, 6, &model);
  REQUIRE(report.ok());
  CHECK(report->path == "2 deltas from v6");
  CHECK(report->from == std::optional<uint64_t>(6));
  CHECK(SameBytes(model, run.published[9]));
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
  CHECK(*reader.IdentifyVersion(run.published[5]) == std::optional<uint64_t>(5));
  CHECK(reader.Pull(2, 6, &model).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader.GetManifest(12).status().message() == "run 'run' has no version 12");
}

TEST_CASE("reader: a run published with context chunks pulls along every path") {
  Dir d("reader");
  TestRun run(*d.store, "run", 4, {{"w", {256, 256}}, {"norm", {256}}});
  run.policy.delta_mode = sync::DeltaMode::kContext;
  run.codec = sync::CodecOptions{14, 1};
  run.Start();
  for (int v = 1; v <= 9; ++v) run.Next();
  StoreReader reader(*d.store, "run", 2);
  // The blobs hold context chunks; the publisher keeps its deltas plain.
  for (uint64_t v : {1, 5, 8}) {
    const Manifest m = *reader.GetManifest(v);
    Result<LoadedDelta> delta = FetchDelta(*d.store, *m.delta, "delta");
    REQUIRE(delta.ok());
    CHECK(delta->delta.format_version == sync::kDeltaFormatVersion);
    CHECK(sync::HasContextChunks(delta->delta));
  }
  const sync::ModelDelta* held = run.recent.Find(8, 9);
  REQUIRE(held != nullptr);
  CHECK(!sync::HasContextChunks(*held));
  // From nothing (keyframe and deltas applied in turn), from one behind, and from three behind
  // (a chain of a skip delta and a delta, squashed on the copy held).
  for (std::optional<uint64_t> from :
       {std::optional<uint64_t>(), std::optional<uint64_t>(8), std::optional<uint64_t>(6)}) {
    sync::ServedModel model = from ? run.published[*from] : sync::ServedModel();
    Result<PullReport> report = reader.Pull(9, from, &model);
    REQUIRE_MESSAGE(report.ok(), report.status().ToString());
    CHECK(SameBytes(model, run.published[9]));
  }
  // A publisher that restarts holds no deltas: the skip delta that would squash the context-coded
  // delta 9 -> 10... is left out, and the version is published all the same.
  run.recent = RecentDeltas();
  const Manifest ten = run.Next();
  CHECK(ten.skips.empty());
  sync::ServedModel model = run.published[7];
  REQUIRE(reader.Pull(10, 7, &model).ok());
  CHECK(SameBytes(model, run.published[10]));
}

TEST_CASE("reader: a copy that is held is changed in place, and not at all when anything fails") {
  Dir d("reader");
  TestRun run(*d.store, "run", 100);
  run.Start();
  for (int v = 1; v <= 5; ++v) run.Next();
  StoreReader reader(*d.store, "run", 2);
  // The skip delta 2 -> 4 and the delta 4 -> 5, applied as one to the copy itself (the manifest
  // held saves a fetch).
  sync::ServedModel copy = run.published[2];
  const Manifest held = *reader.GetManifest(2);
  const uint8_t* storage = copy.tensors()[0].bytes.data();
  auto report = reader.Pull(5, 2, &copy, &held);
  REQUIRE(report.ok());
  CHECK(report->path == "2 deltas from v2");
  CHECK(SameBytes(copy, run.published[5]));
  CHECK(copy.tensors()[0].bytes.data() == storage);  // the same memory: no copy was made
  // The last delta of a path corrupted at rest: the pull fails and the copy is as it was.
  const std::string blob = BlobKey(reader.GetManifest(5)->delta->sha256);
  {
    std::vector<uint8_t> bad = std::move(d.store->Get(blob)).value();
    bad[bad.size() / 2] ^= 0x10;
    d.Overwrite(blob, bad);
  }
  sync::ServedModel unchanged = run.published[3];
  auto failed = reader.Pull(5, 3, &unchanged);
  CHECK(failed.status().code() == StatusCode::kDataLoss);
  CHECK(failed.status().message().find("corrupted") != std::string::npos);
  CHECK(SameBytes(unchanged, run.published[3]));
  // A copy that is not the version it claims is refused before anything is fetched.
  sync::ServedModel wrong = run.published[1];
  CHECK(reader.Pull(4, 3, &wrong).status().message().find("the local copy") != std::string::npos);
  CHECK(SameBytes(wrong, run.published[1]));
}

// A placement that lays a keyframe out in one buffer, in manifest order (as a mapped file would);
// `fail_prepare` or `fail_tensor` make it refuse.
class BufferPlacement : public KeyframePlacement {
 public:
  Status Prepare(const Manifest& keyframe) override {
    if (fail_prepare) return Unavailable("no room for the keyframe");
    places.clear();
    uint64_t size = 0;
    for (const ManifestTensor& t : keyframe.tensors) {
      const uint64_t bytes = sync::TensorSpec{t.name, t.dtype, t.shape}.byte_count();
      places[t.name] = {size, bytes};
      size += bytes;
    }
    buffer = std::make_shared<std::vector<uint8_t>>(size);
    ++prepared;
    return Status::Ok();
  }
  Result<sync::TensorStorage> Storage(const sync::TensorSpec& spec, uint64_t bytes) override {
    if (spec.name == fail_tensor) return InvalidArgument("no place for " + spec.name);
    const auto& [offset, size] = places.at(spec.name);
    REQUIRE(size == bytes);
    return sync::TensorStorage::View(std::span<uint8_t>(*buffer).subspan(offset, size), buffer);
  }
  bool fail_prepare = false;
  std::string fail_tensor;
  int prepared = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> places;
  std::shared_ptr<std::vector<uint8_t>> buffer;
};

TEST_CASE("reader: a keyframe arrives straight into the storage a placement gives") {
  Dir d("reader_placement");
  TestRun run(*d.store, "run", 3);
  run.Start();
  for (int v = 1; v <= 4; ++v) run.Next();
  StoreReader reader(*d.store, "run", 2);
  BufferPlacement placement;
  reader.PlaceKeyframes(&placement);
  // From nothing: the keyframe of version 3 into the buffer, then the delta to 4 applied there.
  sync::ServedModel model;
  auto report = reader.Pull(4, std::nullopt, &model);
  REQUIRE_MESSAGE(report.ok(), report.status().ToString());
  CHECK(placement.prepared == 1);
  CHECK(SameBytes(model, run.published[4]));
  for (const auto& t : model.tensors()) {
    CAPTURE(t.spec.name);
    CHECK(t.bytes.is_view());
    CHECK(t.bytes.data() == placement.buffer->data() + placement.places.at(t.spec.name).first);
  }
  // A placement that cannot lay the keyframe out, or place one of its tensors, fails the pull,
  // saying which keyframe; the model is as it was.
  placement.fail_prepare = true;
  sync::ServedModel empty;
  Result<PullReport> refused = reader.Pull(4, std::nullopt, &empty);
  CHECK(refused.status().code() == StatusCode::kUnavailable);
  CHECK(refused.status().message().find("keyframe of version 3") != std::string::npos);
  CHECK(refused.status().message().find("no room for the keyframe") != std::string::npos);
  CHECK(empty.tensors().empty());
  placement.fail_prepare = false;
  placement.fail_tensor = run.published[4].tensors().back().spec.name;
  refused = reader.Pull(4, std::nullopt, &empty);
  CHECK(!refused.ok());
  CHECK(refused.status().message().find("no place for " + placement.fail_tensor) !=
        std::string::npos);
  CHECK(empty.tensors().empty());
  // Without a placement: new host memory.
  reader.PlaceKeyframes(nullptr);
  REQUIRE(reader.Pull(4, std::nullopt, &empty).ok());
  CHECK(!empty.tensors()[0].bytes.is_view());
  CHECK(SameBytes(empty, run.published[4]));
}

TEST_CASE("reader: deltas spilled to files are applied window by window, bit for bit") {
  Dir d("reader_spill");
  TestRun run(*d.store, "run", 16, {{"a", {128, 300}}, {"b", {64, 500}}, {"norm", {300}}});
  run.Start();
  for (int v = 1; v <= 12; ++v) run.Next();
  const std::string spill_dir = TempRoot("spill");
  std::filesystem::create_directories(spill_dir);
  for (const bool spill : {false, true}) {
    CAPTURE(spill);
    StoreReader reader(*d.store, "run", 2);
    // Always (any deltas at all), or never.
    reader.SpillDeltas(spill ? spill_dir : "", 0.0);
    for (uint64_t from : {uint64_t{0}, uint64_t{3}, uint64_t{11}}) {
      CAPTURE(from);
      sync::ServedModel model = run.published[from];
      Result<PullReport> report = reader.Pull(12, from, &model);
      REQUIRE_MESSAGE(report.ok(), report.status().ToString());
      CHECK(SameBytes(model, run.published[12]));
    }
    sync::ServedModel fresh;
    REQUIRE(reader.Pull(12, std::nullopt, &fresh).ok());
    CHECK(SameBytes(fresh, run.published[12]));
  }
  // Nothing is left in the spill directory; one that cannot hold files keeps the deltas in memory.
  CHECK(std::filesystem::is_empty(spill_dir));
  StoreReader reader(*d.store, "run", 1);
  reader.SpillDeltas(spill_dir + "/missing", 0.0);
  sync::ServedModel model = run.published[2];
  REQUIRE(reader.Pull(12, 2, &model).ok());
  CHECK(SameBytes(model, run.published[12]));
  std::filesystem::remove_all(spill_dir);
}

TEST_CASE("reader: publish and pull through a store server over HTTP") {
  Dir d("reader");
  StoreServerOptions server_options;
  server_options.writer_token = "token";
  auto server = std::move(StoreServer::Start(*d.store, server_options)).value();
  HttpStore remote("http://127.0.0.1:" + std::to_string(server->port()), "token");
  TestRun run(remote, "run", 3);
  run.Start();
  for (int v = 1; v <= 5; ++v) run.Next();
  StoreReader reader(remote, "run", 1);
  sync::ServedModel model;
  REQUIRE(reader.Pull(5, std::nullopt, &model).ok());
  CHECK(SameBytes(model, run.published[5]));
  sync::ServedModel older = run.published[4];
  auto report = reader.Pull(5, 4, &older);
  REQUIRE(report.ok());
  CHECK(report->path == "1 delta from v4");
  CHECK(SameBytes(older, run.published[5]));
  server->Stop();
}

}  // namespace
}  // namespace weft::policy_store
