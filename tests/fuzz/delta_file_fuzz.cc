// libFuzzer target: weft delta files. Parses; for every parsed tensor of reasonable size, prepares
// and commits the delta on a zero tensor (claiming the delta's own base digest, so decoding runs),
// and squashes the delta with itself. Nothing may crash, hang or read out of bounds.
#include <cstdint>
#include <vector>

#include "sync/delta_codec.h"

using namespace weft::sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::Result<ModelDelta> parsed = ParseModelDelta({data, size});
  if (!parsed.ok()) return 0;
  for (const TensorDelta& tensor : parsed->tensors) {
    if (tensor.spec.byte_count() > (1u << 22)) continue;
    std::vector<uint8_t> served(tensor.spec.byte_count(), 0);
    weft::Result<PreparedTensorDelta> prepared =
        PrepareTensorDelta(tensor, served, tensor.base_digest, 1);
    if (prepared.ok()) CommitTensorDelta(*prepared, served, 1);
    weft::Result<TensorDelta> squashed = SquashTensorDeltas(tensor, tensor, 1);
    if (squashed.ok()) {
      ModelDelta model;
      model.tensors.push_back(std::move(squashed).value());
      (void)SerializeModelDelta(model);
    }
  }
  return 0;
}
