#include "examples/embedded_engine.h"

#include <chrono>

#include "common/parallel.h"
#include "examples/arithmetic_task.h"
#include "sync/convert.h"

namespace weft::examples {

Result<std::vector<int>> EmbeddedEngine::Tokenize(const std::string& text) {
  if (text.empty()) return InvalidArgument("the prompt is empty text");
  std::vector<int> tokens = {ArithmeticTask::kBegin};
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      tokens.push_back(c - '0');
    } else if (c == '+' || c == '=') {
      tokens.push_back(c == '+' ? ArithmeticTask::kPlus : ArithmeticTask::kEquals);
    } else {
      const unsigned char byte = static_cast<unsigned char>(c);
      const std::string shown = byte >= 0x20 && byte < 0x7f ? "'" + std::string(1, c) + "'"
                                                            : "byte " + std::to_string(byte);
      return InvalidArgument("the prompt's character " + shown + " at offset " + std::to_string(i) +
                             " is not in the embedded engine's vocabulary (the digits, '+' and "
                             "'=')");
    }
  }
  return tokens;
}

std::string EmbeddedEngine::CompletionText(const std::vector<int>& tokens, int stop_token) {
  const bool stopped = !tokens.empty() && stop_token >= 0 && tokens.back() == stop_token;
  return ArithmeticTask::Decode(stopped ? std::vector<int>(tokens.begin(), tokens.end() - 1)
                                        : tokens);
}

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
  MutexLock lock(mutex_);
  staged_ = std::move(weights);
  return Status::Ok();
}

Result<int64_t> EmbeddedEngine::Commit() {
  const auto start = std::chrono::steady_clock::now();
  {
    MutexLock lock(mutex_);
    if (!staged_) return InvalidArgument("nothing staged to commit");
    current_ = std::move(staged_);
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

std::shared_ptr<const VersionedWeights> EmbeddedEngine::Current() const {
  MutexLock lock(mutex_);
  return current_;
}

std::optional<uint64_t> EmbeddedEngine::version() const {
  auto current = Current();
  return current ? std::optional<uint64_t>(current->version) : std::nullopt;
}

Result<std::vector<rollout_worker::Completion>> EmbeddedEngine::Generate(
    const std::vector<rollout_worker::Prompt>& prompts, const rollout_worker::Sampling& sampling) {
  if (!Current()) return Unavailable("the engine has no weights yet");
  std::vector<std::vector<int>> tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].is_text()) {
      tokens.push_back(prompts[i].tokens);
      continue;
    }
    Result<std::vector<int>> encoded = Tokenize(prompts[i].text);
    if (!encoded.ok()) return encoded.status().WithContext("prompt " + std::to_string(i));
    tokens.push_back(std::move(*encoded));
  }
  WEFT_ASSIGN_OR_RETURN(std::vector<rollout_worker::Completion> completions,
                        Decoder::Generate(
                            layout_, [this] { return Current(); }, tokens, sampling, threads_));
  for (rollout_worker::Completion& c : completions)
    c.text = CompletionText(c.tokens, sampling.stop_token);
  return completions;
}

Result<rollout_worker::Engine::Scores> EmbeddedEngine::Score(
    const std::vector<int>& prompt, const std::vector<std::vector<int>>& targets) {
  const std::shared_ptr<const VersionedWeights> weights = Current();
  if (!weights) return Unavailable("the engine has no weights yet");
  Scores scores;
  scores.version = weights->version;
  scores.logprobs.resize(targets.size());
  std::vector<Status> failed(targets.size(), Status::Ok());
  const Decoder decoder(layout_, weights->values);
  ParallelFor(targets.size(), threads_, [&](size_t i) {
    std::vector<int> tokens(prompt);
    tokens.insert(tokens.end(), targets[i].begin(), targets[i].end());
    Result<std::vector<float>> all = decoder.Score(tokens);  // of tokens 1 to the end
    if (!all.ok()) {
      failed[i] = all.status().WithContext("target " + std::to_string(i));
      return;
    }
    scores.logprobs[i].assign(all->end() - static_cast<std::ptrdiff_t>(targets[i].size()),
                              all->end());
  });
  for (const Status& s : failed) WEFT_RETURN_IF_ERROR(s);
  return scores;
}

rollout_worker::EngineHealth EmbeddedEngine::Health() const {
  const std::shared_ptr<const VersionedWeights> current = Current();
  rollout_worker::EngineHealth health;
  health.ok = current != nullptr;
  health.detail = current ? "serving version " + std::to_string(current->version)
                          : std::string("no weights loaded");
  health.ready_replicas = current ? 1 : 0;
  return health;
}

}  // namespace weft::examples
