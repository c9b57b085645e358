#include "cli/deploy_config.h"

#include <cctype>
#include <set>

#include "cli/run_config.h"
#include "common/yaml_fields.h"

namespace weft::cli {
namespace {

// The keys of one target's section that belong to the other, with what to write there instead:
// a config written for one scheduler and deployed on the other fails naming the key.
const std::map<std::string, std::string>& SlurmOnlyKeys() {
  static const std::map<std::string, std::string> keys = {
      {"partition", "Kubernetes places pods by deploy.kubernetes.regions.NAME.node_selector"},
      {"partitions", "Kubernetes places pods by deploy.kubernetes.regions.NAME.node_selector"},
      {"account", "Kubernetes has no accounts"},
      {"time", "Kubernetes pods have no time limit"},
      {"cpus", "Kubernetes takes `cpu`, a quantity"},
      {"options", "Kubernetes manifests take no sbatch options"},
      {"dir", "Kubernetes keeps the journal and the store on PersistentVolumeClaims"},
      {"weft", "Kubernetes runs the image deploy.kubernetes.image"},
      {"requeue", "Kubernetes restarts pods itself"},
      {"nodes", "the trainer on Kubernetes is one pod"},
      {"tasks_per_node", "the trainer on Kubernetes is one pod"},
      {"gpus_per_node", "Kubernetes takes `gpus` per pod"},
      {"cache", "Kubernetes gives relays a volume of `cache_size`"},
  };
  return keys;
}
const std::map<std::string, std::string>& KubernetesOnlyKeys() {
  static const std::map<std::string, std::string> keys = {
      {"namespace", "Slurm has no namespaces"},
      {"image", "Slurm runs the binary deploy.slurm.weft"},
      {"image_pull_policy", "Slurm runs the binary deploy.slurm.weft"},
      {"node_selector", "Slurm places jobs by partition (deploy.slurm.partitions)"},
      {"regions", "Slurm places a region's workers by deploy.slurm.partitions.NAME.region"},
      {"storage_class", "Slurm keeps everything in deploy.slurm.dir"},
      {"secrets", "Slurm jobs read the tokens from the config or the environment"},
      {"journal_size", "Slurm keeps the journal in deploy.slurm.dir"},
      {"size", "Slurm keeps the store in deploy.slurm.dir"},
      {"cache_size", "Slurm relays cache in deploy.slurm.relays.cache"},
      {"cpu", "Slurm takes `cpus`, a count per task"},
      {"engine", "Slurm runs the engine in the worker's job (deploy.engine)"},
  };
  return keys;
}

// CheckKeys, with a key of the other target named as such.
Status CheckTargetKeys(const YAML::Node& node, const std::string& where,
                       const std::set<std::string>& allowed, bool slurm) {
  if (!node.IsMap()) return InvalidArgument(where + " must be a map of settings" + LineOf(node));
  const auto& foreign = slurm ? KubernetesOnlyKeys() : SlurmOnlyKeys();
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>("");
    if (allowed.count(key)) continue;
    if (auto hint = foreign.find(key); hint != foreign.end()) {
      return InvalidArgument(where + "." + key + LineOf(entry.first) + ": a " +
                             (slurm ? "Kubernetes" : "Slurm") + " setting, not one for " +
                             (slurm ? "Slurm" : "Kubernetes") + " (" + hint->second + ")");
    }
  }
  return CheckKeys(node, where, allowed);
}

// A Slurm time limit in seconds: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.
std::optional<int64_t> SlurmSeconds(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789:-") != std::string::npos)
    return std::nullopt;
  int64_t days = 0;
  std::string rest = text;
  const size_t dash = text.find('-');
  if (dash != std::string::npos) {
    if (dash == 0 || dash > 6 || text.find('-', dash + 1) != std::string::npos) return std::nullopt;
    days = std::stoll(text.substr(0, dash));
    rest = text.substr(dash + 1);
  }
  std::vector<int64_t> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = rest.find(':', start);
    const std::string part = rest.substr(start, colon - start);
    if (part.empty() || part.size() > 9) return std::nullopt;
    parts.push_back(std::stoll(part));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() > 3) return std::nullopt;
  if (dash != std::string::npos) {  // D-HH[:MM[:SS]]
    while (parts.size() < 3) parts.push_back(0);
    return ((days * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2];
  }
  if (parts.size() == 1) return parts[0] * 60;             // minutes
  if (parts.size() == 2) return parts[0] * 60 + parts[1];  // MM:SS
  return (parts[0] * 60 + parts[1]) * 60 + parts[2];       // HH:MM:SS
}

Status ReadStringList(const YAML::Node& node, const std::string& where,
                      std::vector<std::string>* out) {
  if (!node) return Status::Ok();
  if (!node.IsSequence())
    return InvalidArgument(where + " must be a list of strings" + LineOf(node));
  for (size_t i = 0; i < node.size(); ++i) {
    if (!node[i].IsScalar() || node[i].Scalar().find('\0') != std::string::npos) {
      return InvalidArgument(where + "[" + std::to_string(i) + "] must be a string" +
                             LineOf(node[i]));
    }
    out->push_back(node[i].Scalar());
  }
  return Status::Ok();
}

Status ReadStringMap(const YAML::Node& node, const std::string& where,
                     std::map<std::string, std::string>* out) {
  if (!node) return Status::Ok();
  if (!node.IsMap()) return InvalidArgument(where + " must be a map of NAME: value" + LineOf(node));
  for (const auto& entry : node) {
    const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
    if (name.empty() || !entry.second.IsScalar()) {
      return InvalidArgument(where + "." + name + " must be a string (quote numbers: \"1\")" +
                             LineOf(entry.second));
    }
    (*out)[name] = entry.second.Scalar();
  }
  return Status::Ok();
}

// A Slurm name (partition, account) or an sbatch option: nothing a shell would take apart.
Status CheckShellWord(const std::string& value, const std::string& where, const YAML::Node& node,
                      bool option) {
  const std::string allowed =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-,:=+/%@";
  if (value.empty() || value.find_first_not_of(allowed) != std::string::npos ||
      (option && value.rfind("-", 0) != 0)) {
    return InvalidArgument(where + ": '" + value + "' is not " +
                           (option ? "an sbatch option (--NAME or --NAME=VALUE, no spaces)"
                                   : "a Slurm name (letters, digits and _.-)") +
                           LineOf(node));
  }
  return Status::Ok();
}

// The keys of every Slurm job section, read into `job`.
Status ReadSlurmJob(const YAML::Node& node, const std::string& where, SlurmJob* job) {
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "partition", &job->partition));
  if (node["partition"])
    WEFT_RETURN_IF_ERROR(
        CheckShellWord(job->partition, where + ".partition", node["partition"], false));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "account", &job->account));
  if (node["account"])
    WEFT_RETURN_IF_ERROR(CheckShellWord(job->account, where + ".account", node["account"], false));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "time", &job->time));
  if (node["time"] && !SlurmSeconds(job->time)) {
    return InvalidArgument(where + ".time: '" + job->time +
                           "' is not a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS)" +
                           LineOf(node["time"]));
  }
  WEFT_RETURN_IF_ERROR(ReadInt(node, where, "cpus", &job->cpus, 1, 4096));
  WEFT_RETURN_IF_ERROR(ReadBytes(node, where, "memory", &job->memory));
  WEFT_RETURN_IF_ERROR(ReadStringList(node["options"], where + ".options", &job->options));
  for (size_t i = 0; i < job->options.size(); ++i) {
    WEFT_RETURN_IF_ERROR(CheckShellWord(
        job->options[i], where + ".options[" + std::to_string(i) + "]", node["options"][i], true));
  }
  return Status::Ok();
}

