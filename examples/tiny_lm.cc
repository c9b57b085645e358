#include "examples/tiny_lm.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/parallel.h"

namespace weft::examples {
namespace {

constexpr float kNormEpsilon = 1e-5f;
constexpr size_t kSequencesPerChunk = 8;  // gradients are summed per chunk, then chunks in order

// y = x W, W row-major [in][out].
void VecMat(const float* x, const float* w, int in, int out, float* y) {
  std::fill(y, y + out, 0.0f);
  for (int i = 0; i < in; ++i) {
    const float xi = x[i];
    if (xi == 0.0f) continue;
    const float* row = w + static_cast<size_t>(i) * out;
    for (int j = 0; j < out; ++j) y[j] += xi * row[j];
  }
}

// dx += dy W^T; dW += x^T dy.
void VecMatBackward(const float* x, const float* w, const float* dy, int in, int out, float* dx,
                    float* dw) {
  for (int i = 0; i < in; ++i) {
    const float* row = w + static_cast<size_t>(i) * out;
    float* drow = dw + static_cast<size_t>(i) * out;
    const float xi = x[i];
    float sum = 0.0f;
    for (int j = 0; j < out; ++j) {
      sum += row[j] * dy[j];
      drow[j] += xi * dy[j];
    }
    dx[i] += sum;
  }
}

// y = g * x / rms(x); returns 1 / rms(x).
float RmsNorm(const float* x, const float* g, int n, float* y) {
  float squares = 0.0f;
  for (int i = 0; i < n; ++i) squares += x[i] * x[i];
  const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(n) + kNormEpsilon);
  for (int i = 0; i < n; ++i) y[i] = g[i] * x[i] * inverse;
  return inverse;
}

// dx += d(RmsNorm)/dx . dy; dg += dy * x / rms.
void RmsNormBackward(const float* x, const float* g, float inverse, const float* dy, int n,
                     float* dx, float* dg) {
  float dot = 0.0f;
  for (int i = 0; i < n; ++i) dot += g[i] * dy[i] * x[i];
  const float scale = inverse * inverse * inverse * dot / static_cast<float>(n);
  for (int i = 0; i < n; ++i) {
    dx[i] += inverse * g[i] * dy[i] - scale * x[i];
    dg[i] += dy[i] * x[i] * inverse;
  }
}

// In place: logits -> log-softmax.
void LogSoftmax(float* v, int n) {
  const float top = *std::max_element(v, v + n);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += std::exp(v[i] - top);
  const float log_sum = top + std::log(sum);
  for (int i = 0; i < n; ++i) v[i] -= log_sum;
}

// The network run over one sequence, position by position, with its key/value cache. With
// `keep`, every activation the backward pass needs is kept.
class Run {
 public:
  Run(const TinyLmLayout& layout, std::span<const float> weights, bool keep)
      : c_(layout.config()), layout_(layout), w_(weights.data()), keep_(keep) {
    const size_t d = c_.d_model, t = c_.max_seq;
    keys_.assign(c_.layers, std::vector<float>(t * d));
    values_.assign(c_.layers, std::vector<float>(t * d));
    x_.resize(d);
    h_.resize(d);
    qkv_.resize(3 * d);
    att_.resize(d);
    o_.resize(d);
    u_.resize(c_.d_ff);
    a_.resize(c_.d_ff);
    logp_.resize(c_.vocab);
    if (keep_) {
      layer_acts_.resize(static_cast<size_t>(c_.layers) * t);
      final_acts_.resize(t);
    }
  }

  int positions() const { return positions_; }
  void set_weights(const float* weights) { w_ = weights; }

