// Trajectory bodies as the trainer receives them: the golden cases both the C++ adapter and the
// Python package are held to (tests/data/trajectories.json), and the worker's encoder read back.
#include "trainer_adapter/received_group.h"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "orchestrator/wire.h"
#include "tests/source_dir.h"

namespace weft::trainer_adapter {
namespace {

using Json = nlohmann::json;

Json Cases() {
  std::ifstream in(weft::testing::TestDataDir() + "/trajectories.json");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str())["cases"];
}

orchestrator::Delivered DeliveredOf(const Json& c) {
  const Json& g = c["group"];
  orchestrator::Delivered d;
  d.group.job = g["job"];
  d.group.attempt = g["attempt"];
  d.group.cluster = g["cluster"];
  d.group.version_start = g["version_start"];
  d.group.version_end = g["version_end"];
  for (const Json& s : g["segments"]) d.group.segments.emplace_back(s[0], s[1]);
  d.group.tokens = g["tokens"];
  d.group.trajectories = c["trajectories"];
  d.stale = g["stale"];
  if (!g["metadata"].is_null()) d.metadata = g["metadata"];
  return d;
}

TEST_CASE("trajectories: the golden bodies parse, or fail with their message") {
  const Json cases = Cases();
  REQUIRE(cases.size() >= 20);
  for (const Json& c : cases) {
    CAPTURE(c["name"].get<std::string>());
    Result<ReceivedGroup> got = ParseGroup(DeliveredOf(c), c["trainer_version"]);
    if (!c["error"].is_null()) {
      REQUIRE(!got.ok());
      CHECK(got.status().code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(got.status().message().starts_with(c["error"].get<std::string>()),
                    got.status().message());
      continue;
    }
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    const Json& expect = c["expect"];
    CHECK(got->prompt == expect["prompt"]);
    CHECK(got->metadata == expect["metadata"]);
    CHECK(got->lag == expect["lag"].get<uint64_t>());
    CHECK(got->job == 7);
    CHECK(got->cluster == "c1");
    REQUIRE(got->samples.size() == expect["samples"].size());
    for (size_t i = 0; i < got->samples.size(); ++i) {
      const ReceivedSample& s = got->samples[i];
      const Json& e = expect["samples"][i];
      CHECK(s.tokens == e["tokens"].get<std::vector<int>>());
      CHECK(s.logprobs == e["logprobs"].get<std::vector<float>>());
      CHECK(s.versions == e["versions"].get<std::vector<uint64_t>>());
      CHECK(s.reward.has_value() == !e["reward"].is_null());
      if (s.reward) CHECK(*s.reward == e["reward"].get<double>());
      CHECK(s.text.has_value() == !e["text"].is_null());
      if (s.text) CHECK(*s.text == e["text"].get<std::string>());
      CHECK(s.extra == e["extra"]);
    }
  }
}

TEST_CASE("trajectories: what the worker encodes, the trainer reads back") {
  orchestrator::wire::Trajectories t;
  t.prompt = "12+34=";
  orchestrator::wire::TrajectorySample a;
  a.tokens = {4, 6, 12};
  a.logprobs = {-0.5f, -0.1f, -3.25f};
  a.reward = 0.5;
  a.text = "46";
  a.segments = {{3, 0}, {4, 1}};
  a.extra = {{"finish", "stop"}};
  orchestrator::wire::TrajectorySample b;
  b.tokens = {12};
  b.logprobs = {-0.01f};
  t.samples = {a, b};
  const std::string text = orchestrator::wire::Encode(t);
  auto back = orchestrator::wire::DecodeTrajectories(text, "job 1");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  CHECK(back->prompt == t.prompt);
  REQUIRE(back->samples.size() == 2);
  CHECK(back->samples[0].tokens == a.tokens);
  CHECK(back->samples[0].logprobs == a.logprobs);  // floats print and read back exactly
  CHECK(back->samples[0].reward == a.reward);
  CHECK(back->samples[0].text == a.text);
  CHECK(back->samples[0].segments == a.segments);
  CHECK(back->samples[0].extra == a.extra);
  CHECK(!back->samples[1].reward);
  CHECK(!back->samples[1].text);
  CHECK(back->samples[1].segments.empty());
  CHECK(Json::parse(text)["samples"][1].size() == 2);  // no members for what it lacks
}

}  // namespace
}  // namespace weft::trainer_adapter
