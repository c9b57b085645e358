#include "sync/served_model.h"

#include <cstring>
#include <set>

namespace weft::sync {
namespace {

Fp8Format Fp8Of(DType dtype) {
  return dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}

std::span<const uint8_t> AsBytes(const std::vector<float>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)};
}

}  // namespace

Result<ServedModel> ServedModel::FromMaster(const std::vector<MasterTensor>& master,
                                            const ServingPlan& plan, int threads) {
  if (!IsServingFormat(plan.dtype))
    return InvalidArgument("serving format must be BF16, F16 or FP8");
  ServedModel model;
  model.plan_ = plan;
  for (const MasterTensor& m : master) {
    TensorSpec spec{m.name, plan.dtype, m.shape};
    if (spec.element_count() != m.weights.size()) {
      return InvalidArgument("master tensor '" + m.name + "' does not match its shape");
    }
    ServedValues served = Serve(m.weights, m.shape, plan.dtype, plan.fp8_block, plan.saturation);
    if (Info(plan.dtype).size == 1) {
      TensorSpec scale_spec{ScaleTensorName(m.name), DType::kF32, served.scaling.scale_shape()};
      std::span<const uint8_t> scale_bytes = AsBytes(served.scales);
      model.tensors_.push_back({scale_spec,
                                std::vector<uint8_t>(scale_bytes.begin(), scale_bytes.end()),
                                TensorDigest(DType::kF32, scale_bytes)});
    }
    const Digest digest = TensorDigest(plan.dtype, served.bytes, threads);
    model.tensors_.push_back({spec, std::move(served.bytes), digest});
  }
  return model;
}

ServedModel ServedModel::FromTensors(std::vector<TensorSpec> specs,
                                     std::vector<std::vector<uint8_t>> bytes, int threads) {
  ServedModel model;
  for (size_t t = 0; t < specs.size(); ++t) {
    Digest digest = TensorDigest(specs[t].dtype, bytes[t], threads);
    model.tensors_.push_back({std::move(specs[t]), std::move(bytes[t]), digest});
  }
  return model;
}

ServedModel ServedModel::FromStorage(std::vector<TensorSpec> specs,
                                     std::vector<TensorStorage> bytes,
                                     std::vector<Digest> digests) {
  ServedModel model;
  for (size_t t = 0; t < specs.size(); ++t)
    model.tensors_.push_back({std::move(specs[t]), std::move(bytes[t]), digests[t]});
  return model;
}

ServedModel ServedModel::FromSafetensors(const SafetensorsFile& file, int threads) {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> bytes;
  for (const SafetensorsTensor& t : file.tensors()) {
    specs.push_back({t.name, t.dtype, t.shape});
    bytes.emplace_back(t.data.begin(), t.data.end());
  }
  return FromTensors(std::move(specs), std::move(bytes), threads);
}

std::vector<TensorToWrite> ServedModel::AsTensorsToWrite() const {
  std::vector<TensorToWrite> tensors;
  for (const Tensor& t : tensors_)
    tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, t.bytes});
  return tensors;
}

std::vector<TensorBytes> ServedModel::AsTensorBytes() const {
  std::vector<TensorBytes> tensors;
  tensors.reserve(tensors_.size());
  for (const Tensor& t : tensors_) tensors.push_back({t.spec, t.bytes, t.digest});
  return tensors;
}

Result<ModelDelta> ServedModel::Update(const std::vector<MasterTensor>& master,
                                       const CodecOptions& options, uint64_t* changed) {
  // Everything that could refuse the update is checked before any tensor is written: the update
  // is all or nothing, so that a caller updating its only copy never holds half a version.
  WEFT_RETURN_IF_ERROR(CheckChunkLog2(options.chunk_log2));
  if (!IsServingFormat(plan_.dtype)) {
    return InvalidArgument("the serving format is not BF16, F16 or FP8: " +
                           std::string(Info(plan_.dtype).safetensors_name));
  }
  std::set<std::string> seen;
  for (const MasterTensor& m : master) {
    const Tensor* values = Find(m.name);
    if (values == nullptr || values->spec.shape != m.shape || values->spec.dtype != plan_.dtype) {
      return InvalidArgument("master tensor '" + m.name + "' is not served by this model");
    }
    if (!seen.insert(m.name).second)
      return InvalidArgument("master tensor '" + m.name + "' is given twice");
    if (m.weights.size() != values->spec.element_count()) {
      return InvalidArgument("master tensor '" + m.name + "' has " +
                             std::to_string(m.weights.size()) + " values for a shape of " +
                             std::to_string(values->spec.element_count()));
    }
    if (is_fp8()) {
      const Tensor* scale = Find(ScaleTensorName(m.name));
      const BlockScaling scaling = ScalingForShape(m.shape, plan_.fp8_block);
      if (scale == nullptr || scale->bytes.size() != 4 * scaling.scale_count() ||
          scaling.rows * scaling.cols != m.weights.size()) {
        return InvalidArgument("master tensor '" + m.name +
                               "': its FP8 scales are not served as its shape needs");
      }
    }
  }
  ModelDelta delta;
  uint64_t changed_total = 0;
  for (const MasterTensor& m : master) {
    Tensor* values = FindMutable(m.name);  // (found, of its shape: checked above)
    ServeFormat format{plan_.dtype, plan_.saturation, nullptr, {}};
    BlockScaling scaling;
    std::vector<float> scales;
    if (is_fp8()) {
      Tensor* scale = FindMutable(ScaleTensorName(m.name));
      scaling = ScalingForShape(m.shape, plan_.fp8_block);
      scales = ComputeScales(m.weights, scaling, Fp8Of(plan_.dtype));
      std::span<const uint8_t> scale_bytes = AsBytes(scales);
      for (size_t k = 0; k < scales.size(); ++k)
        changed_total +=
            std::memcmp(scale->bytes.data() + 4 * k, scale_bytes.data() + 4 * k, 4) != 0;
      WEFT_ASSIGN_OR_RETURN(
          TensorDelta scale_delta,
          EncodeTensorDelta(scale->spec, scale->bytes, scale_bytes, options, scale->digest));
      std::memcpy(scale->bytes.data(), scale_bytes.data(), scale_bytes.size());
      scale->digest = scale_delta.result_digest;
      delta.tensors.push_back(std::move(scale_delta));
      format.scaling = &scaling;
      format.scales = scales;
    }
    uint64_t value_changes = 0;
    WEFT_ASSIGN_OR_RETURN(TensorDelta value_delta,
                          EncodeFromMaster(values->spec, m.weights, format, values->bytes,
                                           &values->digest, options, &value_changes));
    changed_total += value_changes;
    delta.tensors.push_back(std::move(value_delta));
  }
  if (changed != nullptr) *changed = changed_total;
  return delta;
}