  // Runs the token at the next position; returns the log-softmax over the next token (valid
  // until the next call).
  const float* Step(int token) {
    const int p = positions_++;
    const int d = c_.d_model, f = c_.d_ff, heads = c_.heads, dh = d / heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    const float* tok = w_ + layout_.token_embedding + static_cast<size_t>(token) * d;
    const float* pos = w_ + layout_.position_embedding + static_cast<size_t>(p) * d;
    for (int i = 0; i < d; ++i) x_[i] = tok[i] + pos[i];
    std::vector<float>&h = h_, &qkv = qkv_, &att = att_, &o = o_, &u = u_, &a = a_;
    probs_.resize(static_cast<size_t>(heads) * (p + 1));
    std::vector<float>& probs = probs_;
    for (int l = 0; l < c_.layers; ++l) {
      const auto& b = layout_.blocks[l];
      LayerActs* acts = keep_ ? &layer_acts_[static_cast<size_t>(l) * c_.max_seq + p] : nullptr;
      if (acts) acts->x_in = x_;
      const float r1 = RmsNorm(x_.data(), w_ + b.norm1, d, h.data());
      VecMat(h.data(), w_ + b.qkv, d, 3 * d, qkv.data());
      std::copy(qkv.begin() + d, qkv.begin() + 2 * d,
                keys_[l].begin() + static_cast<size_t>(p) * d);
      std::copy(qkv.begin() + 2 * d, qkv.end(), values_[l].begin() + static_cast<size_t>(p) * d);
      std::fill(att.begin(), att.end(), 0.0f);
      for (int head = 0; head < heads; ++head) {
        const float* q = qkv.data() + head * dh;
        float* pr = probs.data() + static_cast<size_t>(head) * (p + 1);
        float top = -1e30f;
        for (int j = 0; j <= p; ++j) {
          const float* k = keys_[l].data() + static_cast<size_t>(j) * d + head * dh;
          float s = 0.0f;
          for (int i = 0; i < dh; ++i) s += q[i] * k[i];
          pr[j] = s * scale;
          top = std::max(top, pr[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= p; ++j) sum += (pr[j] = std::exp(pr[j] - top));
        for (int j = 0; j <= p; ++j) {
          pr[j] /= sum;
          const float* v = values_[l].data() + static_cast<size_t>(j) * d + head * dh;
          for (int i = 0; i < dh; ++i) att[head * dh + i] += pr[j] * v[i];
        }
      }
      VecMat(att.data(), w_ + b.out, d, d, o.data());
      for (int i = 0; i < d; ++i) x_[i] += o[i];
      if (acts) {
        acts->r1 = r1;
        acts->h1 = h;
        acts->q.assign(qkv.begin(), qkv.begin() + d);
        acts->probs = probs;
        acts->att = att;
        acts->x_mid = x_;
      }
      const float r2 = RmsNorm(x_.data(), w_ + b.norm2, d, h.data());
      VecMat(h.data(), w_ + b.up, d, f, u.data());
      for (int i = 0; i < f; ++i) a[i] = std::max(0.0f, u[i]);
      VecMat(a.data(), w_ + b.down, f, d, o.data());
      for (int i = 0; i < d; ++i) x_[i] += o[i];
      if (acts) {
        acts->r2 = r2;
        acts->h2 = h;
        acts->u = u;
      }
    }
    float* logp = logp_.data();
    const float rf = RmsNorm(x_.data(), w_ + layout_.final_norm, d, h.data());
    VecMat(h.data(), w_ + layout_.unembedding, d, c_.vocab, logp);
    LogSoftmax(logp, c_.vocab);
    if (keep_) {
      FinalActs& fa = final_acts_[p];
      fa.token = token;
      fa.x = x_;
      fa.rf = rf;
      fa.hf = h;
      fa.logp.assign(logp, logp + c_.vocab);
    }
    return logp;
  }

  // Back-propagates from d(objective)/d(logits) at every position (dlogits[p], vocab each) into
  // `grad`. Needs keep.
  void Backward(const std::vector<std::vector<float>>& dlogits, float* grad) {
    const int d = c_.d_model, f = c_.d_ff, heads = c_.heads, dh = d / heads, v = c_.vocab;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    std::vector<std::vector<float>> dkeys(
        c_.layers, std::vector<float>(static_cast<size_t>(c_.max_seq) * d, 0.0f));
    std::vector<std::vector<float>> dvalues = dkeys;
    std::vector<float> dx(d), dh_(std::max(d, f)), dmid(d), datt(d), dqkv(3 * d), du(f), a(f),
        dprobs(c_.max_seq);
    for (int p = positions_ - 1; p >= 0; --p) {
      const FinalActs& fa = final_acts_[p];
      std::fill(dx.begin(), dx.end(), 0.0f);
      std::fill(dh_.begin(), dh_.begin() + d, 0.0f);
      VecMatBackward(fa.hf.data(), w_ + layout_.unembedding, dlogits[p].data(), d, v, dh_.data(),
                     grad + layout_.unembedding);
      RmsNormBackward(fa.x.data(), w_ + layout_.final_norm, fa.rf, dh_.data(), d, dx.data(),
                      grad + layout_.final_norm);
      for (int l = c_.layers - 1; l >= 0; --l) {
        const auto& b = layout_.blocks[l];
        const LayerActs& acts = layer_acts_[static_cast<size_t>(l) * c_.max_seq + p];
        // MLP: x_out = x_mid + down(relu(up(norm2(x_mid)))).
        for (int i = 0; i < f; ++i) a[i] = std::max(0.0f, acts.u[i]);
        std::fill(du.begin(), du.end(), 0.0f);
        VecMatBackward(a.data(), w_ + b.down, dx.data(), f, d, du.data(), grad + b.down);
        for (int i = 0; i < f; ++i) du[i] = acts.u[i] > 0.0f ? du[i] : 0.0f;
        std::fill(dh_.begin(), dh_.begin() + d, 0.0f);
        VecMatBackward(acts.h2.data(), w_ + b.up, du.data(), d, f, dh_.data(), grad + b.up);
        dmid = dx;
        RmsNormBackward(acts.x_mid.data(), w_ + b.norm2, acts.r2, dh_.data(), d, dmid.data(),
                        grad + b.norm2);
        // Attention: x_mid = x_in + out(attention(qkv(norm1(x_in)))).
        std::fill(datt.begin(), datt.end(), 0.0f);
        VecMatBackward(acts.att.data(), w_ + b.out, dmid.data(), d, d, datt.data(), grad + b.out);
        std::fill(dqkv.begin(), dqkv.end(), 0.0f);
        for (int head = 0; head < heads; ++head) {
          const float* pr = acts.probs.data() + static_cast<size_t>(head) * (p + 1);
          const float* da = datt.data() + head * dh;
          const float* q = acts.q.data() + head * dh;
          float weighted = 0.0f;
          for (int j = 0; j <= p; ++j) {
            const float* val = values_[l].data() + static_cast<size_t>(j) * d + head * dh;
            float* dval = dvalues[l].data() + static_cast<size_t>(j) * d + head * dh;
            float s = 0.0f;
            for (int i = 0; i < dh; ++i) {
              s += da[i] * val[i];
              dval[i] += pr[j] * da[i];
            }
            dprobs[j] = s;
            weighted += pr[j] * s;
          }
          for (int j = 0; j <= p; ++j) {
            const float dscore = pr[j] * (dprobs[j] - weighted) * scale;
            const float* key = keys_[l].data() + static_cast<size_t>(j) * d + head * dh;
            float* dkey = dkeys[l].data() + static_cast<size_t>(j) * d + head * dh;
            for (int i = 0; i < dh; ++i) {
              dqkv[head * dh + i] += dscore * key[i];
              dkey[i] += dscore * q[i];
            }
          }
        }
        // This position's key and value have every contribution now (later positions ran first).
        std::copy_n(dkeys[l].data() + static_cast<size_t>(p) * d, d, dqkv.begin() + d);
        std::copy_n(dvalues[l].data() + static_cast<size_t>(p) * d, d, dqkv.begin() + 2 * d);
        std::fill(dh_.begin(), dh_.begin() + d, 0.0f);
        VecMatBackward(acts.h1.data(), w_ + b.qkv, dqkv.data(), d, 3 * d, dh_.data(), grad + b.qkv);
        dx = dmid;
        RmsNormBackward(acts.x_in.data(), w_ + b.norm1, acts.r1, dh_.data(), d, dx.data(),
                        grad + b.norm1);
      }
      float* dtok = grad + layout_.token_embedding + static_cast<size_t>(fa.token) * d;
      float* dpos = grad + layout_.position_embedding + static_cast<size_t>(p) * d;
      for (int i = 0; i < d; ++i) {
        dtok[i] += dx[i];
        dpos[i] += dx[i];
      }
    }
  }

 private:
  struct LayerActs {
    std::vector<float> x_in, h1, q, probs, att, x_mid, h2, u;
    float r1 = 0, r2 = 0;
  };
  struct FinalActs {
    int token = 0;
    std::vector<float> x, hf, logp;
    float rf = 0;
  };

  const TinyLmConfig& c_;
  const TinyLmLayout& layout_;
  const float* w_;
  bool keep_;
  int positions_ = 0;
  std::vector<std::vector<float>> keys_, values_;  // per layer, [position][d_model]
  std::vector<float> x_;
  std::vector<float> h_, qkv_, att_, o_, u_, a_, probs_, logp_;  // one step's working vectors
  std::vector<LayerActs> layer_acts_;                            // [layer][position]
  std::vector<FinalActs> final_acts_;

 public:
  const std::vector<float>& logp_at(int p) const { return final_acts_[p].logp; }
};

Status CheckTokens(const TinyLmConfig& c, const std::vector<int>& tokens, const std::string& what) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab) {
      return InvalidArgument(what + ": token " + std::to_string(i) + " is " +
                             std::to_string(tokens[i]) + ", outside the vocabulary of " +
                             std::to_string(c.vocab));
    }
  }
  return Status::Ok();
}

}  // namespace

