#include "cli/run_config.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <tuple>

#include "cli/builtins.h"
#include "cli/trainer_channel.h"
#include "common/names.h"
#include "common/yaml_fields.h"
#include "policy_store/manifest.h"
#include "policy_store/object_store.h"

namespace weft::cli {
namespace {

// ADDRESS:PORT with a port from 1 to 65535.
Status CheckListen(const std::string& value, const std::string& where) {
  const size_t colon = value.rfind(':');
  char* end = nullptr;
  const unsigned long port =
      colon == std::string::npos ? 0 : std::strtoul(value.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || end == nullptr || *end != '\0' || port < 1 ||
      port > 65535) {
    return InvalidArgument(where + ": '" + value +
                           "' is not ADDRESS:PORT (a fixed port: other processes connect to it)");
  }
  return Status::Ok();
}

Status ReadPositive(const YAML::Node& node, const std::string& where, const std::string& key,
                    double* out, double high) {
  WEFT_RETURN_IF_ERROR(ReadDouble(node, where, key, out));
  if (!(*out > 0) || *out > high)
    return InvalidArgument(where + "." + key + " must be above 0 and at most " +
                           std::to_string(high));
  return Status::Ok();
}

// trainer.command: a non-empty list of strings, the first naming the program.
Status ReadCommand(const YAML::Node& trainer, std::vector<std::string>* command) {
  const YAML::Node list = trainer["command"];
  if (!list) return Status::Ok();
  if (!list.IsSequence() || list.size() == 0) {
    return InvalidArgument(
        "trainer.command must be a non-empty list of strings (the trainer's program and its "
        "arguments)" +
        LineOf(list));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "trainer.command[" + std::to_string(i) + "]";
    if (!list[i].IsScalar()) return InvalidArgument(where + " must be a string" + LineOf(list[i]));
    const std::string& word = list[i].Scalar();
    if (word.find('\0') != std::string::npos)
      return InvalidArgument(where + " holds a NUL character" + LineOf(list[i]));
    if (i == 0 && word.empty())
      return InvalidArgument(where + " is empty: it names the program" + LineOf(list[i]));
    command->push_back(word);
  }
  return Status::Ok();
}

// trainer.env: NAME: value, names as the shell takes them, none of the variables weft run sets.
Status ReadEnvironment(const YAML::Node& trainer, std::map<std::string, std::string>* env) {
  const YAML::Node map = trainer["env"];
  if (!map) return Status::Ok();
  if (!map.IsMap())
    return InvalidArgument("trainer.env must be a map of NAME: value" + LineOf(map));
  const std::vector<std::string>& reserved = TrainerChannelVariables();
  for (const auto& entry : map) {
    const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
    const std::string where = "trainer.env." + name;
    if (!IsEnvironmentVariableName(name)) {
      return InvalidArgument(where + ": '" + name +
                             "' is not an environment variable name (letters, digits and '_', "
                             "not starting with a digit)" +
                             LineOf(entry.first));
    }
    if (std::find(reserved.begin(), reserved.end(), name) != reserved.end()) {
      return InvalidArgument(where + ": weft run sets this variable itself (docs/run.md)" +
                             LineOf(entry.first));
    }
    if (!entry.second.IsScalar()) {
      return InvalidArgument(where + " must be a string (quote an empty one: '')" +
                             LineOf(entry.second));
    }
    if (entry.second.Scalar().find('\0') != std::string::npos)
      return InvalidArgument(where + " holds a NUL character" + LineOf(entry.second));
    (*env)[name] = entry.second.Scalar();
  }
  return Status::Ok();
}

// trainer.KEY: one of a set of choices by name (`name_of` and `parse` convert); `what` and
// `known` word the error.
template <typename T, typename NameOf, typename Parse>
Status ReadChoice(const YAML::Node& trainer, const std::string& key, NameOf name_of, Parse parse,
                  const std::string& what, const std::string& known, T* value) {
  std::string name(name_of(*value));
  WEFT_RETURN_IF_ERROR(ReadString(trainer, "trainer", key, &name));
  const std::optional<T> parsed = parse(name);
  if (!parsed) {
    return InvalidArgument("trainer." + key + ": '" + name + "' is not " + what +
                           " (known: " + known + ")" + LineOf(trainer[key]));
  }
  *value = *parsed;
  return Status::Ok();
}

// trainer.optimizer: `name` if it is one the schema names (docs/run.md), whichever trainer runs;
// a trainer that lacks it refuses to start.
std::optional<std::string> KnownOptimizer(const std::string& name) {
  if (name == "adamw" || name == "muon") return name;
  return std::nullopt;
}

// One non-empty list of engine replica URLs per worker, `workers` of them (`at` names the key).
Result<std::vector<std::vector<std::string>>> ReadEngineLists(const YAML::Node& engines,
                                                              const std::string& at, int workers) {
  if (!engines.IsSequence() || engines.size() != static_cast<size_t>(workers)) {
    return InvalidArgument(at + " must list one list of engine URLs per worker (" +
                           std::to_string(workers) + ")" + LineOf(engines));
  }
  std::vector<std::vector<std::string>> lists;
  for (size_t w = 0; w < engines.size(); ++w) {
    const YAML::Node urls = engines[w];
    if (!urls.IsSequence() || urls.size() == 0) {
      return InvalidArgument(at + "[" + std::to_string(w) + "] must be a non-empty list of URLs" +
                             LineOf(urls));
    }
    std::vector<std::string> list;
    for (size_t u = 0; u < urls.size(); ++u) {
      if (!urls[u].IsScalar()) {
        return InvalidArgument(at + "[" + std::to_string(w) + "][" + std::to_string(u) +
                               "] must be a URL" + LineOf(urls[u]));
      }
      list.push_back(urls[u].Scalar());
    }
    lists.push_back(std::move(list));
  }
  return lists;
}

Status ParseSections(const YAML::Node& root, RunConfig& c) {
  WEFT_RETURN_IF_ERROR(
      CheckKeys(root, "(top level)",
                {"run", "store", "orchestrator", "regions", "worker", "engine", "model", "task",
                 "trainer", "deploy", "fixed_models", "generate"}));
  if (const YAML::Node run = root["run"]) {
    WEFT_RETURN_IF_ERROR(CheckKeys(run, "run", {"id", "dir", "time_limit"}));
    WEFT_RETURN_IF_ERROR(ReadString(run, "run", "id", &c.run_id));
    WEFT_RETURN_IF_ERROR(policy_store::ValidateRunId(c.run_id).WithContext("run.id"));
    WEFT_RETURN_IF_ERROR(ReadString(run, "run", "dir", &c.dir));
    if (c.dir.empty()) return InvalidArgument("run.dir is empty");
    std::chrono::microseconds limit = c.time_limit;
    WEFT_RETURN_IF_ERROR(ReadDuration(run, "run", "time_limit", &limit));
    if (limit.count() <= 0) return InvalidArgument("run.time_limit must be positive");
    c.time_limit = std::chrono::duration_cast<std::chrono::seconds>(limit);
  }
  if (const YAML::Node store = root["store"]) {
    WEFT_RETURN_IF_ERROR(CheckKeys(store, "store", {"listen", "uri"}));
    WEFT_RETURN_IF_ERROR(ReadString(store, "store", "listen", &c.store_listen));
    WEFT_RETURN_IF_ERROR(ReadString(store, "store", "uri", &c.store_uri));
    const std::string line = store["uri"] ? std::to_string(store["uri"].Mark().line + 1) : "";
    Result<policy_store::StoreLocation> location =
        c.store_uri.empty() ? Result<policy_store::StoreLocation>(policy_store::StoreLocation{})
                            : policy_store::ParseStoreUri(c.store_uri);
    if (!location.ok())
      return InvalidArgument("store.uri (line " + line + "): " + location.status().message());
    if (!c.store_uri.empty() && location->kind == policy_store::StoreLocation::Kind::kDirectory) {
      return InvalidArgument("store.uri (line " + line + "): '" + c.store_uri +
                             "' is not a shared store (s3://BUCKET/PREFIX or http(s)://HOST:PORT);"
                             " leave it out to serve the run's own store");
    }
  }
  WEFT_RETURN_IF_ERROR(CheckListen(c.store_listen, "store.listen"));

  // The orchestrator section, as `weft orchestrator` reads it; its run is the run's.
  if (!root["orchestrator"]) return InvalidArgument("no 'orchestrator:' section");
  c.orchestrator_section = YAML::Clone(root["orchestrator"]);
  if (c.orchestrator_section.IsMap() && c.orchestrator_section["run"] &&
      c.orchestrator_section["run"].as<std::string>("") != c.run_id) {
    return InvalidArgument("orchestrator.run must be left out or equal run.id ('" + c.run_id +
                           "')");
  }
  if (c.orchestrator_section.IsMap()) c.orchestrator_section["run"] = c.run_id;
  YAML::Node wrapped;
  wrapped["orchestrator"] = c.orchestrator_section;
  // Each process checks the tokens it needs (RunConfig::NeedTokens): a worker has its own alone.
  WEFT_ASSIGN_OR_RETURN(c.orchestrator,
                        orchestrator::ParseOrchestratorConfig(wrapped, c.path, false));
  if (!c.orchestrator.service.server.tls_cert_file.empty()) {
    return InvalidArgument(
        "orchestrator.tls: a run on one machine speaks plain HTTP on loopback; leave tls out");
  }
  if (c.orchestrator.service.server.port == 0)
    return InvalidArgument("orchestrator.listen needs a fixed port: workers connect to it");

  const YAML::Node regions = root["regions"];
  if (!regions || !regions.IsSequence() || regions.size() == 0)
    return InvalidArgument("regions: a list of at least one region is needed");
  std::set<std::string> names, listens = {c.store_listen};
  for (size_t i = 0; i < regions.size(); ++i) {
    const std::string where = "regions[" + std::to_string(i) + "]";
    const YAML::Node r = regions[i];
    WEFT_RETURN_IF_ERROR(CheckKeys(r, where,
                                   {"name", "relay", "bandwidth", "latency", "workers",
                                    "worker_engines", "models", "model_engines"}));
    RegionConfig region;
    WEFT_RETURN_IF_ERROR(ReadString(r, where, "name", &region.name));
    if (region.name.empty() || region.name.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos) {
      return InvalidArgument(where + ".name: '" + region.name +
                             "' must be lower-case letters, digits and '-'");
    }
    if (!names.insert(region.name).second)
      return InvalidArgument(where + ".name: region '" + region.name + "' appears twice");
    WEFT_RETURN_IF_ERROR(ReadString(r, where, "relay", &region.relay_listen));
    WEFT_RETURN_IF_ERROR(CheckListen(region.relay_listen, where + ".relay"));
    if (!listens.insert(region.relay_listen).second)
      return InvalidArgument(where + ".relay: " + region.relay_listen + " is already taken");
    WEFT_RETURN_IF_ERROR(ReadBytes(r, where, "bandwidth", &region.bandwidth));
    WEFT_RETURN_IF_ERROR(ReadDuration(r, where, "latency", &region.latency));
    WEFT_RETURN_IF_ERROR(ReadInt(r, where, "workers", &region.workers, 0, 64));
    // worker_engines: one list of engine replica URLs per worker of the region (engine.urls
    // otherwise serves every worker).
    if (const YAML::Node engines = r["worker_engines"]) {
      WEFT_ASSIGN_OR_RETURN(region.worker_engines,
                            ReadEngineLists(engines, where + ".worker_engines", region.workers));
    }
    if (const YAML::Node models = r["models"]) {
      if (!models.IsMap())
        return InvalidArgument(where + ".models must map fixed models to worker counts" +
                               LineOf(models));
      for (const auto& entry : models) {
        const std::string name = entry.first.as<std::string>("");
        int count = 0;
        WEFT_RETURN_IF_ERROR(ReadInt(models, where + ".models", name, &count, 0, 64));
        region.model_workers[name] = count;
      }
    }
    // model_engines: the same, per fixed model, for the workers `models` starts.
    if (const YAML::Node engines = r["model_engines"]) {
      if (!engines.IsMap())
        return InvalidArgument(where + ".model_engines must map fixed models to lists of engine " +
                               "URLs per worker" + LineOf(engines));
      for (const auto& entry : engines) {
        const std::string name = entry.first.as<std::string>("");
        const auto count = region.model_workers.find(name);
        if (count == region.model_workers.end()) {
          return InvalidArgument(where + ".model_engines." + name + ": the region runs no " +
                                 "workers of model '" + name + "' (models:)" +
                                 LineOf(entry.second));
        }
        WEFT_ASSIGN_OR_RETURN(
            region.model_engines[name],
            ReadEngineLists(entry.second, where + ".model_engines." + name, count->second));
      }
    }
    c.regions.push_back(region);
  }
  // Fixed models: the names regions and the trainer refer to.
  if (const YAML::Node fixed = root["fixed_models"]) {
    if (!fixed.IsSequence()) return InvalidArgument("fixed_models must be a list" + LineOf(fixed));
    for (size_t i = 0; i < fixed.size(); ++i) {
      const std::string where = "fixed_models[" + std::to_string(i) + "]";
      WEFT_RETURN_IF_ERROR(CheckKeys(fixed[i], where, {"name", "run", "model"}));
      FixedModelConfig m;
      WEFT_RETURN_IF_ERROR(ReadString(fixed[i], where, "name", &m.name));
      WEFT_RETURN_IF_ERROR(CheckName(m.name, where + ".name"));
      m.run = m.name;
      WEFT_RETURN_IF_ERROR(ReadString(fixed[i], where, "run", &m.run));
      WEFT_RETURN_IF_ERROR(policy_store::ValidateRunId(m.run).WithContext(where + ".run"));
      if (m.run == c.run_id)
        return InvalidArgument(where + ".run: '" + m.run +
                               "' is the policy's run (run.id); a fixed model needs its own");
      if (c.FindFixedModel(m.name) != nullptr)
        return InvalidArgument(where + ".name: model '" + m.name + "' appears twice");
      m.model = fixed[i]["model"] ? YAML::Clone(fixed[i]["model"]) : YAML::Clone(root["model"]);
      WEFT_RETURN_IF_ERROR(ParseModelSection(m.model, &m.shape).WithContext(where));
      c.fixed_models.push_back(std::move(m));
    }
  }
  if (const YAML::Node g = root["generate"]) {
    GenerateSettings& s = c.generate;
    s.present = true;
    WEFT_RETURN_IF_ERROR(CheckKeys(g, "generate",
                                   {"model", "checkpoint", "dataset", "samples", "output",
                                    "shard_records", "min_reward", "jobs_ahead"}));
    WEFT_RETURN_IF_ERROR(ReadString(g, "generate", "model", &s.model));
    if (c.FindFixedModel(s.model) == nullptr)
      return InvalidArgument("generate.model: '" + s.model + "' is not one of fixed_models" +
                             LineOf(g["model"]));
    WEFT_RETURN_IF_ERROR(ReadString(g, "generate", "checkpoint", &s.checkpoint));
    WEFT_RETURN_IF_ERROR(ReadString(g, "generate", "dataset", &s.dataset));
    if (s.dataset.empty()) return InvalidArgument("generate.dataset is needed" + LineOf(g));
    WEFT_RETURN_IF_ERROR(ReadString(g, "generate", "output", &s.output));
    if (s.output.empty()) return InvalidArgument("generate.output is needed" + LineOf(g));
    int samples = static_cast<int>(s.samples);
    WEFT_RETURN_IF_ERROR(ReadInt(g, "generate", "samples", &samples, 1, 4096));
    s.samples = static_cast<uint32_t>(samples);
    int shard = static_cast<int>(std::min<uint64_t>(s.shard_records, 1 << 30));
    WEFT_RETURN_IF_ERROR(ReadInt(g, "generate", "shard_records", &shard, 1, 1 << 30));
    s.shard_records = static_cast<uint64_t>(shard);
    int ahead = static_cast<int>(s.jobs_ahead);
    WEFT_RETURN_IF_ERROR(ReadInt(g, "generate", "jobs_ahead", &ahead, 1, 100000));
    s.jobs_ahead = static_cast<uint32_t>(ahead);
    if (g["min_reward"]) {
      double min_reward = 0;
      WEFT_RETURN_IF_ERROR(ReadDouble(g, "generate", "min_reward", &min_reward));
      s.min_reward = min_reward;
    }
  }
  for (const RegionConfig& region : c.regions) {
    for (const auto& [name, count] : region.model_workers) {
      if (c.FindFixedModel(name) == nullptr)
        return InvalidArgument("regions: region " + region.name + " runs workers of model '" +
                               name + "', which fixed_models does not name");
    }
  }

  if (const YAML::Node w = root["worker"]) {
    WEFT_RETURN_IF_ERROR(CheckKeys(w, "worker",
                                   {"engine", "capacity", "threads", "temperature", "top_p",
                                    "heartbeat", "spill_dir", "new_versions"}));
    WEFT_RETURN_IF_ERROR(ReadString(w, "worker", "engine", &c.worker.engine));
    WEFT_RETURN_IF_ERROR(ReadString(w, "worker", "spill_dir", &c.worker.spill_dir));
    int capacity = static_cast<int>(c.worker.capacity);
    WEFT_RETURN_IF_ERROR(ReadInt(w, "worker", "capacity", &capacity, 1, 256));
    c.worker.capacity = static_cast<uint32_t>(capacity);
    WEFT_RETURN_IF_ERROR(ReadInt(w, "worker", "threads", &c.worker.threads, 1, 256));
    WEFT_RETURN_IF_ERROR(ReadPositive(w, "worker", "temperature", &c.worker.temperature, 100.0));
    WEFT_RETURN_IF_ERROR(ReadPositive(w, "worker", "top_p", &c.worker.top_p, 1.0));
    std::chrono::microseconds heartbeat = c.worker.heartbeat;
    WEFT_RETURN_IF_ERROR(ReadDuration(w, "worker", "heartbeat", &heartbeat));
    c.worker.heartbeat = std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat);
    if (c.worker.heartbeat.count() < 10)
      return InvalidArgument("worker.heartbeat must be at least 10ms");
    std::string new_versions = c.worker.push ? "push" : "poll";
    WEFT_RETURN_IF_ERROR(ReadString(w, "worker", "new_versions", &new_versions));
    if (new_versions != "push" && new_versions != "poll") {
      return InvalidArgument("worker.new_versions must be push or poll, not '" + new_versions +
                             "'");
    }
    c.worker.push = new_versions == "push";
  }

