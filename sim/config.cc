#include "sim/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "common/json_fields.h"
#include "common/yaml_fields.h"
#include "orchestrator/core_config.h"

namespace weft::sim {
namespace {

using orchestrator::DispatchPolicy;

// The longest span any duration of a simulation may have (the run's own included).
constexpr std::chrono::microseconds kLongestDuration = std::chrono::hours(24 * 400);

std::string Line(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? "" : " (line " + std::to_string(mark.line + 1) + ")";
}

// Parsing with the file named in every error.
class Reader {
 public:
  // `path` names the file in errors; `file` is the one relative paths in it start from.
  Reader(std::string path, std::string file) : path_(std::move(path)), file_(std::move(file)) {}

  Status Wrap(const Status& status) const {
    return status.ok() ? status : status.WithContext(path_);
  }
  Status Error(const std::string& where, const YAML::Node& node, const std::string& what) const {
    return InvalidArgument(path_ + ": " + where + ": " + what + Line(node));
  }
  Status Keys(const YAML::Node& node, const std::string& where,
              const std::set<std::string>& allowed) const {
    return Wrap(CheckKeys(node, where, allowed));
  }
  Status Duration(const YAML::Node& node, const std::string& where, const std::string& key,
                  Micros* out) const {
    std::chrono::microseconds value(*out);
    WEFT_RETURN_IF_ERROR(Wrap(ReadDuration(node, where, key, &value)));
    if (value > kLongestDuration)
      return Error(where + "." + key, node[key], "must be at most 400 days");
    *out = value.count();
    return Status::Ok();
  }
  // Bytes ("10GB") or bytes per second for a bandwidth.
  Status Bytes(const YAML::Node& node, const std::string& where, const std::string& key,
               double* out, bool positive = true) const {
    uint64_t value = static_cast<uint64_t>(*out);
    WEFT_RETURN_IF_ERROR(Wrap(ReadBytes(node, where, key, &value)));
    if (positive && value == 0) return Error(where + "." + key, node[key], "must be positive");
    *out = static_cast<double>(value);
    return Status::Ok();
  }
  Status Number(const YAML::Node& node, const std::string& where, const std::string& key,
                double* out, double low, double high) const {
    WEFT_RETURN_IF_ERROR(Wrap(ReadDouble(node, where, key, out)));
    if (!(*out >= low && *out <= high)) {
      return Error(where + "." + key, node[key],
                   "must be from " + Format(low) + " to " + Format(high));
    }
    return Status::Ok();
  }
  Status Count(const YAML::Node& node, const std::string& where, const std::string& key,
               uint32_t* out, uint64_t low, uint64_t high) const {
    uint64_t value = *out;
    WEFT_RETURN_IF_ERROR(Wrap(ReadUnsigned(node, where, key, &value)));
    if (value < low || value > high) {
      return Error(where + "." + key, node[key],
                   "must be from " + std::to_string(low) + " to " + std::to_string(high));
    }
    *out = static_cast<uint32_t>(value);
    return Status::Ok();
  }
  Status Bool(const YAML::Node& node, const std::string& where, const std::string& key,
              bool* out) const {
    std::string text = *out ? "true" : "false";
    WEFT_RETURN_IF_ERROR(Wrap(ReadString(node, where, key, &text)));
    if (text != "true" && text != "false")
      return Error(where + "." + key, node[key], "'" + text + "' is not true or false");
    *out = text == "true";
    return Status::Ok();
  }
  Status SpreadOf(const YAML::Node& node, const std::string& where, const std::string& key,
                  Spread* out) const {
    const YAML::Node value = node[key];
    if (!value) return Status::Ok();
    const std::string at = where + "." + key;
    if (value.IsScalar()) {
      out->sigma = 0;
      return Number(node, where, key, &out->median, 1e-9, 1e12);
    }
    WEFT_RETURN_IF_ERROR(Keys(value, at, {"median", "sigma"}));
    WEFT_RETURN_IF_ERROR(Number(value, at, "median", &out->median, 1e-9, 1e12));
    return Number(value, at, "sigma", &out->sigma, 0, 3);
  }
  // `name` relative to the configuration file's folder (absolute names as they are).
  std::string Relative(const std::string& name) const {
    if (name.empty() || name[0] == '/') return name;
    const size_t slash = file_.rfind('/');
    return slash == std::string::npos ? name : file_.substr(0, slash + 1) + name;
  }

