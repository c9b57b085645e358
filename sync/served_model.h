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
#include <cstring>
#include <memory>
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

// The bytes of a served tensor: a vector of its own, or a view of memory that a holder keeps
// alive (a region of a mapped file), which the model then reads and writes in place. Copying a
// view copies its bytes into a vector of the copy's own, so that a model copied is a model of its
// own wherever its bytes lived.
class TensorStorage {
 public:
  TensorStorage() = default;
  TensorStorage(std::vector<uint8_t> bytes)  // NOLINT(google-explicit-constructor)
      : owned_(std::move(bytes)), data_(owned_.data()), size_(owned_.size()) {}
  // `bytes` stays valid as long as `holder` does (which may be null when the caller sees to it).
  static TensorStorage View(std::span<uint8_t> bytes, std::shared_ptr<const void> holder) {
    TensorStorage storage;
    storage.data_ = bytes.data();
    storage.size_ = bytes.size();
    storage.view_ = true;
    storage.holder_ = std::move(holder);
    return storage;
  }
  TensorStorage(const TensorStorage& other) : TensorStorage(other.Copy()) {}
  TensorStorage& operator=(const TensorStorage& other) { return *this = other.Copy(); }
  // (A moved vector keeps its buffer, so data_ stays valid.)
  TensorStorage(TensorStorage&& other) noexcept
      : owned_(std::move(other.owned_)),
        data_(other.data_),
        size_(other.size_),
        view_(other.view_),
        holder_(std::move(other.holder_)) {
    other.Clear();
  }
  TensorStorage& operator=(TensorStorage&& other) noexcept {
    if (this != &other) {
      owned_ = std::move(other.owned_);
      data_ = other.data_;
      size_ = other.size_;
      view_ = other.view_;
      holder_ = std::move(other.holder_);
      other.Clear();
    }
    return *this;
  }

  bool is_view() const { return view_; }
  // A copy of the bytes.
  std::vector<uint8_t> ToVector() const { return std::vector<uint8_t>(data_, data_ + size_); }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t* begin() { return data_; }
  uint8_t* end() { return data_ + size_; }
  const uint8_t* begin() const { return data_; }
  const uint8_t* end() const { return data_ + size_; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  const uint8_t& operator[](size_t i) const { return data_[i]; }
  // Storage of its own, resized (a view becomes a vector holding its first `size` bytes).
  void resize(size_t size) {
    if (is_view()) *this = Copy();
    owned_.resize(size);
    data_ = owned_.data();
    size_ = owned_.size();
  }

  friend bool operator==(const TensorStorage& a, std::span<const uint8_t> b) {
    return a.size_ == b.size() && (a.size_ == 0 || std::memcmp(a.data_, b.data(), a.size_) == 0);
  }
  friend bool operator==(const TensorStorage& a, const TensorStorage& b) {
    return a == std::span<const uint8_t>(b.data_, b.size_);
  }
  friend bool operator==(const TensorStorage& a, const std::vector<uint8_t>& b) {
    return a == std::span<const uint8_t>(b);
  }

 private:
  TensorStorage Copy() const { return ToVector(); }
  void Clear() {
    owned_.clear();
    data_ = nullptr;
    size_ = 0;
    view_ = false;
    holder_.reset();
  }

  std::vector<uint8_t> owned_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool view_ = false;
  std::shared_ptr<const void> holder_;  // what keeps a view's bytes alive
};

class ServedModel {
 public:
  struct Tensor {
    TensorSpec spec;
    TensorStorage bytes;
    Digest digest;
  };

  static Result<ServedModel> FromMaster(const std::vector<MasterTensor>& master,
                                        const ServingPlan& plan, int threads);
  // Tensors that are already served (read from a checkpoint or a keyframe); their digests are
  // computed. Update() needs a model built FromMaster; Apply() works on either.
  static ServedModel FromTensors(std::vector<TensorSpec> specs,
                                 std::vector<std::vector<uint8_t>> bytes, int threads);
  // Tensors whose bytes and digests are known (the digests are taken as given, not computed): for
  // a model over storage it does not own (TensorStorage::View), written in place from then on.
  static ServedModel FromStorage(std::vector<TensorSpec> specs, std::vector<TensorStorage> bytes,
                                 std::vector<Digest> digests);
  // Every tensor of a safetensors file, in file order (copied; digests computed).
  static ServedModel FromSafetensors(const SafetensorsFile& file, int threads);
  // The tensors as a safetensors writer takes them (views into this model).
  std::vector<TensorToWrite> AsTensorsToWrite() const;
  // The tensors with their digests, as EncodeModelDelta takes them (views into this model).
  std::vector<TensorBytes> AsTensorBytes() const;

  // Moves every served tensor to the new master weights (same names and shapes as FromMaster)
  // and returns the delta from the previous state. All or nothing: what could refuse the update
  // (an unknown tensor, a shape, a count of values, a chunk size) is checked before any tensor is
  // written, so an error leaves the model as it was.
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
