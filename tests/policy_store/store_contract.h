// The ObjectStore contract, checked the same way for every backend (the directory and HTTP
// stores in the unit suites, S3 in tests/policy_store/s3_test.sh).
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "policy_store/object_store.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {

// Immutable objects, compare-and-swap, listing, deletion and pieced writers, from an empty store.
inline void CheckStoreSemantics(ObjectStore& s) {
  CHECK(s.Get("things/x").status().code() == StatusCode::kNotFound);
  REQUIRE(s.PutImmutable("things/x", TextBytes("hello")).ok());
  CHECK(s.PutImmutable("things/x", TextBytes("hello")).ok());  // the same bytes again
  CHECK(s.PutImmutable("things/x", TextBytes("other")).code() == StatusCode::kConflict);
  auto stored = s.Get("things/x");
  REQUIRE(stored.ok());
  CHECK(std::string(stored->begin(), stored->end()) == "hello");
  CHECK(*s.Exists("things/x"));
  CHECK(!*s.Exists("things/y"));
  CHECK(s.PutImmutable("../escape", TextBytes("x")).code() == StatusCode::kInvalidArgument);
  REQUIRE(s.PutImmutable("things/empty", {}).ok());
  CHECK(s.Get("things/empty")->empty());

  CHECK(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "1\n").code() ==
        StatusCode::kConflict);
  REQUIRE(s.CompareAndSwap("runs/r/latest", std::nullopt, "0\n").ok());
  CHECK(s.CompareAndSwap("runs/r/latest", std::nullopt, "0\n").code() == StatusCode::kConflict);
  REQUIRE(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "1\n").ok());
  CHECK(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "2\n").code() ==
        StatusCode::kConflict);

  REQUIRE(s.PutImmutable("runs/r/versions/b", TextBytes("2")).ok());
  REQUIRE(s.PutImmutable("runs/r/versions/a", TextBytes("1")).ok());
  auto keys = s.List("runs/r/versions/");
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<std::string>{"runs/r/versions/a", "runs/r/versions/b"});
  CHECK(s.List("nothing/here/")->empty());
  REQUIRE(s.Delete("runs/r/versions/a").ok());
  CHECK(s.Delete("runs/r/versions/a").ok());  // already gone
  CHECK(s.List("runs/r/versions/")->size() == 1);

  // A key that names a directory of keys is no object.
  CHECK(s.Get("runs/r").status().code() == StatusCode::kNotFound);
  CHECK(!*s.Exists("runs/r"));

  // Written in pieces: created, the same bytes again, other bytes.
  auto write = [&](const std::string& key, std::vector<std::string> pieces) -> Result<bool> {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, s.NewImmutableWriter(key));
    for (const std::string& piece : pieces) WEFT_RETURN_IF_ERROR(writer->Write(TextBytes(piece)));
    return writer->Commit();
  };
  CHECK(write("things/pieces", {"ab", "cd"}).value() == true);
  CHECK(write("things/pieces", {"a", "bcd"}).value() == false);
  CHECK(write("things/pieces", {"abce"}).status().code() == StatusCode::kConflict);
  CHECK(write("things/x", {"other"}).status().code() == StatusCode::kConflict);
  auto pieces = s.Get("things/pieces");
  REQUIRE(pieces.ok());
  CHECK(std::string(pieces->begin(), pieces->end()) == "abcd");
  CHECK(s.NewImmutableWriter("../escape").status().code() == StatusCode::kInvalidArgument);
  {
    // Abandoned before Commit: nothing appears, during or after.
    auto abandoned = s.NewImmutableWriter("things/abandoned");
    REQUIRE(abandoned.ok());
    REQUIRE((*abandoned)->Write(TextBytes("half of it")).ok());
    CHECK(*s.List("things/") ==
          std::vector<std::string>{"things/empty", "things/pieces", "things/x"});
  }
  CHECK(!*s.Exists("things/abandoned"));
  CHECK(s.List("things/")->size() == 3);
}

// `threads` writers each try `steps` times to advance a counter by compare-and-swap from the value
// they read: exactly one wins per step, so the final value is the number of wins.
inline void CheckRacingSwaps(ObjectStore& s, int threads, int steps) {
  REQUIRE(s.CompareAndSwap("runs/race/latest", std::nullopt, "0").ok());
  std::atomic<int> wins{0};
  std::vector<std::thread> racers;
  for (int t = 0; t < threads; ++t) {
    racers.emplace_back([&] {
      for (int step = 0; step < steps; ++step) {
        auto current = s.Get("runs/race/latest");
        if (!current.ok()) continue;
        std::string text(current->begin(), current->end());
        if (s.CompareAndSwap("runs/race/latest", text, std::to_string(std::stoi(text) + 1)).ok())
          wins++;
      }
    });
  }
  for (auto& racer : racers) racer.join();
  auto final_value = s.Get("runs/race/latest");
  REQUIRE(final_value.ok());
  CHECK(std::stoi(std::string(final_value->begin(), final_value->end())) == wins.load());
  CHECK(wins.load() > 0);
}

}  // namespace weft::policy_store
