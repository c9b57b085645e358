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

TEST_CASE("json text: Validate accepts exactly RFC 8259 JSON and says where it is not") {
  for (const std::string good :
       {"0", "-0.5e+10", "\"\"", "[]", "{}", " [1, [2, {\"a\": null}], true, false] ",
        "{\"a\":{\"a\":1},\"b\":[{\"a\":2},{\"a\":3}]}", "\"\\u00e9\\ud83d\\ude00\\n\"",
        "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"", "\xEF\xBB\xBF{\"bom\": 1}"}) {
    CAPTURE(good);
    CHECK(Validate(good) == "");
    CHECK(!nlohmann::json::parse(good, nullptr, false).is_discarded());  // the parser agrees
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "byte 0: the text ends where a value should be"},
      {"{", "byte 1: expected a string key"},
      {"[1,]", "byte 3: not a JSON value"},
      {"[1 2]", "byte 3: expected ',' or ']' in an array"},
      {"01", "byte 1: text after the JSON value"},
      {"1.", "byte 2: a number with no digits after its point"},
      {"\"a\x01\"", "byte 2: a control character in a string (it must be escaped)"},
      {"\"\\x\"", "byte 1: an unknown escape in a string"},
      {"\"\\ud800\"", "byte 7: a high surrogate escape without its low surrogate"},
      {"\"\xC0\xAF\"", "byte 1: a string is not well-formed UTF-8"},      // overlong '/'
      {"\"\xED\xA0\x80\"", "byte 1: a string is not well-formed UTF-8"},  // a surrogate
      {"{\"a\":1,\"a\":2}", "byte 7: a key repeated in one object: \"a\":2}"},
      {"{\"a\":1,\"\\u0061\":2}", "byte 7: a key repeated in one object: \"\\u0061\":2}"},
      {"[1] [2]", "byte 4: text after the JSON value"},
      {"nul", "byte 0: not a JSON value"},
  };
  for (const auto& entry : bad) {
    const std::string& text = entry.first;
    CAPTURE(text);
    CHECK(Validate(text) == entry.second);
  }
  // The members of the top object come with it, in the same pass.
  std::vector<TopMember> members;
  CHECK(Validate(R"( {"a": 1, "b" : [1, {"c":2}], "\u0063": "x", "e": {}} )", 64, &members) == "");
  REQUIRE(members.size() == 4);
  CHECK(members[0].key == "a");
  CHECK(members[0].value == "1");
  CHECK(members[1].key == "b");
  CHECK(members[1].value == R"([1, {"c":2}])");
  CHECK(members[2].key == "c");
  CHECK(members[2].value == R"("x")");
  CHECK(members[3].key == "e");
  CHECK(members[3].value == "{}");
  CHECK(Validate("[1, 2]", 64, &members) == "");
  CHECK(members.empty());
  // The same key in different objects is fine.
  CHECK(Validate(R"([{"a":1},{"a":2}])") == "");
  // Depth: 64 levels are fine, 65 are not, and a megabyte of '[' costs no memory to refuse.
  CHECK(Validate(std::string(64, '[') + std::string(64, ']')) == "");
  CHECK(Validate(std::string(65, '[') + std::string(65, ']')) ==
        "byte 64: nested more than 64 deep");
  CHECK(Validate(std::string(1 << 20, '[')) == "byte 64: nested more than 64 deep");
  CHECK(Validate("[[1]]", 1) == "byte 1: nested more than 1 deep");
  // Members per object are bounded.
  std::string wide = "{";
  for (int i = 0; i <= 10000; ++i) wide += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  wide += "}";
  CHECK(Validate(wide).find("more than 10000 members") != std::string::npos);
}

}  // namespace
}  // namespace weft::json_text
