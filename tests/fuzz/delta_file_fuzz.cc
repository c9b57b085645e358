// libFuzzer target: weft delta files. Parses; for every parsed tensor of reasonable size, prepares
// and commits the delta on a tensor of fixed pseudo-random bytes (claiming the delta's own base
// digest, so decoding runs; the bytes give context chunks every context), squashes the delta with
// itself, and squashes it on that tensor. Nothing may crash, hang or read out of bounds.
#include <cstdint>
#include <vector>

#include "sync/delta_codec.h"

using namespace weft::sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::Result<ModelDelta> parsed = ParseModelDelta({data, size});
  if (!parsed.ok()) return 0;
  std::vector<std::vector<uint8_t>> bases;  // reserved: `base` points into them
  bases.reserve(parsed->tensors.size());
  std::vector<TensorBytes> base;
  uint64_t base_bytes = 0;
  for (const TensorDelta& tensor : parsed->tensors) base_bytes += tensor.spec.byte_count();
  for (const TensorDelta& tensor : parsed->tensors) {
    if (tensor.spec.byte_count() > (1u << 22)) continue;
    std::vector<uint8_t> served(tensor.spec.byte_count());
    uint64_t state = 1;
    for (uint8_t& b : served) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<uint8_t>(state >> 56);
    }
    weft::Result<PreparedTensorDelta> prepared =
        PrepareTensorDelta(tensor, served, tensor.base_digest, 1);
    if (base_bytes <= (1u << 22)) {
      bases.push_back(served);
      base.push_back({tensor.spec, bases.back(), tensor.base_digest});
    }
    if (prepared.ok()) CommitTensorDelta(*prepared, served, 1);
    weft::Result<TensorDelta> squashed = SquashTensorDeltas(tensor, tensor, 1);
    if (squashed.ok()) {
      ModelDelta model;
      model.tensors.push_back(std::move(squashed).value());
      (void)SerializeModelDelta(model);
    }
  }
  if (!base.empty()) {
    const ModelDelta* chain[] = {&*parsed};
    (void)SquashChainOnBase(chain, base, DeltaMode::kContext, 1);
  }
  return 0;
}
