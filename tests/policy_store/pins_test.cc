#include "policy_store/pins.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "policy_store/directory_store.h"
#include "policy_store/manifest.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

TEST_CASE("pins: set, move, list and remove; holders and runs are checked") {
  const std::string root = TempRoot("pins");
  auto store = std::move(DirectoryStore::Open(root)).value();
  CHECK(ListPins(*store, "run")->empty());
  REQUIRE(SetPin(*store, "run", "worker-a", 2).ok());
  REQUIRE(SetPin(*store, "run", "worker-b", 2).ok());
  REQUIRE(SetPin(*store, "run", "worker-a", 5).ok());  // moved
  REQUIRE(SetPin(*store, "run", "worker-a", 5).ok());  // already there
  CHECK(*ListPins(*store, "run") ==
        std::map<std::string, uint64_t>{{"worker-a", 5}, {"worker-b", 2}});
  REQUIRE(RemovePin(*store, "run", "worker-a").ok());
  REQUIRE(RemovePin(*store, "run", "worker-a").ok());  // already gone
  CHECK(ListPins(*store, "run")->size() == 1);
  CHECK(SetPin(*store, "run", "../escape", 3).code() == StatusCode::kInvalidArgument);
  CHECK(SetPin(*store, "r/un", "w", 3).code() == StatusCode::kInvalidArgument);
  // A pin that does not hold a version number is damage, named.
  const std::string junk = "x";
  REQUIRE(store->CompareAndSwap(PinKey("run", "junk"), std::nullopt, junk).ok());
  Status listed = ListPins(*store, "run").status();
  CHECK(listed.code() == StatusCode::kDataLoss);
  CHECK(listed.message().find("runs/run/pins/junk") != std::string::npos);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