 private:
  static std::string Format(double x) {
    std::ostringstream text;
    text << x;
    return text.str();
  }
  std::string path_;
  std::string file_;
};

Status ParseRegions(const Reader& r, const YAML::Node& list, std::vector<RegionConfig>* regions) {
  if (!list || !list.IsSequence() || list.size() == 0)
    return r.Error("regions", list, "must be a list of at least one region");
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    const std::string where = "regions[" + std::to_string(i) + "]";
    RegionConfig region;
    WEFT_RETURN_IF_ERROR(r.Keys(n, where,
                                {"name", "bandwidth", "latency", "relay", "relay_cache",
                                 "lan_bandwidth", "clusters", "capacity", "speed"}));
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "name", &region.name)));
    if (region.name.empty()) return r.Error(where, n, "needs a name");
    if (!names.insert(region.name).second)
      return r.Error(where + ".name", n["name"], "'" + region.name + "' is named twice");
    WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "bandwidth", &region.bandwidth));
    WEFT_RETURN_IF_ERROR(r.Duration(n, where, "latency", &region.latency));
    WEFT_RETURN_IF_ERROR(r.Bool(n, where, "relay", &region.relay));
    double cache = static_cast<double>(region.relay_cache);
    WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "relay_cache", &cache, false));
    region.relay_cache = static_cast<uint64_t>(cache);
    WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "lan_bandwidth", &region.lan_bandwidth));
    WEFT_RETURN_IF_ERROR(r.Count(n, where, "clusters", &region.clusters, 0, 100000));
    WEFT_RETURN_IF_ERROR(r.Count(n, where, "capacity", &region.capacity, 1, 1000000));
    WEFT_RETURN_IF_ERROR(r.Number(n, where, "speed", &region.speed, 1e-3, 1e3));
    regions->push_back(region);
  }
  return Status::Ok();
}

Result<Fault::Kind> FaultKind(const std::string& name) {
  for (Fault::Kind kind :
       {Fault::Kind::kOrchestratorCrash, Fault::Kind::kPartition, Fault::Kind::kRelayDown,
        Fault::Kind::kStoreDown, Fault::Kind::kPreempt, Fault::Kind::kJoin, Fault::Kind::kLeave}) {
    if (name == FaultName(kind)) return kind;
  }
  return InvalidArgument("'" + name +
                         "' is not orchestrator_crash, partition, relay_down, store_down, "
                         "preempt, join or leave");
}

