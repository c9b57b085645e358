#include "common/yaml_fields.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "tests/temp_path.h"

namespace weft {
namespace {

std::string WriteYaml(const std::string& name, const std::string& text) {
  const std::string path = testing::TempPath(name) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("YAML files: a key given twice anywhere is an error naming both lines") {
  const std::string top = WriteYaml("twice", "a: 1\nb: 2\na: 3\n");
  CHECK(LoadYamlFile(top).status().message() ==
        top + ": a is given twice (lines 1 and 3): keep one of them");
  const std::string nested =
      WriteYaml("nested", "s:\n  list:\n    - {x: 1, y: 2}\n    - {x: 1, x: 2}\n");
  CHECK(LoadYamlFile(nested).status().message().find(
            "s.list[1].x is given twice (lines 4 and 4)") != std::string::npos);
  // A config is read within a bound: /dev/zero fails at once.
  CHECK(LoadYamlFile("/dev/zero").status().message() ==
        "/dev/zero: larger than 16777216 bytes, the limit for a config file");
  // The same key in different maps is fine.
  CHECK(LoadYamlFile(WriteYaml("apart", "a: {x: 1}\nb: {x: 1}\nc: [{x: 1}, {x: 2}]\n")).ok());
}

TEST_CASE("YAML fields: values read strictly; errors name the key and the line") {
  const std::string path = WriteYaml("fields", R"(section:
  name: weft
  count: 12
  ratio: 0.5
  size: 64MiB
  wait: 250ms
  list: [1, 2]
  bad_count: -3
  bad_size: lots
)");
  Result<YAML::Node> root = LoadYamlFile(path);
  REQUIRE(root.ok());
  const YAML::Node section = (*root)["section"];
  CHECK(CheckKeys(section, "section",
                  {"name", "count", "ratio", "size", "wait", "list", "bad_count", "bad_size"})
            .ok());
  CHECK(CheckKeys(section, "section", {"name"})
            .message()
            .find("section.count: unknown key (line 3)") == 0);
  CHECK(CheckKeys(section["name"], "section.name", {}).message().find("must be a map") !=
        std::string::npos);
  std::string name = "default";
  uint64_t count = 0, size = 0, absent = 77;
  double ratio = 0;
  std::chrono::microseconds wait{0};
  REQUIRE(ReadString(section, "section", "name", &name).ok());
  REQUIRE(ReadUnsigned(section, "section", "count", &count).ok());
  REQUIRE(ReadDouble(section, "section", "ratio", &ratio).ok());
  REQUIRE(ReadBytes(section, "section", "size", &size).ok());
  REQUIRE(ReadDuration(section, "section", "wait", &wait).ok());
  REQUIRE(ReadUnsigned(section, "section", "missing", &absent).ok());
  CHECK(name == "weft");
  CHECK(count == 12);
  CHECK(ratio == 0.5);
  CHECK(size == 64ull << 20);
  CHECK(wait.count() == 250000);
  CHECK(absent == 77);  // absent keys leave the value as it was
  CHECK(ReadUnsigned(section, "section", "bad_count", &count).message() ==
        "section.bad_count: '-3' is not a non-negative integer (line 8)");
  CHECK(ReadBytes(section, "section", "bad_size", &size).message().find("section.bad_size") !=
        std::string::npos);
  CHECK(ReadString(section, "section", "list", &name).message().find("must be a single value") !=
        std::string::npos);
  CHECK(ReadDouble(section, "section", "name", &ratio).message().find("is not a number") !=
        std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("YAML fields: a file that is missing or not YAML is named") {
  CHECK(LoadYamlFile("/nonexistent/weft.yaml").status().code() == StatusCode::kNotFound);
  const std::string path = WriteYaml("broken", "a: [1, 2\nb: 3\n");
  Status broken = LoadYamlFile(path).status();
  CHECK(broken.code() == StatusCode::kInvalidArgument);
  CHECK(broken.message().find(path + ": line ") == 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace weft