const std::set<std::string> kSlurmJobKeys = {"partition", "account", "time",
                                             "cpus",      "memory",  "options"};

std::set<std::string> With(std::set<std::string> keys, std::initializer_list<const char*> more,
                           std::initializer_list<const char*> less = {}) {
  for (const char* k : more) keys.insert(k);
  for (const char* k : less) keys.erase(k);
  return keys;
}

Status CheckUrl(const std::string& url, const std::string& where, const YAML::Node& node) {
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) {
    return InvalidArgument(where + ": '" + url + "' is not an http:// or https:// URL" +
                           LineOf(node));
  }
  return Status::Ok();
}

Status ParseEngine(const YAML::Node& node, EngineLaunch* engine) {
  const std::string where = "deploy.engine";
  WEFT_RETURN_IF_ERROR(CheckKeys(node, where, {"command", "gpus", "port", "env", "image"}));
  WEFT_RETURN_IF_ERROR(ReadStringList(node["command"], where + ".command", &engine->command));
  if (node["command"] && (engine->command.empty() || engine->command[0].empty())) {
    return InvalidArgument(where +
                           ".command must be a non-empty list, the first naming the "
                           "engine's program" +
                           LineOf(node["command"]));
  }
  WEFT_RETURN_IF_ERROR(ReadInt(node, where, "gpus", &engine->gpus, 0, 1024));
  WEFT_RETURN_IF_ERROR(ReadInt(node, where, "port", &engine->port, 1024, 65000));
  WEFT_RETURN_IF_ERROR(ReadStringMap(node["env"], where + ".env", &engine->env));
  for (const auto& [name, value] : engine->env) {
    if (!IsEnvironmentVariableName(name)) {
      return InvalidArgument(where + ".env." + name +
                             ": not an environment variable name (letters, digits and '_')" +
                             LineOf(node["env"]));
    }
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "image", &engine->image));
  if (engine->command.empty() && node.size() > 0)
    return InvalidArgument(where + ": the other keys need command (the engine's program)");
  return Status::Ok();
}