Status ParseFaults(const Reader& r, const YAML::Node& list, const SimConfig& config,
                   std::vector<Fault>* faults) {
  if (!list) return Status::Ok();
  if (!list.IsSequence()) return r.Error("faults", list, "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    const std::string where = "faults[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(
        r.Keys(n, where, {"kind", "at", "duration", "region", "fraction", "count", "notice"}));
    Fault fault;
    std::string kind;
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "kind", &kind)));
    Result<Fault::Kind> parsed = FaultKind(kind);
    if (!parsed.ok()) return r.Error(where + ".kind", n["kind"], parsed.status().message());
    fault.kind = *parsed;
    if (!n["at"]) return r.Error(where, n, "needs 'at' (when the fault starts)");
    WEFT_RETURN_IF_ERROR(r.Duration(n, where, "at", &fault.at));
    WEFT_RETURN_IF_ERROR(r.Duration(n, where, "duration", &fault.duration));
    WEFT_RETURN_IF_ERROR(r.Duration(n, where, "notice", &fault.notice));
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "region", &fault.region)));
    WEFT_RETURN_IF_ERROR(r.Number(n, where, "fraction", &fault.fraction, 0, 1));
    WEFT_RETURN_IF_ERROR(r.Count(n, where, "count", &fault.count, 0, 100000));
    const bool regional = fault.kind == Fault::Kind::kPartition ||
                          fault.kind == Fault::Kind::kRelayDown ||
                          fault.kind == Fault::Kind::kJoin || fault.kind == Fault::Kind::kLeave;
    if (regional && fault.region.empty()) return r.Error(where, n, kind + " needs a region");
    if (!fault.region.empty() &&
        std::none_of(config.regions.begin(), config.regions.end(),
                     [&](const RegionConfig& x) { return x.name == fault.region; })) {
      return r.Error(where + ".region", n["region"], "'" + fault.region + "' is not a region");
    }
    const bool timed =
        fault.kind == Fault::Kind::kOrchestratorCrash || fault.kind == Fault::Kind::kPartition ||
        fault.kind == Fault::Kind::kRelayDown || fault.kind == Fault::Kind::kStoreDown;
    if (timed && fault.duration <= 0) return r.Error(where, n, kind + " needs a duration");
    if (fault.kind == Fault::Kind::kPreempt && fault.fraction <= 0)
      return r.Error(where, n, "preempt needs a fraction above 0");
    if ((fault.kind == Fault::Kind::kJoin || fault.kind == Fault::Kind::kLeave) && fault.count == 0)
      return r.Error(where, n, kind + " needs a count above 0");
    faults->push_back(fault);
  }
  std::stable_sort(faults->begin(), faults->end(),
                   [](const Fault& a, const Fault& b) { return a.at < b.at; });
  return Status::Ok();
}

Status ParseVariants(const Reader& r, const YAML::Node& list, std::vector<Variant>* variants) {
  if (!list) return Status::Ok();
  if (!list.IsSequence()) return r.Error("variants", list, "must be a list");
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    const std::string where = "variants[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(
        r.Keys(n, where, {"name", "max_staleness", "dispatch", "relays", "fleet_scale"}));
    Variant v;
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "name", &v.name)));
    if (v.name.empty()) return r.Error(where, n, "needs a name");
    if (!names.insert(v.name).second)
      return r.Error(where + ".name", n["name"], "'" + v.name + "' is named twice");
    if (n["max_staleness"]) {
      uint64_t k = 0;
      WEFT_RETURN_IF_ERROR(r.Wrap(ReadUnsigned(n, where, "max_staleness", &k)));
      v.max_staleness = k;
    }
    if (n["dispatch"]) {
      std::string name;
      WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "dispatch", &name)));
      Result<DispatchPolicy> policy = orchestrator::ParseDispatch(name);
      if (!policy.ok())
        return r.Error(where + ".dispatch", n["dispatch"], policy.status().message());
      v.dispatch = *policy;
    }
    if (n["relays"]) {
      bool relays = true;
      WEFT_RETURN_IF_ERROR(r.Bool(n, where, "relays", &relays));
      v.relays = relays;
    }
    if (n["fleet_scale"]) {
      double scale = 1;
      WEFT_RETURN_IF_ERROR(r.Number(n, where, "fleet_scale", &scale, 1e-3, 100));
      v.fleet_scale = scale;
    }
    variants->push_back(v);
  }
  return Status::Ok();
}

// The per-step densities of a `weft run` report (its per_step[].density), as a schedule.
Status ReadDensities(const Reader& r, const YAML::Node& node, const std::string& file,
                     ModelConfig* model) {
  // A run report is a few megabytes at most: read within a bound, strictly (no repeated keys).
  Result<std::string> text = ReadTextFile(file, uint64_t{256} << 20, "a run report");
  if (!text.ok()) return r.Error("model.densities_from", node, text.status().message());
  Result<nlohmann::json> parsed = ParseStrict(*text, file);
  if (!parsed.ok()) return r.Error("model.densities_from", node, parsed.status().message());
  nlohmann::json& report = *parsed;
  if (!report.is_object() || !report.contains("per_step") || !report["per_step"].is_array()) {
    return r.Error("model.densities_from", node,
                   "'" + file + "' is not a weft run report (no per_step list)");
  }
  model->density_schedule.clear();
  for (const nlohmann::json& step : report["per_step"]) {
    if (!step.is_object() || !step.contains("version") || !step.contains("density") ||
        !step["version"].is_number_unsigned() || !step["density"].is_number()) {
      return r.Error("model.densities_from", node,
                     "'" + file + "': a per_step entry lacks version or density");
    }
    const double density = step["density"].get<double>();
    if (!(density >= 0 && density <= 1))
      return r.Error("model.densities_from", node, "'" + file + "': a density outside 0..1");
    model->density_schedule.emplace_back(step["version"].get<uint64_t>(), density);
  }
  if (model->density_schedule.empty())
    return r.Error("model.densities_from", node, "'" + file + "' has no steps");
  std::stable_sort(model->density_schedule.begin(), model->density_schedule.end());
  return Status::Ok();
}

