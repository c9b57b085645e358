// The round trip of one tensor through the delta file format, shared by the codec tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "sync/delta_codec.h"
#include "sync/digest.h"

namespace weft::sync::testing {

// Encodes, serialises, parses and applies; checks the result bit for bit, the digests, the file's
// format version and that the parsed delta serialises to the same bytes.
inline void CheckRoundTrip(const TensorSpec& spec, const std::vector<uint8_t>& old_bytes,
                           const std::vector<uint8_t>& new_bytes, const CodecOptions& options) {
  Result<TensorDelta> delta = EncodeTensorDelta(spec, old_bytes, new_bytes, options);
  REQUIRE_MESSAGE(delta.ok(), delta.status().ToString());
  CHECK(delta->base_digest == TensorDigest(spec.dtype, old_bytes));
  CHECK(delta->result_digest == TensorDigest(spec.dtype, new_bytes));
  ModelDelta model;
  model.tensors.push_back(std::move(delta).value());
  const std::vector<uint8_t> bytes = SerializeModelDelta(model);
  Result<ModelDelta> parsed = ParseModelDelta(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.status().ToString());
  CHECK(parsed->format_version ==
        (HasContextChunks(model) ? kDeltaFormatVersion : kPlainDeltaFormatVersion));
  CHECK(SerializeModelDelta(*parsed) == bytes);
  std::vector<uint8_t> served = old_bytes;
  Digest digest;
  const Status applied =
      ApplyTensorDelta(parsed->tensors[0], served, std::nullopt, options.threads, &digest);
  REQUIRE_MESSAGE(applied.ok(), applied.ToString());
  CHECK(served == new_bytes);
  CHECK(digest == TensorDigest(spec.dtype, new_bytes));
}

}  // namespace weft::sync::testing