Status ParseSlurm(const YAML::Node& node, SlurmDeploy* s) {
  const std::string where = "deploy.slurm";
  s->present = true;
  WEFT_RETURN_IF_ERROR(
      CheckTargetKeys(node, where,
                      {"dir", "weft", "account", "partitions", "orchestrator", "store", "trainer",
                       "relays", "workers", "orchestrator_url", "store_url"},
                      true));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "dir", &s->dir));
  if (s->dir.empty() || s->dir[0] != '/') {
    return InvalidArgument(
        where + ".dir: " +
        (s->dir.empty() ? std::string("required") : "'" + s->dir + "' is not an absolute path") +
        " (a directory on storage every node sees: the orchestrator's journal, "
        "the store, the services' addresses and the logs)" +
        LineOf(node["dir"]));
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "weft", &s->weft));
  if (!s->weft.empty() && s->weft[0] != '/')
    return InvalidArgument(where + ".weft: '" + s->weft + "' is not an absolute path" +
                           LineOf(node["weft"]));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "account", &s->account));
  if (node["account"])
    WEFT_RETURN_IF_ERROR(CheckShellWord(s->account, where + ".account", node["account"], false));
  const YAML::Node partitions = node["partitions"];
  if (!partitions || !partitions.IsMap() || partitions.size() == 0) {
    return InvalidArgument(where +
                           ".partitions: required, a map of the partitions the run uses "
                           "(NAME: {region: REGION, gpus: GPUS_PER_NODE})" +
                           LineOf(partitions));
  }
  for (const auto& entry : partitions) {
    SlurmPartition p;
    p.name = entry.first.as<std::string>("");
    const std::string at = where + ".partitions." + p.name;
    WEFT_RETURN_IF_ERROR(CheckShellWord(p.name, at, entry.first, false));
    const YAML::Node value = entry.second;
    if (!value.IsNull()) {
      WEFT_RETURN_IF_ERROR(CheckTargetKeys(value, at, {"region", "gpus"}, true));
      WEFT_RETURN_IF_ERROR(ReadString(value, at, "region", &p.region));
      WEFT_RETURN_IF_ERROR(ReadInt(value, at, "gpus", &p.gpus, 0, 1024));
    }
    s->partitions.push_back(p);
  }
  auto job = [&](const char* key, std::optional<SlurmJob>* out,
                 std::initializer_list<const char*> more) -> Status {
    const YAML::Node n = node[key];
    if (!n) return Status::Ok();
    const std::string at = where + "." + key;
    WEFT_RETURN_IF_ERROR(CheckTargetKeys(n, at, With(kSlurmJobKeys, more), true));
    SlurmJob j;
    WEFT_RETURN_IF_ERROR(ReadSlurmJob(n, at, &j));
    if (j.partition.empty())
      return InvalidArgument(at + ".partition: required (a partition of " + where + ".partitions)" +
                             LineOf(n));
    if (s->FindPartition(j.partition) == nullptr) {
      return InvalidArgument(at + ".partition: '" + j.partition + "' is not in " + where +
                             ".partitions" + LineOf(n["partition"]));
    }
    *out = j;
    return Status::Ok();
  };
  WEFT_RETURN_IF_ERROR(job("orchestrator", &s->orchestrator, {}));
  WEFT_RETURN_IF_ERROR(job("store", &s->store, {}));
  WEFT_RETURN_IF_ERROR(job("trainer", &s->trainer, {"nodes", "tasks_per_node", "gpus_per_node"}));
  if (const YAML::Node t = node["trainer"]) {
    const std::string at = where + ".trainer";
    WEFT_RETURN_IF_ERROR(ReadInt(t, at, "nodes", &s->trainer_nodes, 1, 100000));
    WEFT_RETURN_IF_ERROR(ReadInt(t, at, "tasks_per_node", &s->trainer_tasks_per_node, 1, 1024));
    WEFT_RETURN_IF_ERROR(ReadInt(t, at, "gpus_per_node", &s->trainer_gpus_per_node, 0, 1024));
    const SlurmPartition* p = s->FindPartition(s->trainer->partition);
    if (s->trainer_gpus_per_node > p->gpus) {
      return InvalidArgument(at + ".gpus_per_node: " + std::to_string(s->trainer_gpus_per_node) +
                             " GPUs asked, but partition " + p->name + " declares " +
                             std::to_string(p->gpus) + " per node (" + where + ".partitions." +
                             p->name + ".gpus)" + LineOf(t["gpus_per_node"]));
    }
  }
  if (const YAML::Node r = node["relays"]) {
    const std::string at = where + ".relays";
    WEFT_RETURN_IF_ERROR(
        CheckTargetKeys(r, at, With(kSlurmJobKeys, {"cache"}, {"partition"}), true));
    WEFT_RETURN_IF_ERROR(ReadSlurmJob(r, at, &s->relays));
    WEFT_RETURN_IF_ERROR(ReadString(r, at, "cache", &s->relay_cache));
    if (r["cache"] && (s->relay_cache.empty() || s->relay_cache[0] != '/'))
      return InvalidArgument(at + ".cache: '" + s->relay_cache + "' is not an absolute path" +
                             LineOf(r["cache"]));
  }
  if (const YAML::Node w = node["workers"]) {
    const std::string at = where + ".workers";
    WEFT_RETURN_IF_ERROR(CheckTargetKeys(
        w, at, With(kSlurmJobKeys, {"gpus", "drain", "requeue"}, {"partition"}), true));
    WEFT_RETURN_IF_ERROR(ReadSlurmJob(w, at, &s->workers));
    WEFT_RETURN_IF_ERROR(ReadInt(w, at, "gpus", &s->worker_gpus, 0, 1024));
    std::chrono::microseconds drain = s->drain;
    WEFT_RETURN_IF_ERROR(ReadDuration(w, at, "drain", &drain));
    s->drain = std::chrono::duration_cast<std::chrono::seconds>(drain);
    if (s->drain.count() < 1 || s->drain.count() > 65535)
      return InvalidArgument(at + ".drain must be 1s to 65535s" + LineOf(w["drain"]));
    if (const YAML::Node requeue = w["requeue"]) {
      if (!requeue.IsScalar() || (requeue.Scalar() != "true" && requeue.Scalar() != "false"))
        return InvalidArgument(at + ".requeue must be true or false" + LineOf(requeue));
      s->requeue = requeue.Scalar() == "true";
    }
    if (!s->workers.time.empty() && *SlurmSeconds(s->workers.time) <= s->drain.count()) {
      return InvalidArgument(at + ".drain (" + std::to_string(s->drain.count()) +
                             " s) must be shorter than the time limit (" + s->workers.time + ")" +
                             LineOf(w["drain"]));
    }
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "orchestrator_url", &s->orchestrator_url));
  if (node["orchestrator_url"])
    WEFT_RETURN_IF_ERROR(
        CheckUrl(s->orchestrator_url, where + ".orchestrator_url", node["orchestrator_url"]));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "store_url", &s->store_url));
  if (node["store_url"])
    WEFT_RETURN_IF_ERROR(CheckUrl(s->store_url, where + ".store_url", node["store_url"]));
  return Status::Ok();
}

