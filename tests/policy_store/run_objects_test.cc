#include "policy_store/run_objects.h"

#include <doctest/doctest.h>

#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

TEST_CASE(
    "direct reads: a blob corrupted in transit is fetched again; corrupted every time, an error") {
  Upstream upstream;
  const auto blob = Pattern(3000, 7);
  const BlobRef ref{Sha256Hex(blob), blob.size()};
  upstream.Put(blob);
  upstream.faulty.corrupt = 2;
  Result<std::vector<uint8_t>> got = FetchVerifiedBlob(upstream.faulty, ref, "test blob");
  REQUIRE(got.ok());
  CHECK(*got == blob);
  CHECK(upstream.faulty.gets.load() == 3);
  upstream.faulty.corrupt = 3;
  Status status = FetchVerifiedBlob(upstream.faulty, ref, "test blob").status();
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("test blob: blob " + ref.sha256 + " is corrupted") !=
        std::string::npos);
}

}  // namespace
}  // namespace weft::policy_store
