// libFuzzer target: the safetensors reader. Anything parsed must lie inside the input, and writing
// the parsed tensors again must give a file that parses to the same tensors.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "sync/safetensors.h"

using namespace weft::sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::Result<SafetensorsFile> file = SafetensorsFile::Parse({data, size});
  if (!file.ok()) return 0;
  std::vector<TensorToWrite> tensors;
  for (const SafetensorsTensor& t : file->tensors()) {
    if (t.data.data() < data || t.data.data() + t.data.size() > data + size) std::abort();
    tensors.push_back({t.name, t.dtype, t.shape, t.data});
  }
  weft::Result<SafetensorsLayout> layout = PlanSafetensors(tensors, file->metadata());
  if (!layout.ok()) std::abort();
  std::vector<uint8_t> bytes = layout->header;
  for (size_t i : layout->order)
    bytes.insert(bytes.end(), tensors[i].data.begin(), tensors[i].data.end());
  weft::Result<SafetensorsFile> again = SafetensorsFile::Parse(bytes);
  if (!again.ok() || again->tensors().size() != tensors.size()) std::abort();
  return 0;
}