Status ReadResources(const YAML::Node& node, const std::string& where, KubernetesResources* r) {
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "cpu", &r->cpu));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "memory", &r->memory));
  for (const char* key : {"cpu", "memory"}) {
    const std::string& value = std::string(key) == "cpu" ? r->cpu : r->memory;
    if (node[key] && !IsKubernetesQuantity(value)) {
      return InvalidArgument(where + "." + key + ": '" + value +
                             "' is not a Kubernetes quantity (2, 500m, 4Gi)" + LineOf(node[key]));
    }
  }
  return Status::Ok();
}

// A DNS-1123 label (namespaces, Secret names): lower case letters, digits and '-', at most 63.
bool IsDnsLabel(const std::string& name) {
  return !name.empty() && name.size() <= 63 && name.front() != '-' && name.back() != '-' &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
}

Status ParseKubernetes(const YAML::Node& node, KubernetesDeploy* k) {
  const std::string where = "deploy.kubernetes";
  k->present = true;
  WEFT_RETURN_IF_ERROR(CheckTargetKeys(
      node, where,
      {"namespace", "image", "image_pull_policy", "storage_class", "secrets", "orchestrator",
       "store", "trainer", "relays", "workers", "regions", "orchestrator_url", "store_url"},
      false));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "namespace", &k->namespace_));
  if (!IsDnsLabel(k->namespace_))
    return InvalidArgument(where + ".namespace: '" + k->namespace_ +
                           "' is not a namespace name (lower case, digits and '-')" +
                           LineOf(node["namespace"]));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "image", &k->image));
  if (k->image.empty() || k->image.find_first_of(" \t\n\"'") != std::string::npos) {
    return InvalidArgument(where + ".image: " +
                           (k->image.empty() ? std::string("required")
                                             : "'" + k->image + "' is not an image reference") +
                           " (an image with weft on its PATH)" + LineOf(node["image"]));
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "image_pull_policy", &k->image_pull_policy));
  if (k->image_pull_policy != "Always" && k->image_pull_policy != "IfNotPresent" &&
      k->image_pull_policy != "Never") {
    return InvalidArgument(where + ".image_pull_policy: '" + k->image_pull_policy +
                           "' is not Always, IfNotPresent or Never" +
                           LineOf(node["image_pull_policy"]));
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "storage_class", &k->storage_class));
  if (const YAML::Node secrets = node["secrets"]) {
    WEFT_RETURN_IF_ERROR(CheckKeys(secrets, where + ".secrets", {"tokens", "s3"}));
    WEFT_RETURN_IF_ERROR(ReadString(secrets, where + ".secrets", "tokens", &k->tokens_secret));
    WEFT_RETURN_IF_ERROR(ReadString(secrets, where + ".secrets", "s3", &k->s3_secret));
    for (const std::string* name : {&k->tokens_secret, &k->s3_secret}) {
      if (!IsDnsLabel(*name))
        return InvalidArgument(where + ".secrets: '" + *name +
                               "' is not a Secret name (lower case, digits and '-')" +
                               LineOf(secrets));
    }
  }
  auto size = [&](const YAML::Node& n, const std::string& at, const char* key,
                  std::string* out) -> Status {
    WEFT_RETURN_IF_ERROR(ReadString(n, at, key, out));
    if (!IsKubernetesQuantity(*out))
      return InvalidArgument(at + "." + key + ": '" + *out +
                             "' is not a Kubernetes quantity (10Gi)" + LineOf(n[key]));
    return Status::Ok();
  };
  auto service = [&](const char* key, std::optional<KubernetesResources>* out,
                     std::initializer_list<const char*> more) -> Status {
    const YAML::Node n = node[key];
    if (!n) return Status::Ok();
    const std::string at = where + "." + key;
    WEFT_RETURN_IF_ERROR(CheckTargetKeys(n, at, With({"cpu", "memory"}, more), false));
    KubernetesResources r;
    WEFT_RETURN_IF_ERROR(ReadResources(n, at, &r));
    *out = r;
    return Status::Ok();
  };
  WEFT_RETURN_IF_ERROR(service("orchestrator", &k->orchestrator, {"journal_size"}));
  if (node["orchestrator"])
    WEFT_RETURN_IF_ERROR(
        size(node["orchestrator"], where + ".orchestrator", "journal_size", &k->journal_size));
  WEFT_RETURN_IF_ERROR(service("store", &k->store, {"size"}));
  if (node["store"])
    WEFT_RETURN_IF_ERROR(size(node["store"], where + ".store", "size", &k->store_size));
  WEFT_RETURN_IF_ERROR(service("trainer", &k->trainer, {}));
  if (const YAML::Node r = node["relays"]) {
    WEFT_RETURN_IF_ERROR(
        CheckTargetKeys(r, where + ".relays", {"cpu", "memory", "cache_size"}, false));
    WEFT_RETURN_IF_ERROR(ReadResources(r, where + ".relays", &k->relays));
    WEFT_RETURN_IF_ERROR(size(r, where + ".relays", "cache_size", &k->relay_cache_size));
  }
  if (const YAML::Node w = node["workers"]) {
    const std::string at = where + ".workers";
    WEFT_RETURN_IF_ERROR(CheckTargetKeys(
        w, at, {"cpu", "memory", "gpus", "drain", "engine", "autoscale", "models"}, false));
    WEFT_RETURN_IF_ERROR(ReadResources(w, at, &k->workers));
    WEFT_RETURN_IF_ERROR(ReadInt(w, at, "gpus", &k->worker_gpus, 0, 1024));
    std::chrono::microseconds drain = k->drain;
    WEFT_RETURN_IF_ERROR(ReadDuration(w, at, "drain", &drain));
    k->drain = std::chrono::duration_cast<std::chrono::seconds>(drain);
    if (k->drain.count() < 1 || k->drain.count() > 86400)
      return InvalidArgument(at + ".drain must be 1s to 24h" + LineOf(w["drain"]));
    if (const YAML::Node e = w["engine"]) {
      WEFT_RETURN_IF_ERROR(CheckKeys(e, at + ".engine", {"cpu", "memory"}));
      WEFT_RETURN_IF_ERROR(ReadResources(e, at + ".engine", &k->engine));
    }
    if (const YAML::Node a = w["autoscale"]) {
      const std::string in = at + ".autoscale";
      WEFT_RETURN_IF_ERROR(CheckKeys(a, in, {"min", "max", "jobs_per_worker"}));
      for (const char* key : {"max", "jobs_per_worker"}) {
        if (!a[key]) return InvalidArgument(in + "." + key + ": required" + LineOf(a));
      }
      KubernetesAutoscale scale;
      WEFT_RETURN_IF_ERROR(ReadInt(a, in, "min", &scale.min, 1, 10000));
      WEFT_RETURN_IF_ERROR(ReadInt(a, in, "max", &scale.max, 1, 10000));
      WEFT_RETURN_IF_ERROR(ReadInt(a, in, "jobs_per_worker", &scale.jobs_per_worker, 1, 1000000));
      if (scale.max < scale.min) {
        return InvalidArgument(in + ".max (" + std::to_string(scale.max) + ") is below min (" +
                               std::to_string(scale.min) + ")" + LineOf(a["max"]));
      }
      k->autoscale = scale;
    }
    if (const YAML::Node m = w["models"]) {
      const std::string in = at + ".models";
      WEFT_RETURN_IF_ERROR(CheckKeys(m, in, {"path", "claim"}));
      KubernetesModels models;
      WEFT_RETURN_IF_ERROR(ReadString(m, in, "path", &models.path));
      if (models.path.size() < 2 || models.path[0] != '/') {
        return InvalidArgument(
            in + ".path: " +
            (models.path.empty() ? std::string("required")
                                 : "'" + models.path + "' is not an absolute path") +
            " (where the engine containers and the worker see the models)" + LineOf(m));
      }
      WEFT_RETURN_IF_ERROR(ReadString(m, in, "claim", &models.claim));
      if (m["claim"] && !IsDnsLabel(models.claim)) {
        return InvalidArgument(
            in + ".claim: '" + models.claim +
            "' is not a PersistentVolumeClaim name (lower case, digits and '-')" +
            LineOf(m["claim"]));
      }
      k->models = models;
    }
  }
  if (const YAML::Node regions = node["regions"]) {
    if (!regions.IsMap())
      return InvalidArgument(where + ".regions must be a map of REGION: {node_selector: {...}}" +
                             LineOf(regions));
    for (const auto& entry : regions) {
      KubernetesRegion region;
      region.name = entry.first.as<std::string>("");
      const std::string at = where + ".regions." + region.name;
      if (!entry.second.IsNull()) {
        WEFT_RETURN_IF_ERROR(CheckTargetKeys(entry.second, at, {"node_selector"}, false));
        WEFT_RETURN_IF_ERROR(ReadStringMap(entry.second["node_selector"], at + ".node_selector",
                                           &region.node_selector));
      }
      k->regions.push_back(region);
    }
  }
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "orchestrator_url", &k->orchestrator_url));
  if (node["orchestrator_url"])
    WEFT_RETURN_IF_ERROR(
        CheckUrl(k->orchestrator_url, where + ".orchestrator_url", node["orchestrator_url"]));
  WEFT_RETURN_IF_ERROR(ReadString(node, where, "store_url", &k->store_url));
  if (node["store_url"])
    WEFT_RETURN_IF_ERROR(CheckUrl(k->store_url, where + ".store_url", node["store_url"]));
  return Status::Ok();
}