Status ParseModel(const Reader& r, const YAML::Node& n, ModelConfig* model) {
  if (!n) return Status::Ok();
  const std::string where = "model";
  WEFT_RETURN_IF_ERROR(
      r.Keys(n, where,
             {"parameters", "format", "density", "density_schedule", "densities_from",
              "bits_per_change", "keyframe_interval", "delta_budget", "max_skip_level",
              "apply_throughput", "load_throughput", "encode_throughput"}));
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "parameters", &model->parameters, 1, 1e15));
  WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "format", &model->format)));
  if (model->format != "bf16" && model->format != "fp8")
    return r.Error(where + ".format", n["format"], "'" + model->format + "' is not bf16 or fp8");
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "density", &model->density, 0, 1));
  if (const YAML::Node s = n["density_schedule"]) {
    if (!s.IsSequence() || s.size() == 0)
      return r.Error(where + ".density_schedule", s, "must be a list of [step, density]");
    for (size_t i = 0; i < s.size(); ++i) {
      const YAML::Node e = s[i];
      double step = -1, density = -1;
      if (e.IsSequence() && e.size() == 2) {
        try {
          step = e[0].as<double>();
          density = e[1].as<double>();
        } catch (const YAML::Exception&) {
        }
      }
      if (!(step >= 0 && density >= 0 && density <= 1) ||
          (!model->density_schedule.empty() && step <= model->density_schedule.back().first)) {
        return r.Error(where + ".density_schedule[" + std::to_string(i) + "]", e,
                       "must be [step, density] with increasing steps and a density in 0..1");
      }
      model->density_schedule.emplace_back(static_cast<uint64_t>(step), density);
    }
  }
  if (n["densities_from"]) {
    std::string file;
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "densities_from", &file)));
    WEFT_RETURN_IF_ERROR(ReadDensities(r, n["densities_from"], r.Relative(file), model));
  }
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "bits_per_change", &model->bits_per_change, 0, 64));
  uint64_t interval = model->keyframe_interval;
  WEFT_RETURN_IF_ERROR(r.Wrap(ReadUnsigned(n, where, "keyframe_interval", &interval)));
  if (interval < 1) return r.Error(where + ".keyframe_interval", n, "must be at least 1");
  model->keyframe_interval = interval;
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "delta_budget", &model->delta_budget, 0, 1e6));
  WEFT_RETURN_IF_ERROR(r.Count(n, where, "max_skip_level", &model->max_skip_level, 0, 40));
  WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "apply_throughput", &model->apply_throughput));
  WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "load_throughput", &model->load_throughput));
  WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "encode_throughput", &model->encode_throughput));
  return Status::Ok();
}