TinyLmLayout::TinyLmLayout(const TinyLmConfig& config) : config_(config) {
  const uint64_t d = config.d_model, f = config.d_ff, v = config.vocab, t = config.max_seq;
  token_embedding = Add("embed.tokens", {v, d}, true);
  position_embedding = Add("embed.positions", {t, d}, true);
  for (int l = 0; l < config.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    Block b;
    b.norm1 = Add(p + "attn_norm", {d}, false);
    b.qkv = Add(p + "attn.qkv", {d, 3 * d}, true);
    b.out = Add(p + "attn.out", {d, d}, true);
    b.norm2 = Add(p + "mlp_norm", {d}, false);
    b.up = Add(p + "mlp.up", {d, f}, true);
    b.down = Add(p + "mlp.down", {f, d}, true);
    blocks.push_back(b);
  }
  final_norm = Add("final_norm", {d}, false);
  unembedding = Add("unembed", {d, v}, true);
}

size_t TinyLmLayout::Add(const std::string& name, std::vector<uint64_t> shape, bool decays) {
  size_t count = 1;
  for (uint64_t s : shape) count *= s;
  parameters_.push_back({name, std::move(shape), size_, count, decays});
  size_ += count;
  return size_ - count;
}

std::vector<sync::MasterTensor> TinyLmLayout::Master(std::span<const float> weights) const {
  std::vector<sync::MasterTensor> master;
  for (const ParameterInfo& p : parameters_)
    master.push_back({p.name, p.shape, weights.subspan(p.offset, p.size)});
  return master;
}