// What the whole section says together, against the rest of the config.
Status CheckPlacement(const RunConfig& config, const DeployConfig& d) {
  const SlurmDeploy& s = d.slurm;
  const KubernetesDeploy& k = d.kubernetes;
  if (!s.present && !k.present)
    return InvalidArgument("deploy: give a slurm or a kubernetes section (or both)");
  std::set<std::string> region_names;
  for (const RegionConfig& r : config.regions) region_names.insert(r.name);
  for (const SlurmPartition& p : s.partitions) {
    if (!p.region.empty() && !region_names.count(p.region)) {
      return InvalidArgument("deploy.slurm.partitions." + p.name + ".region: '" + p.region +
                             "' is not a region of the config (regions[].name)");
    }
  }
  for (const KubernetesRegion& r : k.regions) {
    if (!region_names.count(r.name)) {
      return InvalidArgument("deploy.kubernetes.regions." + r.name +
                             ": not a region of the config (regions[].name)");
    }
  }
  // Every region on exactly one target.
  for (size_t i = 0; i < config.regions.size(); ++i) {
    const RegionConfig& r = config.regions[i];
    const bool on_slurm = !s.RegionPartitions(r.name).empty();
    const bool on_kubernetes = k.FindRegion(r.name) != nullptr;
    if (on_slurm && on_kubernetes) {
      return InvalidArgument("region '" + r.name +
                             "' is placed twice: on Slurm by deploy.slurm.partitions and on "
                             "Kubernetes by deploy.kubernetes.regions." +
                             r.name);
    }
    if (!on_slurm && !on_kubernetes) {
      return InvalidArgument(
          "region '" + r.name + "' has nowhere to run: " +
          (s.present ? "no partition of deploy.slurm.partitions declares `region: " + r.name + "`"
                     : std::string()) +
          (s.present && k.present ? ", and " : "") +
          (k.present ? "deploy.kubernetes.regions does not list it" : std::string()));
    }
    if (!r.worker_engines.empty()) {
      return InvalidArgument("regions[" + std::to_string(i) +
                             "].worker_engines: a deployed region's workers are alike (an array "
                             "of Slurm tasks, a Deployment's pods); give deploy.engine or "
                             "engine.urls_file instead");
    }
  }
  // The services: each on one target, reached by the other at the URL its section gives.
  auto once = [&](const char* what, bool on_slurm, bool on_kubernetes, bool needed) -> Status {
    if (on_slurm && on_kubernetes) {
      return InvalidArgument(std::string("deploy: the ") + what +
                             " is placed twice (deploy.slurm." + what + " and deploy.kubernetes." +
                             what + "); give one");
    }
    if (needed && !on_slurm && !on_kubernetes) {
      return InvalidArgument(std::string("deploy: the ") + what + " runs nowhere: give deploy." +
                             (s.present ? "slurm." : "kubernetes.") + what);
    }
    return Status::Ok();
  };
  WEFT_RETURN_IF_ERROR(
      once("orchestrator", s.orchestrator.has_value(), k.orchestrator.has_value(), true));
  WEFT_RETURN_IF_ERROR(once("trainer", s.trainer.has_value(), k.trainer.has_value(), true));
  if (!config.store_uri.empty()) {
    if (s.store || k.store) {
      return InvalidArgument(std::string("deploy.") + (s.store ? "slurm" : "kubernetes") +
                             ".store: store.uri names a shared store (" + config.store_uri +
                             "), so there is no store server to run; leave it out");
    }
  } else {
    WEFT_RETURN_IF_ERROR(once("store", s.store.has_value(), k.store.has_value(), true));
  }
  // A target that runs workers or the trainer without the orchestrator must be told where it is;
  // one that runs relays or the trainer without the store server, where that is.
  auto needs = [&](bool present, bool runs_clients, bool runs_store_clients,
                   const std::string& target, bool has_orchestrator, const std::string& url,
                   bool has_store, const std::string& store_url) -> Status {
    if (!present) return Status::Ok();
    if (runs_clients && !has_orchestrator && url.empty()) {
      return InvalidArgument("deploy." + target +
                             ".orchestrator_url: required, since the orchestrator runs on the "
                             "other scheduler (its address as this one's machines reach it)");
    }
    if (runs_store_clients && config.store_uri.empty() && !has_store && store_url.empty()) {
      return InvalidArgument("deploy." + target +
                             ".store_url: required, since the store server runs on the other "
                             "scheduler (its address as this one's machines reach it)");
    }
    return Status::Ok();
  };
  bool slurm_regions = false, kubernetes_regions = !k.regions.empty();
  for (const RegionConfig& r : config.regions)
    slurm_regions = slurm_regions || !s.RegionPartitions(r.name).empty();
  WEFT_RETURN_IF_ERROR(needs(
      s.present, slurm_regions || s.trainer.has_value(), slurm_regions || s.trainer.has_value(),
      "slurm", s.orchestrator.has_value(), s.orchestrator_url, s.store.has_value(), s.store_url));
  WEFT_RETURN_IF_ERROR(needs(k.present, kubernetes_regions || k.trainer.has_value(),
                             kubernetes_regions || k.trainer.has_value(), "kubernetes",
                             k.orchestrator.has_value(), k.orchestrator_url, k.store.has_value(),
                             k.store_url));
  // GPUs per worker against what each region's partitions declare.
  for (const RegionConfig& r : config.regions) {
    for (const SlurmPartition* p : s.RegionPartitions(r.name)) {
      if (s.worker_gpus > p->gpus) {
        return InvalidArgument("deploy.slurm.workers.gpus: " + std::to_string(s.worker_gpus) +
                               " GPUs per worker, but partition " + p->name + " (region " + r.name +
                               ") declares " + std::to_string(p->gpus) +
                               " per node (deploy.slurm.partitions." + p->name + ".gpus)");
      }
    }
  }
  // The built-in trainer is one process.
  if (config.trainer_command.empty() && s.trainer &&
      s.trainer_nodes * s.trainer_tasks_per_node > 1) {
    return InvalidArgument(
        "deploy.slurm.trainer: the built-in trainer runs as one process; more than one node or "
        "task needs a trainer of your own (trainer.command) that publishes one shard per rank");
  }
  // The engine: who starts the replicas of a serving engine.
  const bool embedded = config.worker.engine == "embedded";
  const YAML::Node engine_section = config.document["engine"];
  const bool urls_given = engine_section && engine_section.IsMap() &&
                          (engine_section["urls"] || engine_section["urls_file"]);
  if (embedded && !d.engine.command.empty()) {
    return InvalidArgument(
        "deploy.engine: worker.engine is embedded (the policy runs inside the worker); there are "
        "no replicas to start");
  }
  if (!embedded && d.engine.command.empty() && !urls_given) {
    return InvalidArgument("deploy.engine.command: workers drive " + config.worker.engine +
                           " replicas, and nothing starts them: give the command that starts "
                           "one, or engine.urls / engine.urls_file for replicas started "
                           "elsewhere");
  }
  if (!d.engine.command.empty()) {
    for (const auto& [target, gpus] :
         {std::pair<std::string, int>{"slurm", s.worker_gpus}, {"kubernetes", k.worker_gpus}}) {
      const bool runs = target == "slurm" ? slurm_regions : kubernetes_regions;
      if (!runs) continue;
      if (d.engine.gpus == 0 ? gpus != 0 : (gpus < d.engine.gpus || gpus % d.engine.gpus != 0)) {
        return InvalidArgument("deploy." + target + ".workers.gpus: " + std::to_string(gpus) +
                               " GPUs per worker cannot be split into replicas of " +
                               std::to_string(d.engine.gpus) + " (deploy.engine.gpus)");
      }
    }
    if (kubernetes_regions && d.engine.image.empty()) {
      return InvalidArgument(
          "deploy.engine.image: required on Kubernetes, where the engine runs as a second "
          "container of the worker's pod");
    }
    // Replica ports must not meet the services' on a shared node.
  }
  // Services listen on every address of their node at the config's port: no two may share one.
  std::map<int, std::string> ports;
  auto port = [&](const std::string& listen, const std::string& key) -> Status {
    const int p = ListenPort(listen);
    if (auto [it, fresh] = ports.emplace(p, key); !fresh) {
      return InvalidArgument(key + ": port " + std::to_string(p) + " is " + it->second +
                             "'s too; deployed services listen on every address of their node, "
                             "so each needs a port of its own");
    }
    return Status::Ok();
  };
  WEFT_RETURN_IF_ERROR(port(config.orchestrator_listen(), "orchestrator.listen"));
  if (config.store_uri.empty()) WEFT_RETURN_IF_ERROR(port(config.store_listen, "store.listen"));
  for (size_t i = 0; i < config.regions.size(); ++i)
    WEFT_RETURN_IF_ERROR(
        port(config.regions[i].relay_listen, "regions[" + std::to_string(i) + "].relay"));
  return Status::Ok();
}

}  // namespace

