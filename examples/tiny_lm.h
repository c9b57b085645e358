// TinyLm: the example policy, a small decoder-only transformer in plain C++.
//
// Pre-norm blocks (RMSNorm, causal multi-head self-attention, RMSNorm, ReLU MLP), learned token
// and position embeddings, an untied output projection. Every parameter is one named tensor in a
// single flat FP32 buffer (`Parameters`), which is what the trainer adapter publishes and what a
// rollout worker holds in the serving format.
//
// One code path runs the network token by token with a key/value cache:
//   - Generation (the embedded engine): `Decoder` over any weights, e.g. the served BF16 values
//     widened to FP32 (exact), with batched sampling (temperature, top-p, max tokens, seed).
//   - Training (the trainer): `Trainer::Accumulate` runs the same steps keeping activations, asks
//     the caller to weigh each token's log-probability (a policy-gradient weight, or 1 for
//     supervised tokens), and back-propagates; an optimiser (examples/optimizers.h) applies the
//     step.
// Tokens are small integers below `vocab`. Deterministic for given seeds. Parallel over sequences
// (common/parallel); thread-count independent results.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "rollout_worker/engine.h"
#include "sync/served_model.h"

namespace weft::examples {

struct TinyLmConfig {
  int vocab = 16;
  int d_model = 96;
  int layers = 3;
  int heads = 4;
  int d_ff = 384;
  int max_seq = 24;
};

// One parameter tensor: a slice of the flat buffer.
struct ParameterInfo {
  std::string name;
  std::vector<uint64_t> shape;
  size_t offset = 0;
  size_t size = 0;
  bool decays = true;  // weight decay applies (not to norms' gains)
};

class TinyLmLayout {
 public:
  explicit TinyLmLayout(const TinyLmConfig& config);
  const TinyLmConfig& config() const { return config_; }
  const std::vector<ParameterInfo>& parameters() const { return parameters_; }
  size_t size() const { return size_; }  // total parameter count
  // Fresh weights: N(0, 0.02) matrices (output projections of residual branches scaled by
  // 1/sqrt(2 * layers)), unit norm gains.
  std::vector<float> Initialize(uint64_t seed) const;
  // The named tensors of `weights` (views into it), as the trainer adapter publishes them.
  std::vector<sync::MasterTensor> Master(std::span<const float> weights) const;

  // Offsets of the tensors the network uses.
  struct Block {
    size_t norm1, qkv, out, norm2, up, down;
  };
  size_t token_embedding = 0, position_embedding = 0, final_norm = 0, unembedding = 0;
  std::vector<Block> blocks;

 private:
  size_t Add(const std::string& name, std::vector<uint64_t> shape, bool decays);
  TinyLmConfig config_;
  std::vector<ParameterInfo> parameters_;
  size_t size_ = 0;
};

// Sampling parameters and what a generation returns: the engine interface's own types
// (temperature 0 is greedy; the logprobs are the model's at temperature 1; segments are
// (version, index of the first token sampled at it), one entry unless the weights changed).
using rollout_worker::Completion;
using rollout_worker::Sampling;

// Weights with the version they are.
struct VersionedWeights {
  uint64_t version = 0;
  std::vector<float> values;
};
// The weights to use now: asked before the prompt and before every sampled token after the first.
using WeightsNow = std::function<std::shared_ptr<const VersionedWeights>()>;

// Generation with a key/value cache over fixed weights (which must outlive it), or over weights
// that may change between tokens (the keys and values already computed are kept, as serving
// engines do when weights are updated in flight).
class Decoder {
 public:
  Decoder(const TinyLmLayout& layout, std::span<const float> weights)
      : layout_(layout), weights_(weights) {}
  // Samples a continuation of each prompt; prompt i uses seed params.seed + i. Prompts plus
  // continuation must fit in max_seq (max_tokens is cut to fit). Errors name the bad prompt.
  Result<std::vector<Completion>> Generate(const std::vector<std::vector<int>>& prompts,
                                           const Sampling& params, int threads = 1) const;
  static Result<std::vector<Completion>> Generate(const TinyLmLayout& layout,
                                                  const WeightsNow& weights,
                                                  const std::vector<std::vector<int>>& prompts,
                                                  const Sampling& params, int threads = 1);
  // Log-probabilities of every token of `tokens` after the first (teacher forcing).
  Result<std::vector<float>> Score(const std::vector<int>& tokens) const;

 private:
  static Result<std::vector<Completion>> GenerateImpl(const TinyLmLayout& layout,
                                                      const WeightsNow& source,
                                                      std::span<const float> fixed,
                                                      const std::vector<std::vector<int>>& prompts,
                                                      const Sampling& params, int threads);
  const TinyLmLayout& layout_;
  std::span<const float> weights_;
};

// A sequence to learn from: the tokens, and from which position on the log-probabilities count.
struct TrainingSequence {
  std::vector<int> tokens;
  size_t first_target = 1;  // tokens[first_target..] are predicted (each from what precedes it)
};

class Trainer {
 public:
  explicit Trainer(const TinyLmLayout& layout) : layout_(layout) {}
  // Runs each sequence forward at `weights`, calls `weigh(i, logprobs, weights_out)` with the
  // log-probabilities of sequence i's targets (one per token from first_target on) to get each
  // target's weight, and adds the gradient of sum_t weight_t * logprob_t to `gradient` (same
  // layout as the weights). Returns the sum of weight_t * logprob_t. Thread-safe `weigh` needed
  // when threads > 1 (it is called for different i concurrently).
  using Weigh = std::function<void(size_t, std::span<const float>, std::span<float>)>;
  Result<double> Accumulate(std::span<const float> weights,
                            const std::vector<TrainingSequence>& batch, const Weigh& weigh,
                            std::span<float> gradient, int threads = 1) const;

 private:
  const TinyLmLayout& layout_;
};

}  // namespace weft::examples