std::vector<float> TinyLmLayout::Initialize(uint64_t seed) const {
  std::vector<float> w(size_);
  std::mt19937_64 rng(seed);
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (const ParameterInfo& p : parameters_) {
    if (!p.decays) {
      std::fill_n(w.begin() + p.offset, p.size, 1.0f);  // norm gains
      continue;
    }
    const bool residual = p.name.ends_with("attn.out") || p.name.ends_with("mlp.down");
    std::normal_distribution<float> normal(0.0f, 0.02f * (residual ? residual_scale : 1.0f));
    for (size_t i = 0; i < p.size; ++i) w[p.offset + i] = normal(rng);
  }
  return w;
}

Result<std::vector<Completion>> Decoder::Generate(const std::vector<std::vector<int>>& prompts,
                                                  const Sampling& params, int threads) const {
  if (weights_.size() != layout_.size())
    return InvalidArgument("decoder: the weights do not match the model's layout");
  return GenerateImpl(layout_, WeightsNow(), weights_, prompts, params, threads);
}

Result<std::vector<Completion>> Decoder::Generate(const TinyLmLayout& layout,
                                                  const WeightsNow& weights,
                                                  const std::vector<std::vector<int>>& prompts,
                                                  const Sampling& params, int threads) {
  if (!weights) return InvalidArgument("decoder: no weights");
  return GenerateImpl(layout, weights, {}, prompts, params, threads);
}

