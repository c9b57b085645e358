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

  // A keyframe in parts: format version 2, which needs them; version 1 manifests stay as they were.
  Manifest keyframed = m;
  keyframed.version = 4;
  keyframed.last_keyframe = 4;
  keyframed.delta_bytes_since_keyframe = 0;
  keyframed.delta_base = 3;
  keyframed.keyframe = {BlobRef{std::string(64, 'd'), 10}, BlobRef{std::string(64, 'e'), 20}};
  const std::string parts = keyframed.ToJson();
  CHECK(parts.find("\"weft.manifest.v2\"") != std::string::npos);
  auto reparsed = Manifest::FromJson(parts);
  REQUIRE_MESSAGE(reparsed.ok(), reparsed.status().ToString());
  CHECK(reparsed->keyframe.size() == 2);
  CHECK(reparsed->keyframe_bytes() == 30);
  CHECK(reparsed->Blobs().size() == 5);
  CHECK(reparsed->ToJson() == parts);
  keyframed.keyframe.resize(1);
  CHECK(keyframed.ToJson().find("\"weft.manifest.v1\"") != std::string::npos);
  CHECK(Manifest::FromJson(keyframed.ToJson())->keyframe.size() == 1);
  good = parts;
  CHECK(error(replace("weft.manifest.v2", "weft.manifest.v1")).find("needs format") !=
        std::string::npos);
  CHECK(error(replace("weft.manifest.v2", "weft.manifest.v3")).find("format is not") !=
        std::string::npos);
  CHECK(error(replace(std::string(64, 'e'), std::string(63, 'e') + "x"))
            .find("manifest.keyframe_parts[1].sha256") != std::string::npos);
  CHECK(error(replace("\"keyframe_parts\"", "\"keyframe\": {\"sha256\": \"" + std::string(64, 'f') +
                                                "\", \"bytes\": 1}, \"keyframe_parts\""))
            .find("both keyframe and keyframe_parts") != std::string::npos);
  good = m.ToJson();
  CHECK(error(replace("weft.manifest.v1", "weft.manifest.v2")).find("has no keyframe_parts") !=
        std::string::npos);
  Manifest one_part = keyframed;
  std::string single = one_part.ToJson();
  single.replace(single.find("weft.manifest.v1"), 16, "weft.manifest.v2");
  single.replace(single.find("\"keyframe\""), 10, "\"keyframe_parts\"");
  CHECK(Manifest::FromJson(single).status().message().find("2 to 65536") != std::string::npos);
  CHECK(Sha256Hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

}  // namespace
}  // namespace weft::policy_store