Status ServedModel::Apply(const ModelDelta& delta, int threads) {
  // Prepare every tensor (decode, check, prove the result digest) before writing any of them.
  std::vector<Tensor*> targets;
  std::vector<ServedBytes> served;
  targets.reserve(delta.tensors.size());
  served.reserve(delta.tensors.size());
  for (const TensorDelta& t : delta.tensors) {
    Tensor* tensor = FindMutable(t.spec.name);
    if (tensor == nullptr)
      return InvalidArgument("delta changes unknown tensor '" + t.spec.name + "'");
    if (tensor->spec.dtype != t.spec.dtype || tensor->spec.shape != t.spec.shape) {
      return InvalidArgument("tensor '" + t.spec.name +
                             "': the delta has a different dtype or shape");
    }
    targets.push_back(tensor);
    served.push_back({tensor->bytes, tensor->digest});
  }
  PreparedModelDelta& prepared = apply_buffers_.prepared;
  Status status = PrepareModelDelta(delta, served, threads, &prepared);
  if (status.ok()) {
    std::vector<std::span<uint8_t>> bytes;
    bytes.reserve(targets.size());
    for (Tensor* tensor : targets) bytes.emplace_back(tensor->bytes);
    CommitModelDelta(prepared, bytes, threads);
    for (size_t t = 0; t < targets.size(); ++t)
      targets[t]->digest = prepared.tensors[t].result_digest;
  }
  apply_buffers_.Trim(byte_count());
  return status;
}

Status ServedModel::ApplyChain(std::span<const ModelDelta* const> chain, int threads,
                               size_t* failed, const ApplyChainOptions& options) {
  std::vector<std::span<uint8_t>> writable;
  writable.reserve(tensors_.size());
  for (Tensor& tensor : tensors_) writable.emplace_back(tensor.bytes);
  WEFT_RETURN_IF_ERROR(
      sync::ApplyChain(chain, AsTensorBytes(), writable, threads, failed, options));
  for (const TensorDelta& t : chain.back()->tensors) {
    if (Tensor* tensor = FindMutable(t.spec.name)) tensor->digest = t.result_digest;
  }
  return Status::Ok();
}

Result<ServedModel> ServedModel::Join(std::vector<ServedModel> parts) {
  ServedModel joined;
  if (!parts.empty()) joined.plan_ = parts.front().plan_;
  std::set<std::string> names;
  for (ServedModel& part : parts) {
    for (Tensor& tensor : part.tensors_) {
      if (!names.insert(tensor.spec.name).second)
        return InvalidArgument("tensor '" + tensor.spec.name + "' is in two parts");
      joined.tensors_.push_back(std::move(tensor));
    }
  }
  return joined;
}

void ServedModel::ApplyBuffers::Trim(uint64_t model_bytes) {
  uint64_t kept = 0;
  for (PreparedTensorDelta& tensor : prepared.tensors) {
    tensor.delta = nullptr;
    for (const ChangeList& list : tensor.changes)
      kept += 4 * (list.offsets.capacity() + list.residuals.capacity());
  }
  if (kept > model_bytes / 2) prepared = PreparedModelDelta{};
}

uint64_t ServedModel::byte_count() const {
  uint64_t total = 0;
  for (const Tensor& t : tensors_) total += t.bytes.size();
  return total;
}

uint64_t ServedModel::element_count() const {
  uint64_t total = 0;
  for (const Tensor& t : tensors_) total += t.spec.element_count();
  return total;
}

const ServedModel::Tensor* ServedModel::Find(const std::string& name) const {
  for (const Tensor& t : tensors_) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

ServedModel::Tensor* ServedModel::FindMutable(const std::string& name) {
  for (Tensor& t : tensors_) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

}  // namespace weft::sync