Status ParseTrainer(const Reader& r, const YAML::Node& n, TrainerConfig* trainer) {
  if (!n) return Status::Ok();
  const std::string where = "trainer";
  WEFT_RETURN_IF_ERROR(r.Keys(n, where,
                              {"step_time", "step_jitter", "prompts_per_step", "samples_per_prompt",
                               "steps_ahead", "upload_bandwidth", "steps"}));
  WEFT_RETURN_IF_ERROR(r.Duration(n, where, "step_time", &trainer->step_time));
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "step_jitter", &trainer->step_jitter, 0, 3));
  WEFT_RETURN_IF_ERROR(
      r.Count(n, where, "prompts_per_step", &trainer->prompts_per_step, 1, 10'000'000));
  WEFT_RETURN_IF_ERROR(
      r.Count(n, where, "samples_per_prompt", &trainer->samples_per_prompt, 1, 100'000));
  WEFT_RETURN_IF_ERROR(r.Count(n, where, "steps_ahead", &trainer->steps_ahead, 1, 1000));
  WEFT_RETURN_IF_ERROR(r.Bytes(n, where, "upload_bandwidth", &trainer->upload_bandwidth));
  WEFT_RETURN_IF_ERROR(r.Wrap(ReadUnsigned(n, where, "steps", &trainer->steps)));
  if (trainer->steps > 100'000'000)
    return r.Error(where + ".steps", n["steps"], "must be at most 100000000");
  if (trainer->step_time <= 0)
    return r.Error(where + ".step_time", n["step_time"], "must be positive");
  return Status::Ok();
}

Status ParseGeneration(const Reader& r, const YAML::Node& n, GenerationConfig* generation) {
  if (!n) return Status::Ok();
  const std::string where = "generation";
  WEFT_RETURN_IF_ERROR(
      r.Keys(n, where,
             {"response_tokens", "tokens_per_second", "straggler_fraction", "straggler_slowdown"}));
  WEFT_RETURN_IF_ERROR(r.SpreadOf(n, where, "response_tokens", &generation->response_tokens));
  WEFT_RETURN_IF_ERROR(r.SpreadOf(n, where, "tokens_per_second", &generation->tokens_per_second));
  WEFT_RETURN_IF_ERROR(
      r.Number(n, where, "straggler_fraction", &generation->straggler_fraction, 0, 1));
  WEFT_RETURN_IF_ERROR(
      r.Number(n, where, "straggler_slowdown", &generation->straggler_slowdown, 1, 1000));
  return Status::Ok();
}

Status ParseClusters(const Reader& r, const YAML::Node& n, ClusterConfig* cluster) {
  if (!n) return Status::Ok();
  const std::string where = "clusters";
  WEFT_RETURN_IF_ERROR(r.Keys(n, where,
                              {"heartbeat", "new_versions", "sync_interval", "lease_wait",
                               "crash_rate", "restart_after", "preloaded"}));
  WEFT_RETURN_IF_ERROR(r.Bool(n, where, "preloaded", &cluster->preloaded));
  if (n["new_versions"]) {
    std::string mode;
    WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(n, where, "new_versions", &mode)));
    if (mode != "push" && mode != "poll")
      return r.Error(where + ".new_versions", n["new_versions"],
                     "'" + mode + "' is not push or poll");
    cluster->push = mode == "push";
  }
  WEFT_RETURN_IF_ERROR(r.Duration(n, where, "heartbeat", &cluster->heartbeat));
  WEFT_RETURN_IF_ERROR(r.Duration(n, where, "sync_interval", &cluster->sync_interval));
  WEFT_RETURN_IF_ERROR(r.Duration(n, where, "lease_wait", &cluster->lease_wait));
  WEFT_RETURN_IF_ERROR(r.Number(n, where, "crash_rate", &cluster->crash_rate, 0, 3600));
  WEFT_RETURN_IF_ERROR(r.Duration(n, where, "restart_after", &cluster->restart_after));
  if (cluster->heartbeat < 1000 || cluster->sync_interval < 1000 || cluster->lease_wait < 1000)
    return r.Error(where, n, "heartbeat, sync_interval and lease_wait must be at least 1ms");
  return Status::Ok();
}

}  // namespace

const char* FaultName(Fault::Kind kind) {
  switch (kind) {
    case Fault::Kind::kOrchestratorCrash:
      return "orchestrator_crash";
    case Fault::Kind::kPartition:
      return "partition";
    case Fault::Kind::kRelayDown:
      return "relay_down";
    case Fault::Kind::kStoreDown:
      return "store_down";
    case Fault::Kind::kPreempt:
      return "preempt";
    case Fault::Kind::kJoin:
      return "join";
    case Fault::Kind::kLeave:
      return "leave";
  }
  return "?";
}

