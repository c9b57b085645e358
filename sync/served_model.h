// ServedModel: the served copy of a model (the bytes an inference engine holds, in its serving
// format) with a state digest per tensor, kept current by deltas.
//
// A publisher builds one from FP32 master weights and calls Update() after every optimiser step:
// the fused path converts, diffs and encodes each tensor in one pass and returns the ModelDelta.
// A consumer holds another copy and calls Apply() with that delta; its digests then equal the
// publisher's, which is the proof that both serve identical bytes.
//
// Each master tensor becomes one served tensor of the plan's dtype; for FP8 it also gets the FP32
// scale tensor "<name>_scale_inv" (fp8_scaling.h), recomputed and diffed at every update.
// Not thread-safe; Update() and Apply() use `threads` threads internally.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "sync/delta_codec.h"
#include "sync/safetensors.h"
#include "sync/serving.h"

namespace weft::sync {

struct MasterTensor {
  std::string name;
  std::vector<uint64_t> shape;
  MasterValues weights;  // FP32 or BF16, read in place
};

struct ServingPlan {
  DType dtype = DType::kBF16;  // kBF16, kF16, kF8E4M3 or kF8E5M2
  uint32_t fp8_block = 128;    // FP8 scale tiles; 0 for one scale per tensor
  Saturation saturation = Saturation::kSaturateFinite;
};

class ServedModel {
 public:
  struct Tensor {
    TensorSpec spec;
    std::vector<uint8_t> bytes;
    Digest digest;
  };

  static Result<ServedModel> FromMaster(const std::vector<MasterTensor>& master,
                                        const ServingPlan& plan, int threads);
  // Tensors that are already served (read from a checkpoint or a keyframe); their digests are
  // computed. Update() needs a model built FromMaster; Apply() works on either.
  static ServedModel FromTensors(std::vector<TensorSpec> specs,
                                 std::vector<std::vector<uint8_t>> bytes, int threads);
  // Every tensor of a safetensors file, in file order (copied; digests computed).
  static ServedModel FromSafetensors(const SafetensorsFile& file, int threads);
  // The tensors as a safetensors writer takes them (views into this model).
  std::vector<TensorToWrite> AsTensorsToWrite() const;
  // The tensors with their digests, as EncodeModelDelta takes them (views into this model).
  std::vector<TensorBytes> AsTensorBytes() const;

  // Moves every served tensor to the new master weights (same names and shapes as FromMaster)
  // and returns the delta from the previous state.
  // `changed` (when given) receives the number of served elements (scales included) that changed.
  Result<ModelDelta> Update(const std::vector<MasterTensor>& master, const CodecOptions& options,
                            uint64_t* changed = nullptr);

  // Applies a delta made from this state; on error nothing is changed. Decodes the whole delta
  // before writing (into buffers kept for the next version: about 8 bytes per changed element),
  // so the write itself is short.
  Status Apply(const ModelDelta& delta, int threads);
  // Applies a chain of deltas, the first made from this state and each from the one before, in
  // place and in bounded memory (sync::ApplyChain: a chunk's working space per thread, decoding
  // twice); on error nothing is changed and `*failed`, when given, is the index of the delta at
  // fault (but see ApplyChainOptions for deltas read from a mapped file).
  Status ApplyChain(std::span<const ModelDelta* const> chain, int threads, size_t* failed = nullptr,
                    const ApplyChainOptions& options = {});
  // The tensors of several models as one model, in order; kInvalidArgument when two hold a tensor
  // of the same name. The serving plan is the first part's.
  static Result<ServedModel> Join(std::vector<ServedModel> parts);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* Find(const std::string& name) const;
  const ServingPlan& plan() const { return plan_; }
  uint64_t byte_count() const;
  uint64_t element_count() const;  // served elements, scales included

 private:
  friend class ServedModelStream;  // builds tensors and their digests as a keyframe arrives

  bool is_fp8() const { return Info(plan_.dtype).size == 1; }
  Tensor* FindMutable(const std::string& name);

  // What Apply decodes into, kept from one version to the next so that applying allocates nothing
  // (up to half the model's size; larger buffers are freed). Not copied with the model.
  struct ApplyBuffers {
    ApplyBuffers() = default;
    ApplyBuffers(const ApplyBuffers&) {}
    ApplyBuffers& operator=(const ApplyBuffers&) { return *this; }
    ApplyBuffers(ApplyBuffers&&) noexcept = default;
    ApplyBuffers& operator=(ApplyBuffers&&) noexcept = default;
    // Forgets the delta the buffers were last prepared from, and frees them if they hold more
    // than half of `model_bytes`.
    void Trim(uint64_t model_bytes);

    PreparedModelDelta prepared;
  };

  ServingPlan plan_;
  std::vector<Tensor> tensors_;
  ApplyBuffers apply_buffers_;
};

}  // namespace weft::sync
