// Muon against AdamW on the example policy: how many served elements a version changes, and how
// many bytes its delta takes, when both optimisers make the same learning progress.
//
// TinyLm (the example trainer's model, 336,576 parameters) is warmed up on two-digit addition by
// supervised AdamW steps (examples/real_steps.h), then fine-tuned from those same weights, on the
// same problems step for step, once by AdamW at a fixed learning rate and then by Muon at learning
// rates searched until it makes the same progress:
//   - a run is `settle` unmeasured steps (a fresh optimiser's first steps are unlike its later
//     ones: AdamW's first moves every weight by the full learning rate) and then `steps` measured
//     ones: after each, the served model is updated (BF16, and FP8 E4M3 with 128x128 block
//     scales) and the delta measured;
//   - matched progress: the same held-out loss (mean negative log-likelihood per answer token on
//     512 fixed problems) at the end of the run, within 3% of AdamW's decrease from the warm
//     weights, where every run starts. Muon's learning rate starts at AdamW's (the RMS-matched
//     scaling predicts equal progress) and is corrected by secant steps on the decrease, at most
//     four runs.
// Per run it prints the held-out loss at the start and the end of the run, the RMS of a step's
// update of the hidden matrices over the learning rate (what the RMS matching is about), the mean
// density (changed served elements / served elements, scales included), the density of the
// hidden matrices alone (the tensors Muon moves), the delta's serialized bytes per version, the
// bits per changed element, and the time per optimiser step. Then a Newton-Schulz timing on
// synthetic square tensors (examples/synthetic_adam.h) next to the Adam step on the same tensors.
//
// Usage: optimizer_bench [--quick] [--threads N] [--warmup N] [--settle N] [--steps N]
//                        [--policy-gradient]
// Defaults: a 500-step warm-up (the example trainer's), 10 unmeasured and 20 measured steps.
// --quick: a 150-step warm-up, 5 unmeasured and 10 measured steps, two AdamW learning rates (3e-6,
// about BF16's 1-3% density, and 3e-5 for FP8) instead of four, a smaller synthetic side.
// --policy-gradient: RL steps on sampled groups (examples/real_steps.h) instead of supervised
// steps; the held-out loss still measures progress, which a few RL steps move little and not always
// down (then the search is skipped and says so).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "examples/real_steps.h"
#include "examples/synthetic_adam.h"