  TrainerSettings& t = c.trainer;
  WEFT_RETURN_IF_ERROR(ParseModelSection(root["model"], &t.model));
  TaskSection task;
  WEFT_RETURN_IF_ERROR(ParseTaskSection(root["task"], &task));
  c.task = task.kind;
  t.digits = task.digits;
  t.dataset = task.dataset;
  {
    // The kind's own keys, checked as workers will read them, and the lengths it gives them: the
    // engine sizes its model from them, and so does the example trainer.
    const rollout_worker::ComponentConfig component{root, c.path, 1};
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<rollout_worker::Task> made,
                          Builtins().MakeTask(c.task, component));
    c.task_limits = made->limits();
  }
  // From here on model.context is the model's positions, resolved.
  WEFT_ASSIGN_OR_RETURN(t.model.context, ModelPositions(t.model, c.task_limits));
  if (const YAML::Node tr = root["trainer"]) {
    WEFT_RETURN_IF_ERROR(CheckKeys(tr, "trainer",
                                   {"seed",
                                    "threads",
                                    "warmup",
                                    "steps",
                                    "prompts_per_step",
                                    "samples_per_prompt",
                                    "steps_ahead",
                                    "optimizer",
                                    "learning_rate",
                                    "truncation",
                                    "eval_problems",
                                    "keyframe_interval",
                                    "keyframe_budget",
                                    "delta_mode",
                                    "stall_after",
                                    "min_step_time",
                                    "command",
                                    "env",
                                    "algorithm",
                                    "rft_threshold",
                                    "teacher"}));
    WEFT_RETURN_IF_ERROR(ReadString(tr, "trainer", "algorithm", &t.algorithm));
    if (t.algorithm != "grpo" && t.algorithm != "rft" && t.algorithm != "distill")
      return InvalidArgument("trainer.algorithm: '" + t.algorithm +
                             "' is not grpo, rft or distill" + LineOf(tr["algorithm"]));
    if (tr["rft_threshold"]) {
      WEFT_RETURN_IF_ERROR(ReadPositive(tr, "trainer", "rft_threshold", &t.rft_threshold, 1e9));
    }
    if (const YAML::Node teacher = tr["teacher"]) {
      WEFT_RETURN_IF_ERROR(CheckKeys(teacher, "trainer.teacher", {"model", "warmup"}));
      WEFT_RETURN_IF_ERROR(ReadString(teacher, "trainer.teacher", "model", &t.teacher));
      if (c.FindFixedModel(t.teacher) == nullptr)
        return InvalidArgument("trainer.teacher.model: '" + t.teacher +
                               "' is not one of fixed_models" + LineOf(teacher["model"]));
      if (const YAML::Node warmup = teacher["warmup"]) {
        const std::string at = "trainer.teacher.warmup";
        WEFT_RETURN_IF_ERROR(CheckKeys(warmup, at, {"steps", "batch", "learning_rate"}));
        WEFT_RETURN_IF_ERROR(ReadInt(warmup, at, "steps", &t.teacher_warmup_steps, 0, 1000000));
        WEFT_RETURN_IF_ERROR(ReadInt(warmup, at, "batch", &t.teacher_warmup_batch, 1, 65536));
        WEFT_RETURN_IF_ERROR(
            ReadPositive(warmup, at, "learning_rate", &t.teacher_warmup_learning_rate, 1.0));
      }
    }
    if (t.algorithm == "distill" && t.teacher.empty())
      return InvalidArgument("trainer.algorithm distill needs trainer.teacher.model" +
                             LineOf(tr["algorithm"]));
    WEFT_RETURN_IF_ERROR(ReadCommand(tr, &c.trainer_command));
    WEFT_RETURN_IF_ERROR(ReadEnvironment(tr, &c.trainer_env));
    WEFT_RETURN_IF_ERROR(ReadUnsigned(tr, "trainer", "seed", &t.seed));
    WEFT_RETURN_IF_ERROR(ReadInt(tr, "trainer", "threads", &t.threads, 1, 256));
    if (const YAML::Node warmup = tr["warmup"]) {
      WEFT_RETURN_IF_ERROR(
          CheckKeys(warmup, "trainer.warmup", {"steps", "batch", "learning_rate"}));
      WEFT_RETURN_IF_ERROR(ReadInt(warmup, "trainer.warmup", "steps", &t.warmup_steps, 0, 1000000));
      WEFT_RETURN_IF_ERROR(ReadInt(warmup, "trainer.warmup", "batch", &t.warmup_batch, 1, 65536));
      WEFT_RETURN_IF_ERROR(
          ReadPositive(warmup, "trainer.warmup", "learning_rate", &t.warmup_learning_rate, 1.0));
    }
    WEFT_RETURN_IF_ERROR(ReadInt(tr, "trainer", "steps", &t.steps, 1, 1000000));
    WEFT_RETURN_IF_ERROR(ReadInt(tr, "trainer", "prompts_per_step", &t.prompts_per_step, 1, 65536));
    WEFT_RETURN_IF_ERROR(
        ReadInt(tr, "trainer", "samples_per_prompt", &t.samples_per_prompt, 2, 1024));
    WEFT_RETURN_IF_ERROR(ReadInt(tr, "trainer", "steps_ahead", &t.steps_ahead, 1, 1000));
    // The RL phase's optimiser: one of the schema's, whichever trainer runs (docs/run.md).
    WEFT_RETURN_IF_ERROR(ReadChoice(
        tr, "optimizer", [](const std::string& name) { return name; }, KnownOptimizer,
        "an optimizer", "adamw, muon", &t.optimizer));
    WEFT_RETURN_IF_ERROR(ReadPositive(tr, "trainer", "learning_rate", &t.learning_rate, 1.0));
    WEFT_RETURN_IF_ERROR(ReadPositive(tr, "trainer", "truncation", &t.truncation, 1e6));
    WEFT_RETURN_IF_ERROR(ReadInt(tr, "trainer", "eval_problems", &t.eval_problems, 1, 1000000));
    WEFT_RETURN_IF_ERROR(ReadUnsigned(tr, "trainer", "keyframe_interval", &t.keyframe_interval));
    if (t.keyframe_interval < 1)
      return InvalidArgument("trainer.keyframe_interval must be at least 1");
    WEFT_RETURN_IF_ERROR(ReadPositive(tr, "trainer", "keyframe_budget", &t.keyframe_budget, 1e9));
    // How the publisher codes its delta blobs.
    WEFT_RETURN_IF_ERROR(ReadChoice(tr, "delta_mode", sync::DeltaModeName, sync::ParseDeltaMode,
                                    "a delta mode", "plain, context", &t.delta_mode));
    std::chrono::microseconds stall = t.stall_after;
    WEFT_RETURN_IF_ERROR(ReadDuration(tr, "trainer", "stall_after", &stall));
    t.stall_after = std::chrono::duration_cast<std::chrono::milliseconds>(stall);
    std::chrono::microseconds pace = t.min_step_time;
    WEFT_RETURN_IF_ERROR(ReadDuration(tr, "trainer", "min_step_time", &pace));
    t.min_step_time = std::chrono::duration_cast<std::chrono::milliseconds>(pace);
  }
  if (t.prompts_per_step > static_cast<int>(c.orchestrator.core.max_in_flight)) {
    return InvalidArgument(
        "trainer.prompts_per_step is above orchestrator.max_in_flight: a step could never fill");
  }
  // Last: it reads the sections above.
  return ParseDeploySection(root["deploy"], c, &c.deploy);
}

}  // namespace