Result<std::vector<Completion>> Decoder::GenerateImpl(const TinyLmLayout& layout_,
                                                      const WeightsNow& source,
                                                      std::span<const float> fixed,
                                                      const std::vector<std::vector<int>>& prompts,
                                                      const Sampling& params, int threads) {
  const TinyLmConfig& c = layout_.config();
  if (!(params.temperature >= 0.0f) || !(params.top_p > 0.0f && params.top_p <= 1.0f) ||
      params.max_tokens < 1) {
    return InvalidArgument("sampling: temperature must be >= 0, top_p in (0, 1], max_tokens >= 1");
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = "prompt " + std::to_string(i);
    if (prompts[i].empty() || prompts[i].size() >= static_cast<size_t>(c.max_seq)) {
      return InvalidArgument(what + ": needs 1 to " + std::to_string(c.max_seq - 1) +
                             " tokens, has " + std::to_string(prompts[i].size()));
    }
    WEFT_RETURN_IF_ERROR(CheckTokens(c, prompts[i], what));
  }
  std::vector<Completion> out(prompts.size());
  ParallelFor(prompts.size(), threads, [&](size_t i) {
    std::mt19937_64 rng(params.seed + i);
    // The weights in use (held while in use when they come from `source`) and their version.
    std::shared_ptr<const VersionedWeights> held;
    auto refresh = [&] {
      if (!source) return;
      std::shared_ptr<const VersionedWeights> now = source();
      if (held && now->version == held->version) return;
      held = std::move(now);
      out[i].segments.emplace_back(held->version, out[i].tokens.size());
    };
    refresh();
    if (!source) out[i].segments.emplace_back(0, 0);
    Run run(layout_, source ? std::span<const float>(held->values) : fixed, false);
    const float* logp = nullptr;
    for (int token : prompts[i]) logp = run.Step(token);
    const int budget =
        std::min<int>(params.max_tokens, c.max_seq - static_cast<int>(prompts[i].size()));
    std::vector<float> probs(c.vocab);
    std::vector<int> order(c.vocab);
    for (int n = 0; n < budget; ++n) {
      int token = 0;
      if (params.temperature == 0.0f) {
        token = static_cast<int>(std::max_element(logp, logp + c.vocab) - logp);
      } else {
        // Sampling distribution: softmax(logp / temperature), cut to the top_p nucleus.
        float top = -1e30f;
        for (int k = 0; k < c.vocab; ++k) top = std::max(top, logp[k] / params.temperature);
        float sum = 0.0f;
        for (int k = 0; k < c.vocab; ++k)
          sum += (probs[k] = std::exp(logp[k] / params.temperature - top));
        for (float& p : probs) p /= sum;
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
        });
        float kept = 0.0f;
        int cut = 0;
        while (cut < c.vocab && (cut == 0 || kept < params.top_p)) kept += probs[order[cut++]];
        std::uniform_real_distribution<float> uniform(0.0f, kept);
        float r = uniform(rng);
        token = order[cut - 1];
        for (int k = 0; k < cut; ++k) {
          r -= probs[order[k]];
          if (r <= 0.0f) {
            token = order[k];
            break;
          }
        }
      }
      out[i].tokens.push_back(token);
      out[i].logprobs.push_back(logp[token]);
      if (token == params.stop_token || n + 1 == budget) break;
      refresh();
      if (held) run.set_weights(held->values.data());
      logp = run.Step(token);
    }
    out[i].version_start = out[i].segments.front().first;
    out[i].version_end = out[i].segments.back().first;
  });
  return out;
}

