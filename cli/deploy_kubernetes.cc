// The Kubernetes manifests of a deployment (cli/deploy.h): one file per component, each a stream
// of YAML documents, and secrets.sh, which creates the Secrets they read. Which objects, with which
// names, labels, volumes and variables, is in docs/deploy.md ("Kubernetes").
//
// Every object is built as a typed tree (nlohmann::ordered_json: strings stay strings, numbers
// numbers) and emitted with yaml-cpp, quoting each string that YAML would read as another type:
// no value of the config is ever pasted into YAML text. Values that the kubelet would expand
// ($(NAME) in a container's command, arguments and variables) are escaped. Tokens never appear:
// the processes take them from Secrets (secretKeyRef), which secrets.sh creates from the
// environment of whoever runs it.
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/deploy.h"
#include "cli/trainer_channel.h"

// A namespace of its own: in a unity build the CLI's files share one anonymous namespace.
namespace weft::cli::kubernetes_deploy {
namespace {

using Object = nlohmann::ordered_json;
namespace fs = std::filesystem;

// Object names. One run per namespace: the names are fixed, so that the Services' names (and so
// the URLs the processes are given) are known before anything runs.
constexpr char kConfigMap[] = "weft-config";
constexpr char kOrchestrator[] = "weft-orchestrator";
constexpr char kStore[] = "weft-store";
constexpr char kTrainer[] = "weft-trainer";
std::string RelayName(const std::string& region) { return "weft-relay-" + region; }
std::string WorkersName(const std::string& region) { return "weft-workers-" + region; }
// A region's name ends up in a StatefulSet's name (weft-relay-REGION), which with the hash
// Kubernetes appends in a label must stay within 63 characters.
constexpr size_t kLongestRegion = 41;

// Paths inside the containers.
constexpr char kConfigDir[] = "/etc/weft";  // the ConfigMap
constexpr char kRunConfigKey[] = "config.yaml";
constexpr char kOrchestratorKey[] = "orchestrator.yaml";
constexpr char kSettingsKey[] = "trainer-settings.json";
constexpr char kDataDir[] = "/var/lib/weft";      // the orchestrator's and the store's volume
constexpr char kCacheDir[] = "/var/cache/weft";   // a relay's volume
constexpr char kRunDir[] = "/var/lib/weft/run";   // the trainer's WEFT_RUN_DIR (an emptyDir)
constexpr char kPodStateDir[] = "/var/run/weft";  // a worker pod's: the worker's exit marker
constexpr char kWorkerExited[] = "/var/run/weft/worker-exited";
constexpr char kSharedMemory[] = "/dev/shm";

// Beyond the drain, the time a worker pod gets to stop: the engines' own exit after theirs.
constexpr int64_t kDrainMargin = 30;

// The orchestrator's gauges that the autoscalers' metric adds up (docs/deploy.md gives the
// Prometheus adapter's rule that serves it).
constexpr char kOutstandingJobsMetric[] = "weft_orchestrator_jobs_outstanding";

// The orchestrator's role tokens, from the tokens Secret.
struct RoleToken {
  const char* variable;
  const char* key;
};
constexpr RoleToken kRoleTokens[] = {{"WEFT_WORKER_TOKEN", "worker"},
                                     {"WEFT_TRAINER_TOKEN", "trainer"},
                                     {"WEFT_ADMIN_TOKEN", "admin"}};
constexpr char kStoreTokenKey[] = "store";             // the store server's writer token
constexpr char kEngineApiKeyKey[] = "engine-api-key";  // engine.api_key_env's value

// The S3 credentials a store reads from the environment (docs/store.md, "Configuration"), from
// the S3 Secret; the optional ones only where secrets.sh found them set.
struct S3Variable {
  const char* name;
  bool required;
};
constexpr S3Variable kS3Variables[] = {{"AWS_ACCESS_KEY_ID", true},
                                       {"AWS_SECRET_ACCESS_KEY", true},
                                       {"AWS_SESSION_TOKEN", false},
                                       {"AWS_REGION", false},
                                       {"AWS_ENDPOINT_URL_S3", false}};

// Runs the worker (the arguments after the first) and, once it has exited, however it ended,
// creates the file the first names: the engine containers' preStop hook waits for that file, so
// the engines go on serving until the worker's drain (submitting the jobs in flight) is over. The
// shell passes a stop signal on to the worker and waits for it to exit; a worker restarted in
// the same pod starts without the file.
constexpr char kWorkerWrapper[] = R"(marker=$1
shift
rm -f "$marker"
pid=
stopping=
trap 'stopping=1; [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null' TERM INT
"$@" &
pid=$!
[ -z "$stopping" ] || kill -TERM "$pid" 2>/dev/null
while :; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done
touch "$marker"
exit "$status"
)";
// An engine container's preStop hook: waits for the worker's exit marker ($0).
constexpr char kWaitForWorker[] = R"(until [ -e "$0" ]; do sleep 1; done)";

// --- YAML -----------------------------------------------------------------------------------

// Strings a YAML 1.1 or 1.2 reader (kubectl's is 1.1) would take for a number, a boolean, a null
// or a timestamp when written plain.
bool NeedsQuotes(const std::string& s) {
  static const std::set<std::string> words = {
      "y",    "Y",    "yes",   "Yes",   "YES",   "n",     "N",     "no",   "No",   "NO",
      "true", "True", "TRUE",  "false", "False", "FALSE", "on",    "On",   "ON",   "off",
      "Off",  "OFF",  "null",  "Null",  "NULL",  "~",     ".inf",  ".Inf", ".INF", ".nan",
      ".NaN", ".NAN", "-.inf", "-.Inf", "-.INF", "+.inf", "+.Inf", "+.INF"};
  if (s.empty() || words.count(s)) return true;
  const size_t first = s[0] == '-' || s[0] == '+' ? 1 : 0;
  return first < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[first])) || s[first] == '.');
}

