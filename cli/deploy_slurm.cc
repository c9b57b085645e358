// The Slurm batch scripts of a deployment (cli/deploy.h; docs/deploy.md, "Slurm").
//
// Every job finds the others through files on shared storage: a service writes its URL to
// DIR/addresses/NAME when it starts (DIR is deploy.slurm.dir), and a job that needs it waits for
// the file, backing off and saying so in its log. Workers watch the files while they run, and a
// worker whose orchestrator or relay moved (requeued onto another node) is drained and started
// again against the new address.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "cli/deploy.h"
#include "cli/trainer_channel.h"

namespace weft::cli {
namespace {

// Memory for --mem: whole mebibytes, at least 1.
std::string Megabytes(uint64_t bytes) {
  return std::to_string(std::max<uint64_t>(1, (bytes + (1 << 20) - 1) >> 20)) + "M";
}

struct Job {
  std::string name;  // file name without .sbatch
  std::ostringstream text;
};

// The #SBATCH lines every job has, from its section; `partition` replaces the section's.
void Header(std::ostringstream& o, const RunConfig& c, const std::string& name, const SlurmJob& job,
            const std::string& partition, const std::string& log, const std::string& work_dir) {
  const SlurmDeploy& s = c.deploy.slurm;
  o << "#!/bin/bash\n";
  o << "#SBATCH --job-name=" << ShellQuote("weft-" + c.run_id + "-" + name) << "\n";
  o << "#SBATCH --partition=" << partition << "\n";
  const std::string account = job.account.empty() ? s.account : job.account;
  if (!account.empty()) o << "#SBATCH --account=" << account << "\n";
  if (!job.time.empty()) o << "#SBATCH --time=" << job.time << "\n";
  o << "#SBATCH --cpus-per-task=" << job.cpus << "\n";
  if (job.memory > 0) o << "#SBATCH --mem=" << Megabytes(job.memory) << "\n";
  o << "#SBATCH --output=" << ShellQuote(log) << "\n";
  o << "#SBATCH --open-mode=append\n";  // a requeued job's log goes on where it left off
  o << "#SBATCH --chdir=" << ShellQuote(work_dir) << "\n";
  for (const std::string& option : job.options) o << "#SBATCH " << option << "\n";
}

// A word of a command with {placeholders}, as the shell must see it: the literal parts quoted,
// each placeholder the shell variable of the same name.
std::string Templated(const std::string& word, const std::set<std::string>& names) {
  std::string out;
  std::string literal;
  auto flush = [&] {
    if (!literal.empty()) out += ShellQuote(literal);
    literal.clear();
  };
  for (size_t i = 0; i < word.size();) {
    const size_t close = word[i] == '{' ? word.find('}', i) : std::string::npos;
    if (close != std::string::npos && names.count(word.substr(i + 1, close - i - 1))) {
      flush();
      out += "\"${" + word.substr(i + 1, close - i - 1) + "}\"";
      i = close + 1;
    } else {
      literal += word[i++];
    }
  }
  flush();
  return out.empty() ? "''" : out;
}

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + ShellQuote(w);
  return out;
}

}  // namespace