Result<std::vector<float>> Decoder::Score(const std::vector<int>& tokens) const {
  const TinyLmConfig& c = layout_.config();
  if (tokens.size() < 2 || tokens.size() > static_cast<size_t>(c.max_seq)) {
    return InvalidArgument("score: needs 2 to " + std::to_string(c.max_seq) + " tokens");
  }
  WEFT_RETURN_IF_ERROR(CheckTokens(c, tokens, "score"));
  Run run(layout_, weights_, false);
  std::vector<float> out;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) out.push_back(run.Step(tokens[i])[tokens[i + 1]]);
  return out;
}

Result<double> Trainer::Accumulate(std::span<const float> weights,
                                   const std::vector<TrainingSequence>& batch, const Weigh& weigh,
                                   std::span<float> gradient, int threads) const {
  const TinyLmConfig& c = layout_.config();
  if (weights.size() != layout_.size() || gradient.size() != layout_.size()) {
    return InvalidArgument("trainer: the weights or gradient do not match the model's layout");
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const TrainingSequence& s = batch[i];
    const std::string what = "training sequence " + std::to_string(i);
    if (s.tokens.size() < 2 || s.tokens.size() > static_cast<size_t>(c.max_seq) ||
        s.first_target < 1 || s.first_target >= s.tokens.size()) {
      return InvalidArgument(what + ": needs 2 to " + std::to_string(c.max_seq) +
                             " tokens and a first target inside");
    }
    WEFT_RETURN_IF_ERROR(CheckTokens(c, s.tokens, what));
  }
  const size_t chunks = (batch.size() + kSequencesPerChunk - 1) / kSequencesPerChunk;
  std::vector<std::vector<float>> chunk_grads(chunks);
  std::vector<double> objective(batch.size(), 0.0);
  ParallelFor(chunks, threads, [&](size_t chunk) {
    std::vector<float>& grad = chunk_grads[chunk];
    grad.assign(layout_.size(), 0.0f);
    const size_t end = std::min(batch.size(), (chunk + 1) * kSequencesPerChunk);
    for (size_t i = chunk * kSequencesPerChunk; i < end; ++i) {
      const TrainingSequence& s = batch[i];
      Run run(layout_, weights, true);
      for (size_t p = 0; p + 1 < s.tokens.size(); ++p) run.Step(s.tokens[p]);
      const size_t targets = s.tokens.size() - s.first_target;
      std::vector<float> logprobs(targets), target_weights(targets, 0.0f);
      for (size_t t = 0; t < targets; ++t) {
        const size_t p = s.first_target - 1 + t;
        logprobs[t] = run.logp_at(static_cast<int>(p))[s.tokens[p + 1]];
      }
      weigh(i, logprobs, target_weights);
      std::vector<std::vector<float>> dlogits(run.positions(), std::vector<float>(c.vocab, 0.0f));
      for (size_t t = 0; t < targets; ++t) {
        const size_t p = s.first_target - 1 + t;
        const float w = target_weights[t];
        objective[i] += static_cast<double>(w) * logprobs[t];
        if (w == 0.0f) continue;
        const std::vector<float>& logp = run.logp_at(static_cast<int>(p));
        for (int k = 0; k < c.vocab; ++k) dlogits[p][k] = -w * std::exp(logp[k]);
        dlogits[p][s.tokens[p + 1]] += w;
      }
      run.Backward(dlogits, grad.data());
    }
  });
  for (const std::vector<float>& grad : chunk_grads) {
    for (size_t k = 0; k < grad.size(); ++k) gradient[k] += grad[k];
  }
  return std::accumulate(objective.begin(), objective.end(), 0.0);
}

}  // namespace weft::examples
