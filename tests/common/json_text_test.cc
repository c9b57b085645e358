#include "common/json_text.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace weft::json_text {
namespace {

TEST_CASE("json text: values end where the parser says, strings and nesting included") {
  const std::string text = R"(  {"a": "x\"}]", "b": [1, {"c": [true, null]}], "d": -1.5e3} tail)";
  CHECK(ValueEnd(text, 0) == text.size() - 5);
  CHECK(ValueEnd("12345", 0) == 5);
  CHECK(ValueEnd("\"a\\\\\"x", 0) == 5);  // an escaped backslash ends before the quote
  CHECK(ValueEnd("[1, 2] , 3", 0) == 6);
  CHECK(*Member(text, 0, "a") == R"("x\"}]")");
  CHECK(*Member(text, 0, "b") == R"([1, {"c": [true, null]}])");
  CHECK(*Member(text, 0, "d") == "-1.5e3");
  CHECK(!Member(text, 0, "c").has_value());  // only the object's own members
  CHECK(!Member("[1]", 0, "a").has_value());
  CHECK(!Member("{}", 0, "a").has_value());
  CHECK(*Member(R"({"\u0061": 1, "a": 2})", 0, "a") == "2");  // escaped keys; the last one wins
  std::vector<size_t> elements = Elements(R"([ 1, "two", [3], {"4": 4} ])", 0);
  REQUIRE(elements.size() == 4);
  CHECK(elements[1] == 5);
  CHECK(Elements("[]", 0).empty());
  CHECK(Elements(" [ ] ", 0).empty());
}

TEST_CASE("json text: agrees with the parser on random documents, and never reads past the end") {
  std::mt19937 rng(7);
  auto random_value = [&](auto& self, int depth) -> nlohmann::json {
    switch (depth > 3 ? rng() % 4 : rng() % 6) {
      case 0:
        return nullptr;
      case 1:
        return static_cast<int>(rng() % 2000) - 1000;
      case 2: {
        std::string s;
        for (int i = rng() % 6; i > 0; --i) s += "ab\"\\{}[],: \n"[rng() % 13];
        return s;
      }
      case 3:
        return rng() % 2 == 0;
      case 4: {
        nlohmann::json array = nlohmann::json::array();
        for (int i = rng() % 4; i > 0; --i) array.push_back(self(self, depth + 1));
        return array;
      }
      default: {
        nlohmann::json object = nlohmann::json::object();
        for (int i = rng() % 4; i > 0; --i)
          object["k" + std::to_string(rng() % 5)] = self(self, depth + 1);
        return object;
      }
    }
  };
  for (int round = 0; round < 500; ++round) {
    nlohmann::json object = nlohmann::json::object();
    for (int i = 0; i < 4; ++i) object["k" + std::to_string(i)] = random_value(random_value, 0);
    const std::string text = object.dump(round % 2 == 0 ? -1 : 2);
    CHECK(ValueEnd(text, 0) == text.size());
    for (const auto& [key, value] : object.items()) {
      std::optional<std::string_view> found = Member(text, 0, key);
      REQUIRE(found.has_value());
      CHECK(nlohmann::json::parse(*found) == value);
    }
    // Cut anywhere: positions stay inside the text.
    const std::string cut = text.substr(0, rng() % text.size());
    CHECK(ValueEnd(cut, 0) <= cut.size());
    (void)Member(cut, 0, "k1");
    (void)Elements(cut, 0);
  }
}

}  // namespace
}  // namespace weft::json_text