double ModelConfig::BytesPerElement() const {
  // FP8 with one FP32 scale per 128x128 tile.
  return format == "fp8" ? 1.0 + 4.0 / (128.0 * 128.0) : 2.0;
}

double ModelConfig::DensityAt(uint64_t version) const {
  double density = this->density;
  for (const auto& [step, value] : density_schedule) {
    if (step > version) break;
    density = value;
  }
  return density;
}

Result<SimConfig> LoadSimConfig(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  std::string where = path;
  // `extends: FILE`: that file's sections, each top-level key of this one replacing the
  // base's whole section.
  if (root.IsMap() && root["extends"]) {
    const YAML::Node extends = root["extends"];
    if (!extends.IsScalar())
      return InvalidArgument(path + ": extends must name a file" + Line(extends));
    const std::string base = Reader(path, path).Relative(extends.Scalar());
    WEFT_ASSIGN_OR_RETURN(YAML::Node merged, LoadYamlFile(base));
    if (!merged.IsMap()) return InvalidArgument(base + ": must be a map of sections");
    if (merged["extends"])
      return InvalidArgument(base + ": a file that is extended cannot extend another");
    for (const auto& entry : root) {
      const std::string key = entry.first.as<std::string>("");
      if (key != "extends") merged[key] = entry.second;
    }
    root = merged;
    where = path + " (extending " + base + ")";
  }
  const Reader r(where, path);
  SimConfig config;
  // Defaults that differ from the real orchestrator's: a fleet, not a laptop.
  config.core.max_in_flight = 1 << 20;
  WEFT_RETURN_IF_ERROR(
      r.Keys(root, "(top level)",
             {"name", "seed", "duration", "orchestrator", "trainer", "model", "generation",
              "clusters", "regions", "faults", "variants", "extends"}));
  WEFT_RETURN_IF_ERROR(r.Wrap(ReadString(root, "(top level)", "name", &config.name)));
  WEFT_RETURN_IF_ERROR(r.Wrap(ReadUnsigned(root, "(top level)", "seed", &config.seed)));
  WEFT_RETURN_IF_ERROR(r.Duration(root, "(top level)", "duration", &config.duration));
  if (config.duration <= 0)
    return r.Error("duration", root["duration"], "must be positive and at most 400 days");
  if (const YAML::Node o = root["orchestrator"]) {
    std::set<std::string> keys(orchestrator::CoreConfigKeys().begin(),
                               orchestrator::CoreConfigKeys().end());
    keys.insert({"tick", "checkpoint_every"});
    WEFT_RETURN_IF_ERROR(r.Keys(o, "orchestrator", keys));
    WEFT_RETURN_IF_ERROR(orchestrator::ParseCoreConfig(o, "orchestrator", where, &config.core));
    WEFT_RETURN_IF_ERROR(r.Duration(o, "orchestrator", "tick", &config.tick));
    if (config.tick < 1000) return r.Error("orchestrator.tick", o["tick"], "must be at least 1ms");
    WEFT_RETURN_IF_ERROR(
        r.Wrap(ReadUnsigned(o, "orchestrator", "checkpoint_every", &config.checkpoint_every)));
    if (config.checkpoint_every < 1 || config.checkpoint_every > 10'000'000)
      return r.Error("orchestrator.checkpoint_every", o, "must be from 1 to 10000000");
  }
  WEFT_RETURN_IF_ERROR(ParseTrainer(r, root["trainer"], &config.trainer));
  WEFT_RETURN_IF_ERROR(ParseModel(r, root["model"], &config.model));
  WEFT_RETURN_IF_ERROR(ParseGeneration(r, root["generation"], &config.generation));
  WEFT_RETURN_IF_ERROR(ParseClusters(r, root["clusters"], &config.cluster));
  WEFT_RETURN_IF_ERROR(ParseRegions(r, root["regions"], &config.regions));
  WEFT_RETURN_IF_ERROR(ParseFaults(r, root["faults"], config, &config.faults));
  WEFT_RETURN_IF_ERROR(ParseVariants(r, root["variants"], &config.variants));
  return config;
}