// A text that reads back the same from a literal block (`|`): one final line break, no leading
// space or blank line (which would need an indentation indicator), printable.
bool FitsLiteralBlock(const std::string& s) {
  if (s.size() < 2 || s.back() != '\n' || s[s.size() - 2] == '\n' || s[0] == ' ' || s[0] == '\n')
    return false;
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n') || c == 0x7f) return false;
  }
  return true;
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  if (s.find('\n') != std::string::npos && FitsLiteralBlock(s)) {
    out << YAML::Literal << s;
  } else if (NeedsQuotes(s)) {
    out << YAML::DoubleQuoted << s;
  } else {
    out << s;  // yaml-cpp quotes it where YAML's syntax needs it
  }
}

void Emit(YAML::Emitter& out, const Object& value) {
  switch (value.type()) {
    case Object::value_t::object:
      if (value.empty()) out << YAML::Flow;  // {} on the key's line
      out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        out << YAML::Key;
        EmitString(out, key);
        out << YAML::Value;
        Emit(out, item);
      }
      out << YAML::EndMap;
      break;
    case Object::value_t::array:
      if (value.empty()) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const Object& item : value) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case Object::value_t::string:
      EmitString(out, value.get<std::string>());
      break;
    case Object::value_t::boolean:
      out << value.get<bool>();
      break;
    case Object::value_t::number_integer:
    case Object::value_t::number_unsigned:
      out << value.get<int64_t>();
      break;
    default:  // the manifests hold no other kind of value
      out << YAML::Null;
      break;
  }
}

// One file: a comment saying what it holds, then one YAML document per object.
DeployFile Manifest(const std::string& path, const std::string& what,
                    const std::vector<Object>& objects) {
  std::string text = "# " + what + " (weft deploy kubernetes; docs/deploy.md)\n";
  for (const Object& object : objects) {
    YAML::Emitter out;
    Emit(out, object);
    text += "---\n" + std::string(out.c_str()) + "\n";
  }
  return DeployFile{path, text};
}

// --- Pieces of objects ----------------------------------------------------------------------

// The kubelet expands $(NAME) in a container's command, arguments and variables, and reads $$ as
// $: every value from the config goes through this, so that it reaches the process as written.
std::string Verbatim(const std::string& value) {
  std::string out;
  for (char c : value) out += c == '$' ? "$$" : std::string(1, c);
  return out;
}

