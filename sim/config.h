// The simulator's configuration: one YAML file describing a fleet, a model, a trainer and the
// faults to inject (docs/sim.md, "Configuration"). Unknown keys and bad values are errors naming
// the file, the key and the line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "orchestrator/core.h"

namespace weft::sim {

using orchestrator::Micros;

// A positive quantity drawn per use: lognormal around `median` (sigma 0: always the median).
struct Spread {
  double median = 1;
  double sigma = 0;
};

struct RegionConfig {
  std::string name;
  double bandwidth = 1.25e9;      // bytes/s of the WAN link from the store into the region
  Micros latency = 50'000;        // one way, per request over the WAN
  bool relay = true;              // a caching relay in the region (else clusters fetch over WAN)
  uint64_t relay_cache = 0;       // bytes the relay keeps (LRU); 0: unlimited
  double lan_bandwidth = 12.5e9;  // bytes/s from the relay to each cluster
  uint32_t clusters = 1;          // at the start
  uint32_t capacity = 16;         // jobs each cluster generates at once
  double speed = 1;               // the region's clusters generate this much faster
};

struct ModelConfig {
  double parameters = 1e9;
  std::string format = "bf16";  // bf16 or fp8 (block-scaled, 128x128 FP32 scales)
  double density = 0.01;        // fraction of served elements a version changes
  // Piecewise constant (step, density) pairs by increasing step; overrides `density` from each
  // step on. Also filled from a `weft run` report's per-step densities (densities_from).
  std::vector<std::pair<uint64_t, double>> density_schedule;
  double bits_per_change = 0;  // delta bits per changed element; 0: the format's default
  uint64_t keyframe_interval = 50;
  double delta_budget = 0.5;  // a keyframe once deltas since the last exceed this x its size
  uint32_t max_skip_level = 10;
  double apply_throughput = 50e9;   // served bytes/s a cluster applies a delta over
  double load_throughput = 50e9;    // keyframe bytes/s a cluster loads
  double encode_throughput = 20e9;  // served bytes/s the trainer encodes a delta over

  double BytesPerElement() const;  // served bytes per parameter, scales included
  double ServedBytes() const { return parameters * BytesPerElement(); }
  double DensityAt(uint64_t version) const;
};

struct TrainerConfig {
  Micros step_time = 60'000'000;
  double step_jitter = 0;  // lognormal sigma
  uint32_t prompts_per_step = 512;
  uint32_t samples_per_prompt = 16;
  uint32_t steps_ahead = 2;
  double upload_bandwidth = 12.5e9;  // bytes/s from the trainer to the store
  uint64_t steps = 0;                // 0: until the simulated time runs out
};

struct GenerationConfig {
  Spread response_tokens{2000, 0.5};  // tokens of a job's longest sample
  Spread tokens_per_second{50, 0.2};  // decode speed of one sequence
  double straggler_fraction = 0;      // clusters this much slower for the whole run
  double straggler_slowdown = 3;
};

struct ClusterConfig {
  Micros heartbeat = 5'000'000;
  // How a cluster hears of a new version: pushed (the worker's default: its long poll at the relay,
  // or at the store without one, answered once the store's answer crosses the region's link), or
  // by reading `latest` every sync_interval.
  bool push = true;
  Micros sync_interval = 100'000;  // with push off: how often a cluster looks for a newer version
  Micros lease_wait = 2'000'000;   // a cluster that got nothing asks again after this
  double crash_rate = 0;           // crashes per cluster-hour (no notice)
  Micros restart_after = 300'000'000;
  // The clusters of the start hold the first version already (its keyframe staged in the
  // regions before the run); clusters that join or restart later pull it.
  bool preloaded = false;
};

struct Fault {
  enum class Kind {
    kOrchestratorCrash,
    kPartition,
    kRelayDown,
    kStoreDown,
    kPreempt,
    kJoin,
    kLeave
  };
  Kind kind = Kind::kOrchestratorCrash;
  Micros at = 0;
  Micros duration = 0;  // 0 with preempt and leave: the clusters do not come back
  std::string region;   // partition, relay_down, join, leave; preempt: empty for every region
  double fraction = 0;  // preempt
  uint32_t count = 0;   // join, leave
  Micros notice = 0;    // preempt, leave: time to finish work before going
};
const char* FaultName(Fault::Kind kind);

// A run of the same scenario with a few settings changed (sweeps).
struct Variant {
  std::string name;
  std::optional<uint64_t> max_staleness;
  std::optional<orchestrator::DispatchPolicy> dispatch;
  std::optional<bool> relays;
  std::optional<double> fleet_scale;  // clusters per region scaled (rounded, at least 1)
};

struct SimConfig {
  std::string name = "sim";
  uint64_t seed = 1;
  Micros duration = 3'600'000'000;
  orchestrator::CoreConfig core;
  Micros tick = 1'000'000;
  uint64_t checkpoint_every = 50'000;  // journaled calls between the in-memory checkpoints
  TrainerConfig trainer;
  ModelConfig model;
  GenerationConfig generation;
  ClusterConfig cluster;
  std::vector<RegionConfig> regions;
  std::vector<Fault> faults;
  std::vector<Variant> variants;
};

Result<SimConfig> LoadSimConfig(const std::string& path);

// The memory a run of `config` will hold at its peak, estimated from its sizes before it starts
// (docs/sim.md, "Bounds"): what grows with the versions the run publishes (their manifests, plans
// and publication-to-ready records per region and cluster), with the jobs in flight, with every
// job of the run, with the clusters, and with the journal model between checkpoints. An upper
// estimate: runs measured here stay below it.
struct MemoryEstimate {
  double bytes = 0;
  double versions = 0, clusters = 0, jobs_in_flight = 0, jobs = 0;
  std::string Describe() const;  // "about 3.1 GiB: 576001 versions, 1000 clusters, ..."
};
MemoryEstimate EstimateMemory(const SimConfig& config);
// What `weft sim` refuses to start past unless told otherwise (--max-memory).
inline constexpr double kDefaultSimMemoryLimit = 8.0 * (1ull << 30);
// The configuration with a variant's settings applied.
SimConfig WithVariant(const SimConfig& config, const Variant& variant);
// The runs a file describes: ("base", the file as written), then each variant by name.
std::vector<std::pair<std::string, SimConfig>> Runs(const SimConfig& config);
// The scenario shrunk for many quick runs (tests, the seed sweep of bench/sim_bench): at most
// `clusters` clusters (each region scaled alike, at least one), the trainer's batch scaled with
// them, at most `duration` of simulated time, and the faults moved into its first half.
SimConfig Shrunk(const SimConfig& config, uint32_t clusters, Micros duration);

}  // namespace weft::sim