MemoryEstimate EstimateMemory(const SimConfig& config) {
  // Bytes per item, measured on this simulator's data structures (docs/sim.md, "Bounds"), with
  // room to spare: each version's manifest, plans and records (plus, per region and per cluster,
  // its publication-to-ready records and the blobs and versions seen); each job in flight (the
  // core's job and lease, the simulated run, the trajectory group waiting for the trainer); each
  // job of the run (the invariants' records); each cluster; each journaled call between
  // checkpoints.
  constexpr double kBase = 48.0 * (1 << 20);
  constexpr double kPerVersion = 4096, kPerVersionRegion = 512, kPerVersionCluster = 16;
  constexpr double kPerJobInFlight = 1024, kPerJob = 8, kPerCluster = 8192, kPerCall = 512;
  MemoryEstimate e;
  const TrainerConfig& t = config.trainer;
  e.versions = std::floor(static_cast<double>(config.duration) /
                          static_cast<double>(std::max<Micros>(1, t.step_time))) +
               1;
  if (t.steps > 0) e.versions = std::min(e.versions, static_cast<double>(t.steps) + 1);
  for (const RegionConfig& region : config.regions) e.clusters += region.clusters;
  for (const Fault& fault : config.faults) {
    if (fault.kind == Fault::Kind::kJoin) e.clusters += fault.count;
  }
  const double regions = static_cast<double>(std::max<size_t>(1, config.regions.size()));
  e.jobs_in_flight = static_cast<double>(t.prompts_per_step) * (t.steps_ahead + 1.0);
  e.jobs = static_cast<double>(t.prompts_per_step) * e.versions;
  e.bytes =
      kBase +
      e.versions * (kPerVersion + kPerVersionRegion * regions + kPerVersionCluster * e.clusters) +
      e.jobs_in_flight * kPerJobInFlight + e.jobs * kPerJob + e.clusters * kPerCluster +
      static_cast<double>(config.checkpoint_every) * kPerCall;
  return e;
}

std::string MemoryEstimate::Describe() const {
  char text[256];
  std::snprintf(text, sizeof(text),
                "about %.1f GiB: %.0f versions, %.0f clusters, %.0f jobs in flight, %.0f jobs in "
                "all",
                bytes / (1ull << 30), versions, clusters, jobs_in_flight, jobs);
  return text;
}

SimConfig WithVariant(const SimConfig& config, const Variant& variant) {
  SimConfig out = config;
  out.variants.clear();
  if (variant.max_staleness) out.core.max_staleness = *variant.max_staleness;
  if (variant.dispatch) out.core.dispatch = *variant.dispatch;
  for (RegionConfig& region : out.regions) {
    if (variant.relays) region.relay = *variant.relays;
    if (variant.fleet_scale) {
      region.clusters =
          static_cast<uint32_t>(std::max(1.0, std::round(region.clusters * *variant.fleet_scale)));
    }
  }
  return out;
}

std::vector<std::pair<std::string, SimConfig>> Runs(const SimConfig& config) {
  std::vector<std::pair<std::string, SimConfig>> runs = {{"base", config}};
  runs[0].second.variants.clear();
  for (const Variant& v : config.variants) runs.emplace_back(v.name, WithVariant(config, v));
  return runs;
}

SimConfig Shrunk(const SimConfig& config, uint32_t clusters, Micros duration) {
  SimConfig out = config;
  uint32_t total = 0;
  for (const RegionConfig& region : out.regions) total += region.clusters;
  const double scale = total == 0 ? 1.0 : std::min(1.0, static_cast<double>(clusters) / total);
  for (RegionConfig& region : out.regions)
    region.clusters = std::max<uint32_t>(1, static_cast<uint32_t>(region.clusters * scale));
  out.trainer.prompts_per_step =
      std::max<uint32_t>(16, static_cast<uint32_t>(out.trainer.prompts_per_step * scale));
  out.duration = std::min(out.duration, duration);
  for (Fault& fault : out.faults) {
    fault.at = std::min(fault.at, out.duration * 4 / 10);
    fault.duration = std::min(fault.duration, out.duration / 4);
    fault.notice = std::min(fault.notice, out.duration / 10);
  }
  return out;
}

}  // namespace weft::sim