std::string RunConfig::orchestrator_listen() const {
  return orchestrator.service.server.address + ":" +
         std::to_string(orchestrator.service.server.port);
}

Status RunConfig::NeedTokens(bool worker, bool trainer, bool admin) const {
  const orchestrator::ServiceOptions& t = orchestrator.service;
  for (const auto& [needed, token, name] : {std::tuple{worker, &t.worker_token, "worker"},
                                            std::tuple{trainer, &t.trainer_token, "trainer"},
                                            std::tuple{admin, &t.admin_token, "admin"}}) {
    if (needed && token->empty()) {
      std::string variable = std::string("WEFT_") + name + "_TOKEN";
      for (char& ch : variable)
        ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      return InvalidArgument(path + ": orchestrator.tokens." + name +
                             " is needed (in the file or " + variable + ")");
    }
  }
  return Status::Ok();
}

YAML::Node FixedModelDocument(const RunConfig& config, const FixedModelConfig& model) {
  YAML::Node document = YAML::Clone(config.document);
  document["model"] = YAML::Clone(model.model);
  // Its positions are the policy's: it scores the policy's sequences.
  if (!document["model"]["context"]) document["model"]["context"] = config.model_positions();
  return document;
}

const FixedModelConfig* RunConfig::FindFixedModel(const std::string& name) const {
  for (const FixedModelConfig& m : fixed_models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const RegionConfig* RunConfig::FindRegion(const std::string& name) const {
  for (const RegionConfig& r : regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

bool IsEnvironmentVariableName(const std::string& name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         name.find_first_not_of(
             "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") ==
             std::string::npos;
}

int ListenPort(const std::string& listen) {
  return std::stoi(listen.substr(listen.rfind(':') + 1));
}

Result<RunConfig> LoadRunConfig(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  RunConfig config;
  config.path = path;
  config.document = root;
  Status parsed = ParseSections(root, config);
  if (!parsed.ok()) return parsed.message().rfind(path, 0) == 0 ? parsed : parsed.WithContext(path);
  return config;
}

}  // namespace weft::cli
