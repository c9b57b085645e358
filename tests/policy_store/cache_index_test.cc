#include "policy_store/cache_index.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace weft::policy_store {
namespace {

using Keys = std::vector<std::string>;

TEST_CASE("cache index: least recently used evicted first, never the blob just added") {
  CacheIndex<std::string, int> index(100);
  CHECK(index.Add("a", 40, 1).empty());
  CHECK(index.Add("b", 40, 2).empty());
  CHECK(index.bytes() == 80);
  // A read makes "a" the most recent: "b" goes first.
  REQUIRE(index.Touch("a") != nullptr);
  CHECK(*index.Touch("a") == 1);
  CHECK(index.Add("c", 40, 3) == Keys{"b"});
  CHECK(index.bytes() == 80);
  CHECK(index.Contains("a"));
  CHECK(!index.Contains("b"));
  CHECK(index.Touch("b") == nullptr);
  // Adding a blob held already touches it and keeps its size and value.
  CHECK(index.Add("a", 99, 7).empty());
  CHECK(*index.Find("a") == 1);
  CHECK(index.bytes() == 80);
  // A blob that needs the room of several goes in, and they go, oldest first ("c", then "a").
  CHECK(index.Add("d", 90, 4) == Keys{"c", "a"});
  CHECK(index.size() == 1);
  CHECK(index.bytes() == 90);
}

TEST_CASE("cache index: what does not fit, erasing, and a smaller limit") {
  CacheIndex<std::string, int> index(100);
  CHECK(index.Fits(100));
  CHECK(!index.Fits(101));
  index.Add("a", 30);
  index.Add("b", 30);
  index.Add("c", 30);
  CHECK(index.Erase("b"));
  CHECK(!index.Erase("b"));
  CHECK(index.bytes() == 60);
  // Find does not change the order: "a" is still the oldest.
  CHECK(index.Find("a") != nullptr);
  CHECK(index.Add("d", 60) == Keys{"a"});
  // Within its limit, Shrink evicts nothing; a blob over the limit on its own is evicted by it.
  CHECK(index.Shrink().empty());
  CacheIndex<std::string, int> small(50);
  small.Add("big", 80);  // held: the blob just added is never evicted by its own addition
  CHECK(small.Contains("big"));
  CHECK(small.Shrink() == Keys{"big"});
  CHECK(small.bytes() == 0);
}

}  // namespace
}  // namespace weft::policy_store