std::vector<std::string> Verbatim(const std::vector<std::string>& words) {
  std::vector<std::string> out;
  for (const std::string& w : words) out.push_back(Verbatim(w));
  return out;
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The labels that tell the objects apart (and that Services and workloads select by).
Object Labels(const std::string& component, const std::string& region = "") {
  Object labels = Object::object();
  labels["app.kubernetes.io/name"] = "weft";
  labels["app.kubernetes.io/component"] = component;
  if (!region.empty()) labels["weft/region"] = region;
  return labels;
}

Object Metadata(const std::string& name, const KubernetesDeploy& k, const Object& labels) {
  Object metadata = Object::object();
  metadata["name"] = name;
  metadata["namespace"] = k.namespace_;
  Object all = labels;
  all["app.kubernetes.io/managed-by"] = "weft-deploy";
  metadata["labels"] = all;
  return metadata;
}

Object Env(const std::string& name, const std::string& value) {
  return Object{{"name", name}, {"value", Verbatim(value)}};
}

Object SecretEnv(const std::string& name, const std::string& secret, const std::string& key,
                 bool optional = false) {
  Object ref = Object{{"name", secret}, {"key", key}};
  if (optional) ref["optional"] = true;
  return Object{{"name", name}, {"valueFrom", Object{{"secretKeyRef", ref}}}};
}

Object PodNameEnv() {
  return Object{{"name", "POD_NAME"},
                {"valueFrom", Object{{"fieldRef", Object{{"fieldPath", "metadata.name"}}}}}};
}

// Requests from the config, memory limited to its request (a process over it is killed rather
// than starving its node's others; CPU is left unlimited, since a throttled server answers late);
// GPUs as a limit, which Kubernetes also takes as the request.
Object Resources(const KubernetesResources& r, int gpus) {
  Object requests = Object::object(), limits = Object::object();
  if (!r.cpu.empty()) requests["cpu"] = r.cpu;
  if (!r.memory.empty()) {
    requests["memory"] = r.memory;
    limits["memory"] = r.memory;
  }
  if (gpus > 0) limits["nvidia.com/gpu"] = std::to_string(gpus);
  Object resources = Object::object();
  if (!requests.empty()) resources["requests"] = requests;
  if (!limits.empty()) resources["limits"] = limits;
  return resources;
}

Object HttpProbe(const std::string& path, int port, int period, int failures) {
  return Object{{"httpGet", Object{{"path", path}, {"port", port}}},
                {"periodSeconds", period},
                {"timeoutSeconds", 5},
                {"failureThreshold", failures}};
}

Object Mount(const std::string& volume, const std::string& path, bool read_only = false) {
  Object mount = Object{{"name", volume}, {"mountPath", path}};
  if (read_only) mount["readOnly"] = true;
  return mount;
}

Object ConfigVolume() {
  return Object{{"name", "config"}, {"configMap", Object{{"name", kConfigMap}}}};
}

Object MemoryVolume(const std::string& name) {
  return Object{{"name", name}, {"emptyDir", Object{{"medium", "Memory"}}}};
}

Object EmptyVolume(const std::string& name) {
  return Object{{"name", name}, {"emptyDir", Object::object()}};
}

Object Container(const std::string& name, const std::string& image, const KubernetesDeploy& k,
                 const std::vector<std::string>& command) {
  return Object{{"name", name},
                {"image", image},
                {"imagePullPolicy", k.image_pull_policy},
                {"command", command}};
}

// A container serving HTTP on `port`: its port, named http, which its Service targets.
void AddPort(Object& container, int port) {
  container["ports"] = Object::array({Object{{"name", "http"}, {"containerPort", port}}});
}

// Prometheus' annotations for the pod's /metrics (a scrape configuration that honours them, as the
// common kubernetes-pods one does, finds the servers by these).
Object ScrapeAnnotations(int port) {
  return Object{{"prometheus.io/scrape", "true"},
                {"prometheus.io/port", std::to_string(port)},
                {"prometheus.io/path", "/metrics"}};
}

// A pod template. Services' variables stay out of the environment (WEFT_STORE_PORT and the like
// would sit beside the variables weft reads).
Object PodTemplate(const Object& labels, const Object& annotations, Object spec) {
  Object metadata = Object{{"labels", labels}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  spec["enableServiceLinks"] = false;
  return Object{{"metadata", metadata}, {"spec", spec}};
}

Object NodeSelector(const KubernetesRegion& region) {
  Object selector = Object::object();
  for (const auto& [key, value] : region.node_selector) selector[key] = value;
  return selector;
}

Object ClaimTemplate(const std::string& name, const std::string& size, const KubernetesDeploy& k) {
  Object spec = Object{{"accessModes", Object::array({"ReadWriteOnce"})},
                       {"resources", Object{{"requests", Object{{"storage", size}}}}}};
  if (!k.storage_class.empty()) spec["storageClassName"] = k.storage_class;
  return Object{{"metadata", Object{{"name", name}}}, {"spec", spec}};
}

// One replica with a volume of its own that outlives it.
Object StatefulSet(const std::string& name, const KubernetesDeploy& k, const Object& labels,
                   const Object& pod, const Object& claim) {
  Object spec = Object{{"serviceName", name},
                       {"replicas", 1},
                       {"selector", Object{{"matchLabels", labels}}},
                       {"template", pod},
                       {"volumeClaimTemplates", Object::array({claim})}};
  return Object{{"apiVersion", "apps/v1"},
                {"kind", "StatefulSet"},
                {"metadata", Metadata(name, k, labels)},
                {"spec", spec}};
}

Object Service(const std::string& name, const KubernetesDeploy& k, const Object& labels, int port) {
  Object spec = Object{
      {"selector", labels},
      {"ports",
       Object::array({Object{
           {"name", "http"}, {"port", port}, {"targetPort", "http"}, {"protocol", "TCP"}}})}};
  return Object{{"apiVersion", "v1"},
                {"kind", "Service"},
                {"metadata", Metadata(name, k, labels)},
                {"spec", spec}};
}

// The bytes of a Kubernetes quantity (checked by the parser).
uint64_t QuantityBytes(const std::string& quantity) {
  size_t end = 0;
  const double number = std::stod(quantity, &end);
  const std::string suffix = quantity.substr(end);
  static const std::map<std::string, double> scale = {
      {"", 1},        {"m", 1e-3},    {"k", 1e3},     {"M", 1e6},     {"G", 1e9},
      {"T", 1e12},    {"P", 1e15},    {"E", 1e18},    {"Ki", 0x1p10}, {"Mi", 0x1p20},
      {"Gi", 0x1p30}, {"Ti", 0x1p40}, {"Pi", 0x1p50}, {"Ei", 0x1p60}};
  const auto it = scale.find(suffix);
  const double bytes = number * (it == scale.end() ? 1 : it->second);
  return bytes >= 0x1p63 ? (uint64_t{1} << 63) : static_cast<uint64_t>(bytes);
}

// --- The deployment -------------------------------------------------------------------------

class Generator {
 public:
  Generator(const RunConfig& config, const DeployContext& context)
      : config_(config), context_(context), d_(config.deploy), k_(config.deploy.kubernetes) {}

  Result<std::vector<DeployFile>> Run();

 private:
  Status Check();
  Status CheckEngine();
  std::string OrchestratorUrl() const;
  std::string StoreUrl() const;
  bool S3Store() const { return config_.store_uri.rfind("s3://", 0) == 0; }
  // A store server's writer token goes to whoever publishes through it.
  bool StoreServerToken() const { return !S3Store(); }
  void AddS3Env(Object& env) const;
  void AddRoleTokens(Object& env, const std::string& own) const;

  DeployFile ConfigMap() const;
  DeployFile Orchestrator() const;
  DeployFile Store() const;
  DeployFile Relay(const RegionConfig& region, const KubernetesRegion& placement) const;
  DeployFile Workers(const RegionConfig& region, const KubernetesRegion& placement) const;
  DeployFile Trainer() const;
  DeployFile SecretsScript() const;

  const RunConfig& config_;
  const DeployContext& context_;
  const DeployConfig& d_;
  const KubernetesDeploy& k_;
  std::string api_key_env_;       // engine.api_key_env
  std::string checkpoint_dir_;    // engine.checkpoint_dir, with the engine in the worker's pod
  std::string checkpoint_mount_;  // where its volume is mounted
  int replicas_ = 0;              // engine replicas per worker pod (0: no engine container)
};

std::string Generator::OrchestratorUrl() const {
  if (!k_.orchestrator) return k_.orchestrator_url;
  return "http://" + std::string(kOrchestrator) + ":" +
         std::to_string(ListenPort(config_.orchestrator_listen()));
}

std::string Generator::StoreUrl() const {
  if (!config_.store_uri.empty()) return config_.store_uri;
  if (!k_.store) return k_.store_url;
  return "http://" + std::string(kStore) + ":" + std::to_string(ListenPort(config_.store_listen));
}

void Generator::AddS3Env(Object& env) const {
  if (!S3Store()) return;
  for (const S3Variable& v : kS3Variables)
    env.push_back(SecretEnv(v.name, k_.s3_secret, v.name, !v.required));
}

// A worker's or the trainer's own role token, from the tokens Secret: no process but the
// orchestrator holds another role's.
void Generator::AddRoleTokens(Object& env, const std::string& own) const {
  for (const RoleToken& t : kRoleTokens) {
    if (own == t.key) env.push_back(SecretEnv(t.variable, k_.tokens_secret, t.key));
  }
}

Status Generator::Check() {
  // Object names and labels hold the regions' names.
  for (size_t i = 0; i < config_.regions.size(); ++i) {
    const std::string& name = config_.regions[i].name;
    if (k_.FindRegion(name) == nullptr) continue;
    if (name.size() > kLongestRegion || !std::isalnum(static_cast<unsigned char>(name.front())) ||
        !std::isalnum(static_cast<unsigned char>(name.back()))) {
      return InvalidArgument("regions[" + std::to_string(i) + "].name: '" + name +
                             "' cannot name Kubernetes objects (weft-relay-" + name +
                             "): at most " + std::to_string(kLongestRegion) +
                             " characters, starting and ending with a letter or digit");
    }
  }
  if (!config_.store_uri.empty() && !S3Store() && config_.store_uri.rfind("http://", 0) != 0 &&
      config_.store_uri.rfind("https://", 0) != 0) {
    return InvalidArgument("store.uri: '" + config_.store_uri +
                           "' is a directory of this machine, which no pod sees; give an s3:// "
                           "store or a store server's http(s):// URL, or leave it out to run the "
                           "store server (deploy.kubernetes.store)");
  }
  if (!k_.regions.empty() && QuantityBytes(k_.relay_cache_size) < (uint64_t{64} << 20)) {
    return InvalidArgument("deploy.kubernetes.relays.cache_size: '" + k_.relay_cache_size +
                           "' is too small for a relay's cache (64Mi at least)");
  }
  // Variables the deployment sets itself, from Secrets or to its own paths.
  std::set<std::string> ours = {"WEFT_WORKER_TOKEN", "WEFT_ADMIN_TOKEN", "WEFT_STORE_TOKEN"};
  for (const S3Variable& v : kS3Variables) ours.insert(v.name);
  for (const auto& [variable, value] : config_.trainer_env) {
    if (ours.count(variable)) {
      return InvalidArgument("trainer.env." + variable +
                             ": the deployment sets it (from a Secret, docs/deploy.md); leave it "
                             "out");
    }
  }
  // A token in the run config would be in the ConfigMap for anyone who may read the namespace's.
  if (const YAML::Node task = config_.document["task"]; task && task.IsMap() && task["token"]) {
    return InvalidArgument(
        "task.token: the reward service's token would be written into the run config's "
        "ConfigMap, and deployed manifests hold no token; leave it out (a reward service that "
        "only the cluster reaches needs none)");
  }
  if (const YAML::Node engine = config_.document["engine"];
      engine && engine.IsMap() && engine["api_key_env"]) {
    api_key_env_ = engine["api_key_env"].as<std::string>("");
    const bool name = IsEnvironmentVariableName(api_key_env_);
    if (!name) {
      return InvalidArgument("engine.api_key_env: '" + api_key_env_ +
                             "' is not an environment variable's name");
    }
  }
  for (const auto& [variable, value] : d_.engine.env) {
    if (variable == "POD_NAME" || variable == api_key_env_) {
      return InvalidArgument("deploy.engine.env." + variable +
                             ": the deployment sets it (the pod's name, or the key of "
                             "engine.api_key_env from a Secret); leave it out");
    }
  }
  if (!k_.regions.empty()) WEFT_RETURN_IF_ERROR(CheckEngine());
  if (k_.models && replicas_ == 0) {
    return InvalidArgument(
        "deploy.kubernetes.workers.models: only for engines started in the worker's pod "
        "(deploy.engine.command)");
  }
  // The files must not replace the config they come from.
  for (const char* file : {"config.yaml", "orchestrator.yaml", "store.yaml", "trainer.yaml"}) {
    if ((fs::path(context_.out_dir) / file).lexically_normal() ==
        fs::path(context_.config_path).lexically_normal()) {
      return InvalidArgument("--out: " + context_.out_dir + "/" + file +
                             " would replace the run config itself; give another directory");
    }
  }
  return Status::Ok();
}

// A serving engine in the worker's pod: one container per replica, each with its share of the
// worker's GPUs, all loading the served checkpoint directory from a memory volume they share.
Status Generator::CheckEngine() {
  if (d_.engine.command.empty()) return Status::Ok();
  replicas_ = d_.engine.gpus > 0 ? k_.worker_gpus / d_.engine.gpus : 1;
  const YAML::Node engine = config_.document["engine"];
  checkpoint_dir_ = engine && engine.IsMap() && engine["checkpoint_dir"]
                        ? engine["checkpoint_dir"].as<std::string>("")
                        : "";
  if (checkpoint_dir_.empty()) {
    return InvalidArgument("engine.checkpoint_dir: required with worker.engine " +
                           config_.worker.engine +
                           " (the served checkpoint directory, on the worker pod's memory volume)");
  }
  const fs::path dir = fs::path(checkpoint_dir_).lexically_normal();
  if (!dir.is_absolute()) {
    return InvalidArgument("engine.checkpoint_dir: '" + checkpoint_dir_ +
                           "' is not an absolute path; the worker's and the engines' containers "
                           "mount its volume there");
  }
  // The volume is mounted where the path stops being the same for every worker: above a
  // {cluster} component, which the worker replaces by its cluster's (its pod's) name. Under
  // /dev/shm, the volume is /dev/shm itself, which the engines need large anyway.
  fs::path mount;
  for (const fs::path& part : dir) {
    if (part.string().find("{cluster}") != std::string::npos) break;
    mount /= part;
  }
  mount = mount.lexically_normal();
  std::string mount_text = mount.string();
  if (mount_text.size() > 1 && mount_text.back() == '/') mount_text.pop_back();
  const auto within = [](const std::string& path, const std::string& dir) {
    return path == dir || path.rfind(dir + "/", 0) == 0;
  };
  if (within(mount_text, kSharedMemory)) mount_text = kSharedMemory;
  if (mount_text == "/" || mount_text.empty()) {
    return InvalidArgument("engine.checkpoint_dir: '" + checkpoint_dir_ +
                           "' leaves no directory above {cluster} to mount its volume on");
  }
  std::vector<std::pair<std::string, std::string>> taken = {{kConfigDir, "the run config"},
                                                            {kPodStateDir, "the worker's state"}};
  if (k_.models) taken.emplace_back(k_.models->path, "the models");
  for (const auto& [path, what] : taken) {
    if (within(mount_text, path) || within(path, mount_text)) {
      return InvalidArgument("engine.checkpoint_dir: '" + checkpoint_dir_ + "' meets " + path +
                             ", where the worker's pod mounts " + what +
                             "; give a directory of its own");
    }
  }
  checkpoint_mount_ = mount_text;
  return Status::Ok();
}

DeployFile Generator::ConfigMap() const {
  Object data = Object::object();
  data[kRunConfigKey] = DeployedRunConfigYaml(config_, /*without_tokens=*/true);
  if (k_.orchestrator) {
    data[kOrchestratorKey] = DeployedOrchestratorYaml(
        config_, std::string(kDataDir) + "/orchestrator.journal", /*without_tokens=*/true);
  }
  if (k_.trainer) data[kSettingsKey] = TrainerSettingsJson(config_).dump(2) + "\n";
  const Object object = Object{{"apiVersion", "v1"},
                               {"kind", "ConfigMap"},
                               {"metadata", Metadata(kConfigMap, k_, Labels("config"))},
                               {"data", data}};
  return Manifest("config.yaml", "the run config, the orchestrator's and the trainer's settings",
                  {object});
}

DeployFile Generator::Orchestrator() const {
  const int port = ListenPort(config_.orchestrator_listen());
  const Object labels = Labels("orchestrator");
  Object env = Object::array();
  for (const RoleToken& t : kRoleTokens)
    env.push_back(SecretEnv(t.variable, k_.tokens_secret, t.key));
  Object container = Container(
      "orchestrator", k_.image, k_,
      {"weft", "orchestrator", "--config", std::string(kConfigDir) + "/" + kOrchestratorKey});
  AddPort(container, port);
  container["env"] = env;
  // The server answers once the journal is replayed: a long replay is a slow start, not a hang.
  container["startupProbe"] = HttpProbe("/livez", port, 5, 120);
  container["readinessProbe"] = HttpProbe("/readyz", port, 5, 3);
  container["livenessProbe"] = HttpProbe("/livez", port, 10, 6);
  container["resources"] = Resources(*k_.orchestrator, 0);
  container["volumeMounts"] =
      Object::array({Mount("config", kConfigDir, true), Mount("journal", kDataDir)});
  const Object pod = PodTemplate(labels, ScrapeAnnotations(port),
                                 Object{{"containers", Object::array({container})},
                                        {"volumes", Object::array({ConfigVolume()})}});
  return Manifest(
      "orchestrator.yaml", "the orchestrator, its journal on a volume of its own",
      {Service(kOrchestrator, k_, labels, port),
       StatefulSet(kOrchestrator, k_, labels, pod, ClaimTemplate("journal", k_.journal_size, k_))});
}

DeployFile Generator::Store() const {
  const int port = ListenPort(config_.store_listen);
  const Object labels = Labels("store");
  Object container =
      Container("store", k_.image, k_,
                {"weft", "store", "serve", "--store", std::string(kDataDir) + "/store", "--listen",
                 "0.0.0.0:" + std::to_string(port)});
  AddPort(container, port);
  container["env"] =
      Object::array({SecretEnv("WEFT_STORE_TOKEN", k_.tokens_secret, kStoreTokenKey)});
  container["readinessProbe"] = HttpProbe("/livez", port, 5, 3);
  container["livenessProbe"] = HttpProbe("/livez", port, 10, 6);
  container["resources"] = Resources(*k_.store, 0);
  container["volumeMounts"] = Object::array({Mount("store", kDataDir)});
  const Object pod = PodTemplate(labels, ScrapeAnnotations(port),
                                 Object{{"containers", Object::array({container})}});
  return Manifest(
      "store.yaml", "the store server, the store on a volume of its own",
      {Service(kStore, k_, labels, port),
       StatefulSet(kStore, k_, labels, pod, ClaimTemplate("store", k_.store_size, k_))});
}

DeployFile Generator::Relay(const RegionConfig& region, const KubernetesRegion& placement) const {
  const int port = ListenPort(region.relay_listen);
  const std::string name = RelayName(region.name);
  const Object labels = Labels("relay", region.name);
  // Nine tenths of the volume: its file system takes some, and so do files being written.
  const uint64_t cache_bytes = QuantityBytes(k_.relay_cache_size) / 10 * 9;
  // Unshaped: a relay on Kubernetes is in its region, the WAN link a real one.
  Object container =
      Container("relay", k_.image, k_,
                {"weft", "relay", "--upstream", Verbatim(StoreUrl()), "--cache",
                 std::string(kCacheDir) + "/relay", "--max-bytes", std::to_string(cache_bytes),
                 "--listen", "0.0.0.0:" + std::to_string(port)});
  AddPort(container, port);
  Object env = Object::array();
  AddS3Env(env);
  if (!env.empty()) container["env"] = env;
  container["readinessProbe"] = HttpProbe("/livez", port, 5, 3);
  container["livenessProbe"] = HttpProbe("/livez", port, 10, 6);
  container["resources"] = Resources(k_.relays, 0);
  container["volumeMounts"] = Object::array({Mount("cache", kCacheDir)});
  Object spec = Object{{"containers", Object::array({container})}};
  if (!placement.node_selector.empty()) spec["nodeSelector"] = NodeSelector(placement);
  const Object pod = PodTemplate(labels, ScrapeAnnotations(port), spec);
  return Manifest(
      "relay-" + region.name + ".yaml",
      "the relay of region " + region.name + ", its cache on a volume of its own",
      {Service(name, k_, labels, port),
       StatefulSet(name, k_, labels, pod, ClaimTemplate("cache", k_.relay_cache_size, k_))});
}

DeployFile Generator::Workers(const RegionConfig& region, const KubernetesRegion& placement) const {
  const std::string name = WorkersName(region.name);
  const Object labels = Labels("worker", region.name);
  const int relay_port = ListenPort(region.relay_listen);
  std::vector<std::string> worker = {
      "weft",           "worker",
      "--config",       std::string(kConfigDir) + "/" + kRunConfigKey,
      "--cluster",      "$(POD_NAME)",
      "--region",       region.name,
      "--orchestrator", Verbatim(OrchestratorUrl()),
      "--store",        "http://" + RelayName(region.name) + ":" + std::to_string(relay_port)};
  for (int r = 0; r < replicas_; ++r) {
    worker.insert(worker.end(),
                  {"--engine-url", "http://127.0.0.1:" + std::to_string(d_.engine.port + r)});
  }
  std::vector<std::string> command = worker;
  if (replicas_ > 0) {
    command = {"sh", "-c", kWorkerWrapper, "weft-worker", kWorkerExited};
    command.insert(command.end(), worker.begin(), worker.end());
  }
  Object env = Object::array({PodNameEnv()});
  AddRoleTokens(env, "worker");
  if (!api_key_env_.empty())
    env.push_back(SecretEnv(api_key_env_, k_.tokens_secret, kEngineApiKeyKey));
  Object container = Container("worker", k_.image, k_, command);
  container["env"] = env;
  container["resources"] = Resources(k_.workers, replicas_ > 0 ? 0 : k_.worker_gpus);
  Object mounts = Object::array({Mount("config", kConfigDir, true)});
  Object volumes = Object::array({ConfigVolume()});
  Object containers = Object::array();
  if (replicas_ > 0) {
    mounts.push_back(Mount("served", checkpoint_mount_));
    mounts.push_back(Mount("pod-state", kPodStateDir));
    volumes.push_back(MemoryVolume("served"));
    volumes.push_back(EmptyVolume("pod-state"));
    const bool own_shared_memory = checkpoint_mount_ != kSharedMemory;
    if (own_shared_memory) volumes.push_back(MemoryVolume("dshm"));
    if (k_.models) {
      mounts.push_back(Mount("models", k_.models->path, true));
      if (k_.models->claim.empty()) {
        volumes.push_back(EmptyVolume("models"));
      } else {
        volumes.push_back(Object{{"name", "models"},
                                 {"persistentVolumeClaim",
                                  Object{{"claimName", k_.models->claim}, {"readOnly", true}}}});
      }
    }
    container["volumeMounts"] = mounts;
    containers.push_back(container);
    for (int r = 0; r < replicas_; ++r) {
      std::vector<std::string> engine_command;
      for (const std::string& word : d_.engine.command) {
        std::string filled = Verbatim(word);
        filled = Replace(filled, "{port}", std::to_string(d_.engine.port + r));
        filled = Replace(filled, "{gpus}", std::to_string(d_.engine.gpus));
        filled = Replace(filled, "{replica}", std::to_string(r));
        filled = Replace(filled, "{cluster}", "$(POD_NAME)");
        engine_command.push_back(filled);
      }
      Object engine = Container("engine-" + std::to_string(r), d_.engine.image, k_, engine_command);
      Object engine_env = Object::array({PodNameEnv()});
      for (const auto& [variable, value] : d_.engine.env)
        engine_env.push_back(Env(variable, value));
      if (!api_key_env_.empty())
        engine_env.push_back(SecretEnv(api_key_env_, k_.tokens_secret, kEngineApiKeyKey));
      engine["env"] = engine_env;
      engine["resources"] = Resources(k_.engine, d_.engine.gpus);
      Object engine_mounts = Object::array(
          {Mount("served", checkpoint_mount_), Mount("pod-state", kPodStateDir, true)});
      if (own_shared_memory) engine_mounts.push_back(Mount("dshm", kSharedMemory));
      if (k_.models)
        engine_mounts.push_back(Mount("models", k_.models->path, !k_.models->claim.empty()));
      engine["volumeMounts"] = engine_mounts;
      // Stopping the pod stops the engines only once the worker has drained.
      engine["lifecycle"] = Object{
          {"preStop", Object{{"exec", Object{{"command", Object::array({"sh", "-c", kWaitForWorker,
                                                                        kWorkerExited})}}}}}};
      containers.push_back(engine);
    }
  } else {
    container["volumeMounts"] = mounts;
    containers.push_back(container);
  }
  Object spec = Object{{"terminationGracePeriodSeconds", k_.drain.count() + kDrainMargin},
                       {"containers", containers},
                       {"volumes", volumes}};
  if (!placement.node_selector.empty()) spec["nodeSelector"] = NodeSelector(placement);
  Object deployment_spec = Object::object();
  // With an autoscaler the replicas are its; kubectl apply would otherwise set them back.
  if (!k_.autoscale) deployment_spec["replicas"] = region.workers;
  deployment_spec["selector"] = Object{{"matchLabels", labels}};
  deployment_spec["template"] = PodTemplate(labels, Object::object(), spec);
  std::vector<Object> objects = {Object{{"apiVersion", "apps/v1"},
                                        {"kind", "Deployment"},
                                        {"metadata", Metadata(name, k_, labels)},
                                        {"spec", deployment_spec}}};
  if (k_.autoscale) {
    // The orchestrator's outstanding jobs are every region's to share: each Kubernetes region's
    // autoscaler asks for its share of the workers they need.
    const int regions = static_cast<int>(k_.regions.size());
    const Object metric = Object{
        {"type", "External"},
        {"external",
         Object{
             {"metric", Object{{"name", kOutstandingJobsMetric}}},
             {"target", Object{{"type", "AverageValue"},
                               {"averageValue",
                                std::to_string(static_cast<int64_t>(k_.autoscale->jobs_per_worker) *
                                               regions)}}}}}};
    objects.push_back(Object{
        {"apiVersion", "autoscaling/v2"},
        {"kind", "HorizontalPodAutoscaler"},
        {"metadata", Metadata(name, k_, labels)},
        {"spec", Object{{"scaleTargetRef",
                         Object{{"apiVersion", "apps/v1"}, {"kind", "Deployment"}, {"name", name}}},
                        {"minReplicas", k_.autoscale->min},
                        {"maxReplicas", k_.autoscale->max},
                        {"metrics", Object::array({metric})}}}});
  }
  return Manifest("workers-" + region.name + ".yaml",
                  "the rollout workers of region " + region.name +
                      (replicas_ > 0 ? ", each pod with its engine replicas" : ""),
                  objects);
}

DeployFile Generator::Trainer() const {
  const Object labels = Labels("trainer");
  std::vector<std::string> command = {"weft", "train"};  // its flags from the channel's variables
  if (!config_.trainer_command.empty()) command = Verbatim(config_.trainer_command);
  Object env = Object::array();
  for (const auto& [variable, value] : config_.trainer_env) env.push_back(Env(variable, value));
  const std::string config_file = std::string(kConfigDir) + "/" + kRunConfigKey;
  env.push_back(Env(kRunIdVariable, config_.run_id));
  env.push_back(Env(kRunDirVariable, kRunDir));
  env.push_back(Env(kConfigVariable, config_file));
  env.push_back(Env(kStoreVariable, StoreUrl()));
  env.push_back(Env(kStoreUrlVariable, StoreUrl()));
  env.push_back(Env(kOrchestratorVariable, OrchestratorUrl()));
  AddRoleTokens(env, "trainer");
  env.push_back(
      Env(kMaxStalenessVariable, std::to_string(config_.orchestrator.core.max_staleness)));
  env.push_back(Env(kProgressVariable, TrainerProgressPath(kRunDir)));
  env.push_back(Env(kSettingsVariable, std::string(kConfigDir) + "/" + kSettingsKey));
  if (StoreServerToken())
    env.push_back(SecretEnv("WEFT_STORE_TOKEN", k_.tokens_secret, kStoreTokenKey));
  AddS3Env(env);
  Object container = Container("trainer", k_.image, k_, command);
  container["env"] = env;
  container["resources"] = Resources(*k_.trainer, 0);
  container["volumeMounts"] =
      Object::array({Mount("config", kConfigDir, true), Mount("run", kRunDir)});
  // One try: a trainer that failed after publishing cannot publish its versions again.
  Object spec = Object{{"restartPolicy", "Never"},
                       {"containers", Object::array({container})},
                       {"volumes", Object::array({ConfigVolume(), EmptyVolume("run")})}};
  const Object job = Object{
      {"apiVersion", "batch/v1"},
      {"kind", "Job"},
      {"metadata", Metadata(kTrainer, k_, labels)},
      {"spec",
       Object{{"backoffLimit", 0}, {"template", PodTemplate(labels, Object::object(), spec)}}}};
  return Manifest("trainer.yaml",
                  std::string("the trainer (") +
                      (config_.trainer_command.empty() ? "weft train" : "trainer.command") + ")",
                  {job});
}

// secrets.sh: the Secrets, made from its caller's environment. Every value stays in variables
// of the shell; only names (checked DNS labels) are written into the script.
DeployFile Generator::SecretsScript() const {
  const std::string ns = ShellQuote(k_.namespace_);
  const bool store_token = k_.store || (StoreServerToken() && k_.trainer);
  std::string usage, checks, commands;
  usage +=
      "#   WEFT_WORKER_TOKEN, WEFT_TRAINER_TOKEN, WEFT_ADMIN_TOKEN   the orchestrator's role\n"
      "#       tokens (all different), into Secret " +
      k_.tokens_secret + " (keys worker, trainer, admin)\n";
  checks +=
      ": \"${WEFT_WORKER_TOKEN:?must hold the orchestrator worker token}\"\n"
      ": \"${WEFT_TRAINER_TOKEN:?must hold the orchestrator trainer token}\"\n"
      ": \"${WEFT_ADMIN_TOKEN:?must hold the orchestrator admin token}\"\n"
      "if [ \"$WEFT_WORKER_TOKEN\" = \"$WEFT_TRAINER_TOKEN\" ] ||\n"
      "   [ \"$WEFT_WORKER_TOKEN\" = \"$WEFT_ADMIN_TOKEN\" ] ||\n"
      "   [ \"$WEFT_TRAINER_TOKEN\" = \"$WEFT_ADMIN_TOKEN\" ]; then\n"
      "  echo \"secrets.sh: the worker, trainer and admin tokens must all be different\" >&2\n"
      "  exit 1\n"
      "fi\n";
  commands +=
      "set -- --from-literal=worker=\"$WEFT_WORKER_TOKEN\" \\\n"
      "  --from-literal=trainer=\"$WEFT_TRAINER_TOKEN\" \\\n"
      "  --from-literal=admin=\"$WEFT_ADMIN_TOKEN\"\n";
  if (store_token) {
    usage +=
        "#   WEFT_STORE_TOKEN   the store server's writer token, with which the trainer "
        "publishes (key store);\n"
        "#       when unset, the Secret's current one, or else a new random one\n";
    checks +=
        "if [ -z \"${WEFT_STORE_TOKEN:-}\" ]; then\n"
        "  WEFT_STORE_TOKEN=$(kubectl get secret " +
        ShellQuote(k_.tokens_secret) + " --namespace " + ns +
        " \\\n"
        "    --output='jsonpath={.data.store}' 2>/dev/null | base64 -d 2>/dev/null || true)\n"
        "fi\n"
        "if [ -z \"${WEFT_STORE_TOKEN:-}\" ]; then\n"
        "  WEFT_STORE_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')\n"
        "fi\n";
    commands += "set -- \"$@\" --from-literal=store=\"$WEFT_STORE_TOKEN\"\n";
  }
  if (!api_key_env_.empty()) {
    usage += "#   " + api_key_env_ +
             "   the engines' API key (engine.api_key_env), key engine-api-key\n";
    checks +=
        ": \"${" + api_key_env_ + ":?must hold the engines' API key (engine.api_key_env)}\"\n";
    commands += "set -- \"$@\" --from-literal=" + std::string(kEngineApiKeyKey) + "=\"$" +
                api_key_env_ + "\"\n";
  }
  commands += "kubectl create secret generic " + ShellQuote(k_.tokens_secret) + " --namespace " +
              ns + " \"$@\" \\\n  --dry-run=client --output=yaml | kubectl apply --filename=-\n";
  const bool s3 = S3Store() && (!k_.regions.empty() || k_.trainer);
  if (s3) {
    usage +=
        "#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (required), AWS_SESSION_TOKEN, AWS_REGION,\n"
        "#       AWS_ENDPOINT_URL_S3 (when set)   the S3 store's credentials, into Secret " +
        k_.s3_secret + " (keys as named)\n";
    checks +=
        ": \"${AWS_ACCESS_KEY_ID:?must hold the S3 store's access key}\"\n"
        ": \"${AWS_SECRET_ACCESS_KEY:?must hold the S3 store's secret key}\"\n";
    commands += "set --\n";
    for (const S3Variable& v : kS3Variables) {
      const std::string name = v.name;
      const std::string add = "set -- \"$@\" --from-literal=" + name + "=\"$" + name + "\"\n";
      commands += v.required ? add
                             : "if [ -n \"${" + name + ":-}\" ]; then " +
                                   add.substr(0, add.size() - 1) + "; fi\n";
    }
    commands += "kubectl create secret generic " + ShellQuote(k_.s3_secret) + " --namespace " + ns +
                " \"$@\" \\\n  --dry-run=client --output=yaml | kubectl apply --filename=-\n";
  }
  const std::string text =
      "#!/bin/sh\n"
      "# Creates (or updates) the Secrets that the manifests beside this script read, in "
      "namespace " +
      k_.namespace_ +
      ",\n"
      "# from this shell's environment: no value is written to a file. Run it before\n"
      "# `kubectl apply -f` on this directory, and again to change a value (pods read them when\n"
      "# they start: kubectl rollout restart them then). It reads:\n"
      "#\n" +
      usage +
      "\n"
      "set -eu\n" +
      checks + commands;
  DeployFile file{"secrets.sh", text};
  file.executable = true;
  return file;
}

Result<std::vector<DeployFile>> Generator::Run() {
  WEFT_RETURN_IF_ERROR(Check());
  std::vector<DeployFile> files = {ConfigMap()};
  if (k_.orchestrator) files.push_back(Orchestrator());
  if (k_.store) files.push_back(Store());
  for (const RegionConfig& region : config_.regions) {
    const KubernetesRegion* placement = k_.FindRegion(region.name);
    if (placement == nullptr) continue;
    files.push_back(Relay(region, *placement));
    files.push_back(Workers(region, *placement));
  }
  if (k_.trainer) files.push_back(Trainer());
  files.push_back(SecretsScript());
  return files;
}

}  // namespace
}  // namespace weft::cli::kubernetes_deploy

namespace weft::cli {

Result<std::vector<DeployFile>> KubernetesDeployment(const RunConfig& config,
                                                     const DeployContext& context) {
  return kubernetes_deploy::Generator(config, context).Run();
}

}  // namespace weft::cli
