#include "policy_store/manifest.h"

#include <doctest/doctest.h>

namespace weft::policy_store {
namespace {

TEST_CASE("manifests: round trip and strict parsing") {
  Manifest m;
  m.run_id = "run-1";
  m.version = 3;
  m.tensors.push_back({"w", sync::DType::kBF16, {2, 3}, sync::Digest{1, 2}});
  m.delta_base = 2;
  m.delta = BlobRef{std::string(64, 'a'), 100};
  m.last_keyframe = 0;
  m.delta_bytes_since_keyframe = 300;
  m.skips.push_back({2, BlobRef{std::string(64, 'b'), 50}});
  m.skips.push_back({0, BlobRef{std::string(64, 'c'), 70}});
  auto parsed = Manifest::FromJson(m.ToJson());
  REQUIRE(parsed.ok());
  CHECK(parsed->ToJson() == m.ToJson());
  CHECK(parsed->tensors[0].digest == sync::Digest{1, 2});
  REQUIRE(parsed->skips.size() == 2);
  CHECK(parsed->skips[1].base == 0);
  CHECK(parsed->skips[1].blob.bytes == 70);

  auto error = [](std::string json) { return Manifest::FromJson(json).status().message(); };
  std::string good = m.ToJson();
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string copy = good;
    copy.replace(copy.find(from), from.size(), to);
    return copy;
  };
  CHECK(error("{").find("not valid JSON") != std::string::npos);
  CHECK(error(replace("\"run\"", "\"runn\"")).find("unknown field 'runn'") != std::string::npos);
  CHECK(error(replace("\"BF16\"", "\"Q3\"")).find("dtype") != std::string::npos);
  CHECK(error(replace(std::string(64, 'a'), std::string(63, 'a') + "g")).find("sha256") !=
        std::string::npos);
  CHECK(error(replace("\"run-1\"", "\"../x\"")).find("run id") != std::string::npos);
  CHECK(error(replace("\"base\": 2", "\"base\": 3")).find("before the version") !=
        std::string::npos);
  CHECK(Sha256Hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

}  // namespace
}  // namespace weft::policy_store