namespace weft::bench {
namespace {

using examples::OptimizerKind;
using sync::DType;

struct Flags {
  bool quick = false;
  int threads = 2;
  int warmup = 500;  // the example trainer's
  int settle = 10;
  int steps = 20;
  bool policy_gradient = false;
};

struct Format {
  const char* name;
  sync::ServingPlan plan;
};

const Format kFormats[] = {
    {"bf16", {DType::kBF16, 128, sync::Saturation::kSaturateFinite}},
    {"fp8-block128", {DType::kF8E4M3, 128, sync::Saturation::kSaturateFinite}}};
constexpr size_t kFormatCount = sizeof(kFormats) / sizeof(kFormats[0]);

// What one served format saw over the measured steps.
struct Served {
  double density = 0;         // mean over versions
  double hidden_density = 0;  // the same, over the hidden matrices' elements only
  double bytes = 0;           // mean delta bytes per version
  double context_bytes = 0;   // the same, context-coded
  double changed = 0;         // mean changed elements per version
};

struct RunResult {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double learning_rate = 0;
  double loss_start = 0, loss_end = 0;  // held-out, at the warm weights and after the run
  double step_ms = 0;                   // optimiser step (gradient included)
  double update_rms = 0;  // of the hidden matrices' per-step update, over the learning rate
  Served served[kFormatCount];
  double progress() const { return loss_start - loss_end; }
};

bool IsHidden(const std::string& name) {
  for (const char* suffix : {"attn.qkv", "attn.out", "mlp.up", "mlp.down"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

// Changed elements of the hidden matrices between two states of the same served model.
void CountHidden(const sync::ServedModel& model, const std::vector<std::vector<uint8_t>>& before,
                 uint64_t* changed, uint64_t* total) {
  for (size_t t = 0; t < model.tensors().size(); ++t) {
    const sync::ServedModel::Tensor& tensor = model.tensors()[t];
    if (!IsHidden(tensor.spec.name)) continue;
    const size_t width = sync::Info(tensor.spec.dtype).size;
    for (size_t i = 0; i < tensor.bytes.size(); i += width)
      *changed += std::memcmp(&tensor.bytes[i], &before[t][i], width) != 0;
    *total += tensor.bytes.size() / width;
  }
}

// The RMS of `after` - `before` over the hidden matrices.
double HiddenUpdateRms(const examples::TinyLmLayout& layout, const std::vector<float>& before,
                       const std::vector<float>& after) {
  double squares = 0;
  size_t count = 0;
  for (const examples::ParameterInfo& p : layout.parameters()) {
    if (!IsHidden(p.name)) continue;
    for (size_t k = p.offset; k < p.offset + p.size; ++k) {
      const double moved = static_cast<double>(after[k]) - before[k];
      squares += moved * moved;
    }
    count += p.size;
  }
  return std::sqrt(squares / static_cast<double>(count));
}

RunResult Run(const examples::RealStepsOptions& base, const std::vector<float>& warm,
              OptimizerKind optimizer, double learning_rate, const Flags& flags) {
  examples::RealStepsOptions options = base;
  options.optimizer = optimizer;
  options.optimizer_config.learning_rate = learning_rate;
  Result<std::unique_ptr<examples::RealSteps>> created = examples::RealSteps::Create(options, warm);
  Check(created.status(), "creating the steps");
  examples::RealSteps& run = **created;
  RunResult result;
  result.optimizer = optimizer;
  result.learning_rate = learning_rate;
  Result<double> start = run.HeldOutLoss();
  Check(start.status(), "held-out loss");
  result.loss_start = *start;
  for (int i = 0; i < flags.settle; ++i) Check(run.Step().status(), "settling step");
  std::vector<sync::ServedModel> served;
  for (const Format& format : kFormats) {
    Result<sync::ServedModel> model =
        sync::ServedModel::FromMaster(run.Master(), format.plan, flags.threads);
    Check(model.status(), "serving the weights");
    served.push_back(std::move(*model));
  }
  sync::CodecOptions codec;
  codec.threads = flags.threads;
  double step_seconds = 0;
  for (int i = 0; i < flags.steps; ++i) {
    const std::vector<float> previous = run.weights();
    const auto began = Clock::now();
    Result<examples::RealStep> step = run.Step();
    step_seconds += Seconds(began);
    Check(step.status(), "step");
    result.update_rms +=
        HiddenUpdateRms(run.layout(), previous, run.weights()) / learning_rate / flags.steps;
    for (size_t f = 0; f < kFormatCount; ++f) {
      std::vector<std::vector<uint8_t>> before;
      for (const sync::ServedModel::Tensor& tensor : served[f].tensors())
        before.push_back(tensor.bytes.ToVector());
      uint64_t changed = 0;
      Result<sync::ModelDelta> delta = served[f].Update(run.Master(), codec, &changed);
      Check(delta.status(), "updating the served model");
      uint64_t hidden_changed = 0, hidden_total = 0;
      CountHidden(served[f], before, &hidden_changed, &hidden_total);
      Served& s = result.served[f];
      s.density += static_cast<double>(changed) / served[f].element_count() / flags.steps;
      s.hidden_density += static_cast<double>(hidden_changed) / hidden_total / flags.steps;
      s.bytes += static_cast<double>(sync::SerializedSize(*delta)) / flags.steps;
      Result<sync::ModelDelta> context = sync::RecodeModelDelta(
          *delta, sync::DeltaMode::kContext, {}, served[f].AsTensorBytes(), flags.threads);
      Check(context.status(), "recoding the delta");
      s.context_bytes += static_cast<double>(sync::SerializedSize(*context)) / flags.steps;
      s.changed += static_cast<double>(changed) / flags.steps;
    }
  }
  result.step_ms = 1e3 * step_seconds / flags.steps;
  Result<double> end = run.HeldOutLoss();
  Check(end.status(), "held-out loss");
  result.loss_end = *end;
  return result;
}

void PrintSearch(const RunResult& r, double target) {
  std::printf("    muon lr %.3g: held-out loss decrease %.3e (%.1f%% of AdamW's)\n",
              r.learning_rate, r.progress(), 100.0 * r.progress() / target);
  std::fflush(stdout);
}

// Muon at the learning rate that matches `adamw`'s progress (see the top of the file).
RunResult MatchMuon(const examples::RealStepsOptions& base, const std::vector<float>& warm,
                    const RunResult& adamw, const Flags& flags) {
  const double target = adamw.progress();
  RunResult best = Run(base, warm, OptimizerKind::kMuon, adamw.learning_rate, flags);
  PrintSearch(best, target);
  if (!(target > 0)) {
    std::printf("    AdamW made no progress to match: Muon at its learning rate\n");
    return best;
  }
  RunResult previous = best;
  for (int run = 1; run < 4 && std::fabs(best.progress() / target - 1.0) > 0.03; ++run) {
    // Secant through the last two runs; through the origin after the first (progress is about
    // proportional to the learning rate at these sizes).
    double next = previous.learning_rate == best.learning_rate
                      ? best.learning_rate * target / best.progress()
                      : best.learning_rate + (target - best.progress()) *
                                                 (best.learning_rate - previous.learning_rate) /
                                                 (best.progress() - previous.progress());
    if (!(next > 0) || !std::isfinite(next)) next = best.learning_rate * 2;
    next = std::clamp(next, best.learning_rate / 10, best.learning_rate * 10);
    previous = best;
    RunResult tried = Run(base, warm, OptimizerKind::kMuon, next, flags);
    PrintSearch(tried, target);
    if (std::fabs(tried.progress() - target) <= std::fabs(best.progress() - target)) {
      best = tried;
    } else {
      previous = tried;
    }
  }
  return best;
}

void PrintRow(const RunResult& r, size_t f, const RunResult& adamw) {
  const Served& s = r.served[f];
  std::printf(
      "%-14s %-6s %9.3g %6.1f%% %8.4f %8.4f %10.3e %7.3f %8.3f%% %8.3f%% %10.0f %8.2f %10.0f %8.2f "
      "%8.1f\n",
      kFormats[f].name, std::string(examples::OptimizerName(r.optimizer)).c_str(), r.learning_rate,
      100.0 * r.progress() / adamw.progress(), r.loss_start, r.loss_end, r.progress(), r.update_rms,
      100.0 * s.density, 100.0 * s.hidden_density, s.bytes,
      s.changed > 0 ? 8.0 * s.bytes / s.changed : 0.0, s.context_bytes,
      s.changed > 0 ? 8.0 * s.context_bytes / s.changed : 0.0, r.step_ms);
}

// Seconds per Step() of `workload` (after one untimed step).
template <typename Workload>
double StepSeconds(Workload& workload, int steps, int threads) {
  workload.Step(threads);
  const auto began = Clock::now();
  for (int i = 0; i < steps; ++i) workload.Step(threads);
  return Seconds(began) / steps;
}

}  // namespace
}  // namespace weft::bench

int main(int argc, char** argv) {
  using namespace weft;
  using namespace weft::bench;
  Flags flags;
  bool warmup_set = false, settle_set = false, steps_set = false;
  for (int i = 1; i < argc; ++i) {
    auto number = [&](int* out) {
      if (i + 1 >= argc) return false;
      *out = std::atoi(argv[++i]);
      return true;
    };
    bool ok = true;
    if (std::strcmp(argv[i], "--quick") == 0) {
      flags.quick = true;
    } else if (std::strcmp(argv[i], "--policy-gradient") == 0) {
      flags.policy_gradient = true;
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      ok = number(&flags.threads) && flags.threads >= 1;
    } else if (std::strcmp(argv[i], "--warmup") == 0) {
      ok = number(&flags.warmup) && flags.warmup >= 0;
      warmup_set = true;
    } else if (std::strcmp(argv[i], "--settle") == 0) {
      ok = number(&flags.settle) && flags.settle >= 0;
      settle_set = true;
    } else if (std::strcmp(argv[i], "--steps") == 0) {
      ok = number(&flags.steps) && flags.steps >= 1;
      steps_set = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: optimizer_bench [--quick] [--threads N] [--warmup N] [--settle N] "
                   "[--steps N] [--policy-gradient]\n");
      return 2;
    }
  }
  if (flags.quick && !warmup_set) flags.warmup = 150;
  if (flags.quick && !settle_set) flags.settle = 5;
  if (flags.quick && !steps_set) flags.steps = 10;

  examples::RealStepsOptions options;
  options.threads = flags.threads;
  options.warmup_steps = flags.warmup;
  if (flags.policy_gradient) options.kind = examples::RealStepKind::kPolicyGradient;
  const auto began = Clock::now();
  std::printf("TinyLm %zu parameters; warm-up: %d supervised AdamW steps of %d at lr %.0e\n",
              examples::RealStepsLayout(options).size(), options.warmup_steps, options.warmup_batch,
              options.warmup_learning_rate);
  std::fflush(stdout);
  Result<std::vector<float>> warm = examples::WarmUpWeights(options, [&](int step, double loss) {
    if (step % 50 == 0 || step == options.warmup_steps) {
      std::printf("  warm-up step %d: batch loss %.4f\n", step, loss);
      std::fflush(stdout);
    }
  });
  Check(warm.status(), "warm-up");
  std::printf("%s steps: %d unmeasured, then %d measured; %d threads\n",
              flags.policy_gradient ? "policy-gradient" : "supervised", flags.settle, flags.steps,
              flags.threads);

  // AdamW learning rates around 1-3% BF16 density, and FP8's (which needs about ten times more
  // for a similar density).
  const std::vector<double> rates =
      flags.quick ? std::vector<double>{3e-6, 3e-5} : std::vector<double>{1e-6, 3e-6, 1e-5, 3e-5};
  std::vector<std::pair<RunResult, RunResult>> pairs;
  for (double lr : rates) {
    std::printf("  adamw lr %.3g ...\n", lr);
    std::fflush(stdout);
    RunResult adamw = Run(options, *warm, OptimizerKind::kAdamW, lr, flags);
    std::printf("    adamw lr %.3g: held-out loss decrease %.3e\n", lr, adamw.progress());
    RunResult muon = MatchMuon(options, *warm, adamw, flags);
    pairs.emplace_back(adamw, muon);
  }

  std::printf(
      "\nMuon against AdamW at matched progress (held-out loss at the end within 3%% of AdamW's "
      "decrease)\n"
      "%-14s %-6s %9s %7s %8s %8s %10s %7s %9s %9s %10s %8s %10s %8s %8s\n",
      "format", "opt", "lr", "progr", "loss0", "loss1", "decrease", "upd/lr", "density", "hidden",
      "bytes/ver", "bits/chg", "ctx bytes", "ctx bits", "step ms");
  for (size_t f = 0; f < kFormatCount; ++f) {
    for (const auto& [adamw, muon] : pairs) {
      PrintRow(adamw, f, adamw);
      PrintRow(muon, f, adamw);
    }
  }
  std::printf(
      "\nprogr: decrease as a percentage of AdamW's; upd/lr: RMS of a step's update of the "
      "hidden matrices over the learning rate; density: changed served elements / served "
      "elements (FP8 scales included), mean per version; hidden: the same over the hidden "
      "matrices; bytes/ver: SerializedSize of the version's delta; bits/chg: 8 x bytes / changed "
      "elements; ctx: the same delta context-coded\n");

  // Synthetic square projections: Newton-Schulz's cost next to Adam's elementwise step.
  const uint64_t side = flags.quick ? 256 : 512;
  const std::vector<examples::SyntheticTensor> shapes = examples::ProjectionShapes(side, 4);
  examples::AdamConfig adam_config;
  examples::SyntheticAdam adam(shapes, adam_config, 7, flags.threads);
  examples::SyntheticMuonConfig muon_config;
  examples::SyntheticMuon muon(shapes, muon_config, 7, flags.threads);
  const double adam_seconds = StepSeconds(adam, 3, flags.threads);
  const double muon_seconds = StepSeconds(muon, flags.quick ? 2 : 1, flags.threads);
  std::printf("\nsynthetic: 4 tensors of %" PRIu64
              "^2, one step: Adam %.2f ms, Muon %.1f ms (%.0fx; "
              "Newton-Schulz %.1f GFLOP/s)\n",
              side, 1e3 * adam_seconds, 1e3 * muon_seconds, muon_seconds / adam_seconds,
              4 * 30.0 * static_cast<double>(side * side * side) / muon_seconds / 1e9);
  std::printf("total %.0f s\n", Seconds(began));
  return 0;
}
