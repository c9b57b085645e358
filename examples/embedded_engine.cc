#include "examples/embedded_engine.h"

#include <chrono>

#include "sync/convert.h"

namespace weft::examples {

Status EmbeddedEngine::Stage(const sync::ServedModel& model, uint64_t version) {
  if (model.plan().dtype != sync::DType::kBF16 && model.plan().dtype != sync::DType::kF16) {
    return InvalidArgument("the embedded engine serves BF16 or FP16 weights, not " +
                           std::string(sync::Info(model.plan().dtype).safetensors_name));
  }
  auto weights = std::make_shared<VersionedWeights>();
  weights->version = version;
  weights->values.resize(layout_.size());
  if (model.tensors().size() != layout_.parameters().size()) {
    return InvalidArgument("served model of version " + std::to_string(version) + " has " +
                           std::to_string(model.tensors().size()) + " tensors; the policy has " +
                           std::to_string(layout_.parameters().size()));
  }
  for (const ParameterInfo& p : layout_.parameters()) {
    const sync::ServedModel::Tensor* t = model.Find(p.name);
    if (t == nullptr)
      return InvalidArgument("served model of version " + std::to_string(version) +
                             " lacks tensor " + p.name);
    if (t->spec.shape != p.shape)
      return InvalidArgument("served tensor " + p.name + " has another shape than the policy's");
    sync::ConvertToFloat(t->spec.dtype, t->bytes,
                         std::span<float>(weights->values).subspan(p.offset, p.size));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  staged_ = std::move(weights);
  return Status::Ok();
}

Result<int64_t> EmbeddedEngine::Commit() {
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!staged_) return InvalidArgument("nothing staged to commit");
    current_ = std::move(staged_);
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

std::shared_ptr<const VersionedWeights> EmbeddedEngine::Current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

std::optional<uint64_t> EmbeddedEngine::version() const {
  auto current = Current();
  return current ? std::optional<uint64_t>(current->version) : std::nullopt;
}

Result<std::vector<rollout_worker::Completion>> EmbeddedEngine::Generate(
    const std::vector<std::vector<int>>& prompts, const rollout_worker::Sampling& sampling) {
  if (!Current()) return Unavailable("the engine has no weights yet");
  return Decoder::Generate(
      layout_, [this] { return Current(); }, prompts, sampling, threads_);
}

rollout_worker::EngineHealth EmbeddedEngine::Health() const {
  return Current() ? rollout_worker::EngineHealth{true, "serving version " +
                                                            std::to_string(Current()->version)}
                   : rollout_worker::EngineHealth{false, "no weights loaded"};
}

}  // namespace weft::examples