Result<std::vector<DeployFile>> SlurmDeployment(const RunConfig& c, const DeployContext& context) {
  const SlurmDeploy& s = c.deploy.slurm;
  const std::string& out = context.out_dir;
  const std::string dir = s.dir;
  const std::string logs = dir + "/logs";
  const std::string config_path = out + "/config.yaml";
  const std::string work_dir = context.work_dir.empty() ? dir : context.work_dir;
  std::vector<DeployFile> files;

  // What the processes read: the run config (tokens and all: readable by its owner alone), the
  // orchestrator's own config, the trainer's token and settings.
  files.push_back({"config.yaml", DeployedRunConfigYaml(c, false), false, true});
  if (s.orchestrator) {
    files.push_back({"orchestrator.yaml",
                     DeployedOrchestratorYaml(c, dir + "/orchestrator.journal", false), false,
                     true});
  }
  if (s.trainer) {
    files.push_back({"trainer.token", c.orchestrator.service.trainer_token + "\n", false, true});
    files.push_back({"trainer-settings.json", TrainerSettingsJson(c).dump(2) + "\n"});
  }

  // Shared by every job: where things are, and the address files.
  std::ostringstream env;
  env << "# Sourced by every job of the deployment (weft deploy slurm).\n"
      << "weft=" << ShellQuote(context.weft) << "\n"
      << "dir=" << ShellQuote(dir) << "\n"
      << "out=" << ShellQuote(out) << "\n"
      << "config=" << ShellQuote(config_path) << "\n"
      << "addresses=\"$dir/addresses\"\n"
      << R"sh(weft_log() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
# The name other nodes reach this one by: its host name, or WEFT_ADVERTISE_HOST when the
# environment sbatch ran in sets it (a one-node cluster whose host name does not resolve: 127.0.0.1).
weft_host() { printf '%s\n' "${WEFT_ADVERTISE_HOST:-$(hostname)}"; }
# weft_publish NAME URL: the service's address, replaced atomically.
weft_publish() {
  mkdir -p "$addresses"
  printf '%s\n' "$2" > "$addresses/.$1.$$" && mv -f "$addresses/.$1.$$" "$addresses/$1"
  weft_log "published $1 at $2"
}
# weft_address NAME: the address NAME published, empty while there is none.
weft_address() { cat "$addresses/$1" 2> /dev/null || true; }
# weft_wait NAME: waits until NAME has published its address (backing off from 1 s to 30 s), then
# prints it.
weft_wait() {
  local delay=1 url
  while true; do
    url=$(weft_address "$1")
    if [ -n "$url" ]; then printf '%s\n' "$url"; return 0; fi
    weft_log "waiting for $1: $addresses/$1 is not written yet; looking again in ${delay} s" >&2
    sleep "$delay"
    delay=$((delay * 2 > 30 ? 30 : delay * 2))
  done
}
)sh";
  files.push_back({"env.sh", env.str()});

  const int orchestrator_port = ListenPort(c.orchestrator_listen());
  // How each job reaches the orchestrator and the store.
  const std::string orchestrator_url_shell =
      s.orchestrator ? "\"$(weft_wait orchestrator)\"" : ShellQuote(s.orchestrator_url);
  const bool own_store = c.store_uri.empty() && s.store.has_value();
  const std::string store_url_shell = !c.store_uri.empty() ? ShellQuote(c.store_uri)
                                      : own_store          ? "\"$(weft_wait store)\""
                                                           : ShellQuote(s.store_url);

  std::vector<std::pair<std::string, std::string>> submit;  // job name, dependencies (names)
  auto add = [&](const std::string& name, const std::string& text,
                 const std::vector<std::string>& after) {
    files.push_back({name + ".sbatch", text, true});
    std::string deps;
    for (const std::string& a : after) deps += " " + a;
    submit.emplace_back(name, deps);
  };

  if (s.orchestrator) {
    std::ostringstream o;
    Header(o, c, "orchestrator", *s.orchestrator, s.orchestrator->partition,
           logs + "/orchestrator-%j.log", work_dir);
    o << "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --requeue\n"
      << "# The orchestrator: its journal in DIR survives a requeue onto another node, where it\n"
      << "# replays it and publishes its new address.\n"
      << "source " << ShellQuote(out + "/env.sh") << "\n"
      << "weft_publish orchestrator \"http://$(weft_host):" << orchestrator_port << "\"\n"
      << "exec \"$weft\" orchestrator --config " << ShellQuote(out + "/orchestrator.yaml") << "\n";
    add("orchestrator", o.str(), {});
  }
  if (own_store) {
    std::ostringstream o;
    Header(o, c, "store", *s.store, s.store->partition, logs + "/store-%j.log", work_dir);
    o << "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --requeue\n"
      << "# The store server over DIR/store, where the trainer publishes.\n"
      << "source " << ShellQuote(out + "/env.sh") << "\n"
      << "mkdir -p \"$dir/store\"\n"
      << "weft_publish store \"http://$(weft_host):" << ListenPort(c.store_listen) << "\"\n"
      << "exec \"$weft\" store serve --store \"$dir/store\" --listen 0.0.0.0:"
      << ListenPort(c.store_listen) << " --threads " << std::max(2, s.store->cpus) << "\n";
    add("store", o.str(), {});
  }

  for (const RegionConfig& r : c.regions) {
    const std::vector<const SlurmPartition*> partitions = s.RegionPartitions(r.name);
    if (partitions.empty()) continue;  // on Kubernetes
    std::string partition_list;
    for (const SlurmPartition* p : partitions)
      partition_list += (partition_list.empty() ? "" : ",") + p->name;
    const std::string relay = "relay-" + r.name;
    {
      std::ostringstream o;
      Header(o, c, relay, s.relays, partition_list, logs + "/" + relay + "-%j.log", work_dir);
      std::string cache = s.relay_cache.empty() ? dir + "/relays/{region}" : s.relay_cache;
      for (size_t at; (at = cache.find("{region}")) != std::string::npos;)
        cache.replace(at, 8, r.name);
      o << "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --requeue\n"
        << "# Region " << r.name << "'s relay: its workers pull weights through it.\n"
        << "source " << ShellQuote(out + "/env.sh") << "\n"
        << "upstream=" << store_url_shell << "\n"
        << "mkdir -p " << ShellQuote(cache) << "\n"
        << "weft_publish " << relay << " \"http://$(weft_host):" << ListenPort(r.relay_listen)
        << "\"\n"
        << "exec \"$weft\" relay --upstream \"$upstream\" --cache " << ShellQuote(cache)
        << " --listen 0.0.0.0:" << ListenPort(r.relay_listen) << " --threads "
        << std::max(4, s.relays.cpus * 4) << "\n";
      add(relay, o.str(),
          own_store ? std::vector<std::string>{"store"} : std::vector<std::string>{});
    }
    {
      const std::string name = "workers-" + r.name;
      std::ostringstream o;
      Header(o, c, name, s.workers, partition_list, logs + "/" + name + "-%A_%a.log", work_dir);
      o << "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n";
      if (r.workers > 0) o << "#SBATCH --array=0-" << r.workers - 1 << "\n";
      if (s.worker_gpus > 0) o << "#SBATCH --gpus=" << s.worker_gpus << "\n";
      o << "#SBATCH --signal=B:USR1@" << s.drain.count() << "\n";
      o << (s.requeue ? "#SBATCH --requeue\n" : "#SBATCH --no-requeue\n");
      o << "# Rollout clusters of region " << r.name
        << ": one array task is one weft worker (and its engine replicas).\n"
        << "# Scale out: sbatch --array=N-M this file; scale in: scancel JOB_TASK (it drains).\n"
        << "# SIGTERM (scancel, preemption) drains the worker: it submits what it generates,\n"
        << "# hands back its other leases and deregisters. SIGUSR1, sent " << s.drain.count()
        << " s before the time limit,\n"
        << "# drains it too, then " << (s.requeue ? "requeues the task" : "ends the task") << ".\n"
        << "source " << ShellQuote(out + "/env.sh") << "\n"
        << "region=" << r.name << "\n"
        << "cluster=\"$region-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}-${SLURM_ARRAY_TASK_ID:-0}\"\n"
        << "requeue=" << (s.requeue ? 1 : 0) << "\n"
        << R"sh(stopping=0 timed_out=0 worker=
trap 'stopping=1; weft_log "SIGTERM: draining $cluster"; [ -z "$worker" ] || kill -TERM "$worker" 2> /dev/null' TERM
trap 'stopping=1; timed_out=1; weft_log "the time limit is near: draining $cluster"; [ -z "$worker" ] || kill -TERM "$worker" 2> /dev/null' USR1
weft_log "worker $cluster on $(weft_host) (restart ${SLURM_RESTART_COUNT:-0})"
)sh";
      std::string engine_flags;
      if (!c.deploy.engine.command.empty()) {
        const EngineLaunch& e = c.deploy.engine;
        const int replicas = e.gpus == 0 ? 1 : std::max(1, s.worker_gpus / e.gpus);
        o << "# The engine replicas, " << replicas << " of " << e.gpus
          << " GPUs each. Their ports: the first free ones from an offset of this job's, so that\n"
          << "# tasks sharing a node start apart (a port something answers on is taken).\n"
          << "IFS=, read -ra gpu_list <<< \"${CUDA_VISIBLE_DEVICES:-}\"\n"
          << "port=$((" << e.port << " + (SLURM_JOB_ID % 1000) * " << replicas << "))\n"
          << "port_taken() { (exec 3<> \"/dev/tcp/127.0.0.1/$1\") 2> /dev/null; }\n"
          << "engines=() engine_urls=()\n"
          << "for ((replica = 0; replica < " << replicas << "; replica++)); do\n"
          << "  while port_taken \"$port\"; do port=$((port + 1)); done\n"
          << "  gpus=" << e.gpus << "\n"
          << "  devices=$(IFS=,; echo \"${gpu_list[*]:$((replica * " << e.gpus << ")):" << e.gpus
          << "}\")\n";
        std::string command;
        for (const std::string& word : e.command)
          command += (command.empty() ? "" : " ") +
                     Templated(word, {"port", "gpus", "replica", "cluster"});
        std::string env_words;
        for (const auto& [k, v] : e.env) env_words += " " + k + "=" + ShellQuote(v);
        o << "  CUDA_VISIBLE_DEVICES=\"$devices\"" << env_words << " " << command
          << " > \"$dir/logs/engine-$cluster-$replica.log\" 2>&1 &\n"
          << "  engines+=($!)\n"
          << "  engine_urls+=(--engine-url \"http://127.0.0.1:$port\")\n"
          << "  port=$((port + 1))\n"
          << "done\n";
        engine_flags = " \"${engine_urls[@]}\"";
      }
      o << "orchestrator=" << orchestrator_url_shell << "\n"
        << "relay=\"$(weft_wait " << relay << ")\"\n"
        << "status=0\n"
        << "while true; do\n"
        << "  \"$weft\" worker --config \"$config\" --cluster \"$cluster\" --region \"$region\" "
           "\\\n"
        << "    --orchestrator \"$orchestrator\" --store \"$relay\"" << engine_flags << " &\n"
        << "  worker=$!\n"
        << "  moved=0\n"
        << "  # Meanwhile: a service that moved (requeued onto another node) restarts the worker.\n"
        << "  while kill -0 \"$worker\" 2> /dev/null; do\n"
        << "    sleep 5 & wait $! 2> /dev/null\n"
        << "    [ \"$stopping\" = 0 ] || break\n"
        << (s.orchestrator ? "    now=$(weft_address orchestrator)\n" : "    now=$orchestrator\n")
        << "    if [ -n \"$now\" ] && [ \"$now\" != \"$orchestrator\" ]; then moved=1; fi\n"
        << "    now=$(weft_address " << relay << ")\n"
        << "    if [ -n \"$now\" ] && [ \"$now\" != \"$relay\" ]; then moved=1; fi\n"
        << "    if [ \"$moved\" = 1 ]; then\n"
        << "      weft_log \"a service moved: draining $cluster to start it again\"\n"
        << "      kill -TERM \"$worker\" 2> /dev/null\n"
        << "      break\n"
        << "    fi\n"
        << "  done\n"
        << "  # wait returns early when a trapped signal comes: wait again until the worker is "
           "gone.\n"
        << "  while true; do\n"
        << "    wait \"$worker\"; status=$?\n"
        << "    if kill -0 \"$worker\" 2> /dev/null; then continue; fi\n"
        << "    if [ \"$status\" -gt 128 ]; then wait \"$worker\" 2> /dev/null && status=0 || "
           "{ s=$?; [ \"$s\" = 127 ] || status=$s; }; fi\n"
        << "    break\n"
        << "  done\n"
        << "  [ \"$moved\" = 1 ] && [ \"$stopping\" = 0 ] || break\n";
      if (s.orchestrator) o << "  orchestrator=$(weft_wait orchestrator)\n";
      o << "  relay=$(weft_wait " << relay << ")\n"
        << "done\n";
      if (!c.deploy.engine.command.empty()) {
        o << "[ ${#engines[@]} = 0 ] || kill -TERM \"${engines[@]}\" 2> /dev/null\n"
          << "wait\n";
      }
      o << "weft_log \"worker $cluster exited with status $status\"\n"
        << "if [ \"$timed_out\" = 1 ] && [ \"$requeue\" = 1 ]; then\n"
        << "  weft_log \"requeueing $cluster\"\n"
        << "  scontrol requeue \"$SLURM_JOB_ID\"\n"
        << "fi\n"
        << "exit \"$status\"\n";
      std::vector<std::string> after = {relay};
      if (s.orchestrator) after.insert(after.begin(), "orchestrator");
      if (r.workers > 0) {
        add(name, o.str(), after);
      } else {
        files.push_back({name + ".sbatch", o.str(), true});  // for scaling out later
      }
    }
  }

  if (s.trainer) {
    std::ostringstream o;
    Header(o, c, "trainer", *s.trainer, s.trainer->partition, logs + "/trainer-%j.log", work_dir);
    o << "#SBATCH --nodes=" << s.trainer_nodes << "\n"
      << "#SBATCH --ntasks-per-node=" << s.trainer_tasks_per_node << "\n";
    if (s.trainer_gpus_per_node > 0)
      o << "#SBATCH --gpus-per-node=" << s.trainer_gpus_per_node << "\n";
    o << "# The trainer: " << TrainerDescription(c) << ", "
      << s.trainer_nodes * s.trainer_tasks_per_node
      << " rank(s) through srun; each rank's WEFT_RANK and WEFT_WORLD say which shard it "
         "publishes.\n"
      << "source " << ShellQuote(out + "/env.sh") << "\n";
    const std::string store = c.store_uri.empty() && own_store ? dir + "/store"
                              : c.store_uri.empty()            ? s.store_url
                                                               : c.store_uri;
    std::map<std::string, std::string> channel = TrainerChannelEnvironment(c, dir, config_path);
    channel[kStoreVariable] = store;
    channel[kSettingsVariable] = out + "/trainer-settings.json";
    channel.erase(kTrainerTokenVariable);  // read from its file below
    channel.erase(kOrchestratorVariable);
    channel.erase(kStoreUrlVariable);
    for (const auto& [k, v] : c.trainer_env) o << "export " << k << "=" << ShellQuote(v) << "\n";
    for (const auto& [k, v] : channel) o << "export " << k << "=" << ShellQuote(v) << "\n";
    o << "export " << kTrainerTokenVariable << "=\"$(cat " << ShellQuote(out + "/trainer.token")
      << ")\"\n"
      << "export " << kOrchestratorVariable << "=" << orchestrator_url_shell << "\n"
      << "export " << kStoreUrlVariable << "=" << store_url_shell << "\n"
      << "export MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\"\n"
      << "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n";
    const std::vector<std::string> command = c.trainer_command.empty()
                                                 ? std::vector<std::string>{context.weft, "train"}
                                                 : c.trainer_command;
    o << "exec srun --kill-on-bad-exit=1 bash -c "
      << ShellQuote(
             "export WEFT_RANK=$SLURM_PROCID WEFT_WORLD=$SLURM_NTASKS RANK=$SLURM_PROCID "
             "WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID; exec \"$@\"")
      << " trainer " << Join(command) << "\n";
    std::vector<std::string> after;
    if (s.orchestrator) after.push_back("orchestrator");
    if (own_store) after.push_back("store");
    add("trainer", o.str(), after);
  }

  // submit.sh: every job, in dependency order (`after`: a job starts once those it needs have
  // started; each waits for their addresses itself).
  std::ostringstream sub;
  sub << "#!/bin/bash\n"
      << "# Submits the deployment's jobs (weft deploy slurm), each after those it needs have\n"
      << "# started, and writes their IDs to " << out << "/jobs.\n"
      << "set -euo pipefail\n"
      << "source " << ShellQuote(out + "/env.sh") << "\n"
      << "mkdir -p \"$dir/logs\" \"$addresses\"\n"
      << "# A fresh deployment: addresses an earlier one left would point at nothing.\n"
      << "rm -f \"$addresses\"/*\n"
      << ": > " << ShellQuote(out + "/jobs") << "\n"
      << "declare -A job\n"
      << "submit() {\n"
      << "  local name=$1 dependency='' id\n"
      << "  shift\n"
      << "  for need in \"$@\"; do dependency+=\"${dependency:+:}${job[$need]}\"; done\n"
      << "  id=$(sbatch --parsable ${dependency:+--dependency=after:$dependency} "
         "\"$out/$name.sbatch\")\n"
      << "  id=${id%%;*}\n"
      << "  job[$name]=$id\n"
      << "  printf '%s %s\\n' \"$name\" \"$id\" >> " << ShellQuote(out + "/jobs") << "\n"
      << "  echo \"submitted $name: job $id\"\n"
      << "}\n";
  for (const auto& [name, deps] : submit) sub << "submit " << name << deps << "\n";
  files.push_back({"submit.sh", sub.str(), true});

  // stop.sh: the whole deployment, by job name (arrays submitted later to scale out included),
  // in the order weft run stops its processes: the workers and the trainer first (the workers
  // drain), then the relays, the store server and the orchestrator.
  std::ostringstream stop;
  const std::string prefix = "weft-" + c.run_id + "-";
  stop << "#!/bin/bash\n"
       << "# Stops the deployment's jobs (weft deploy slurm): the workers and the trainer first\n"
       << "# (the workers drain: they submit what they generate and deregister), then the\n"
       << "# services.\n"
       << "set -uo pipefail\n"
       << "names() { squeue -h --me -o %j | grep -E \"^" << prefix << "($1)\\$\" | sort -u "
       << "| paste -sd, -; }\n"
       << "stop_and_wait() {\n"
       << "  local jobs\n"
       << "  jobs=$(names \"$1\")\n"
       << "  [ -n \"$jobs\" ] || return 0\n"
       << "  echo \"stopping $jobs\"\n"
       << "  for name in ${jobs//,/ }; do scancel --name=\"$name\"; done\n"
       << "  while [ -n \"$(squeue -h --me --name=\"$jobs\" -o %i)\" ]; do sleep 1; done\n"
       << "}\n"
       << "stop_and_wait 'workers-.*|trainer'\n"
       << "stop_and_wait 'relay-.*'\n"
       << "stop_and_wait 'store|orchestrator'\n";
  files.push_back({"stop.sh", stop.str(), true});
  return files;
}

}  // namespace weft::cli