const SlurmPartition* SlurmDeploy::FindPartition(const std::string& name) const {
  for (const SlurmPartition& p : partitions) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const SlurmPartition*> SlurmDeploy::RegionPartitions(const std::string& region) const {
  std::vector<const SlurmPartition*> out;
  for (const SlurmPartition& p : partitions) {
    if (p.region == region) out.push_back(&p);
  }
  return out;
}

const KubernetesRegion* KubernetesDeploy::FindRegion(const std::string& name) const {
  for (const KubernetesRegion& r : regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

bool IsKubernetesQuantity(const std::string& value) {
  // A decimal number, then an optional suffix: a binary (Ki..Ei) or decimal (m, k, M..E) one.
  size_t i = 0;
  while (i < value.size() && std::isdigit(static_cast<unsigned char>(value[i]))) ++i;
  if (i < value.size() && value[i] == '.') {
    ++i;
    while (i < value.size() && std::isdigit(static_cast<unsigned char>(value[i]))) ++i;
  }
  if (i == 0 || (i == 1 && value[0] == '.')) return false;
  const std::string suffix = value.substr(i);
  static const std::set<std::string> suffixes = {"",  "m",  "k",  "M",  "G",  "T",  "P",
                                                 "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  return suffixes.count(suffix) > 0;
}

Status ParseDeploySection(const YAML::Node& node, const RunConfig& config, DeployConfig* deploy) {
  if (!node) return Status::Ok();
  deploy->present = true;
  WEFT_RETURN_IF_ERROR(CheckKeys(node, "deploy", {"engine", "slurm", "kubernetes"}));
  if (const YAML::Node engine = node["engine"])
    WEFT_RETURN_IF_ERROR(ParseEngine(engine, &deploy->engine));
  if (const YAML::Node slurm = node["slurm"])
    WEFT_RETURN_IF_ERROR(ParseSlurm(slurm, &deploy->slurm));
  if (const YAML::Node kubernetes = node["kubernetes"])
    WEFT_RETURN_IF_ERROR(ParseKubernetes(kubernetes, &deploy->kubernetes));
  return CheckPlacement(config, *deploy);
}

}  // namespace weft::cli
