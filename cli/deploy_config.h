// The `deploy:` section of a run config: how `weft deploy slurm` and `weft deploy kubernetes` place
// the run's processes on a scheduler's machines (docs/deploy.md). It describes only what the rest
// of the config cannot: partitions and node selectors, accounts, GPUs per worker, time limits,
// volumes, and how a worker starts its engine replicas. The regions, their workers, the
// orchestrator, the store and the trainer are the run's own sections, as `weft run` reads them.
//
// Each region is placed on exactly one target: on Slurm when a partition declares it
// (`deploy.slurm.partitions.NAME.region`), on Kubernetes when `deploy.kubernetes.regions` lists it.
// The orchestrator, the store server and the trainer run on the target whose section names them;
// the other target then reaches them at the URL its section gives (`orchestrator_url`,
// `store_url`). A key of one target's section that belongs to the other is refused, naming both.
// Parsing checks everything that the config alone shows; what depends on the machine the
// generator runs on (shared storage, the weft binary) is checked by the generators.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft::cli {

struct RunConfig;

// deploy.engine: how a worker with a serving engine (sglang, vllm) starts its replicas, on either
// target. Each replica gets `gpus` of the worker's GPUs and listens on 127.0.0.1:port + its index;
// {port}, {gpus}, {replica} and {cluster} in the command are replaced by the replica's.
struct EngineLaunch {
  std::vector<std::string> command;  // empty: the replicas are started elsewhere (engine.urls)
  int gpus = 1;                      // GPUs per replica
  int port = 30000;                  // the first replica's port
  std::map<std::string, std::string> env;
  std::string image;  // Kubernetes: the engine container's image
};

// What one Slurm job asks for (the keys every job section has).
struct SlurmJob {
  std::string partition;  // for workers and relays: their region's partitions
  std::string account;    // empty: deploy.slurm.account
  std::string time;       // Slurm's time format (`4:00:00`, `2-00:00:00`); empty: the partition's
  int cpus = 1;           // per task
  uint64_t memory = 0;    // bytes per node (0: the partition's default)
  std::vector<std::string> options;  // more #SBATCH options, verbatim (`--qos=high`)
};

struct SlurmPartition {
  std::string name;
  std::string region;  // empty: not a region's (the orchestrator, store or trainer run there)
  int gpus = 0;        // GPUs per node
};

struct SlurmDeploy {
  bool present = false;
  std::string dir;   // shared storage every node sees: journal, store, addresses, logs
  std::string weft;  // the weft binary on the nodes (empty: the generating weft's own path)
  std::string account;
  std::vector<SlurmPartition> partitions;
  std::optional<SlurmJob> orchestrator, store, trainer;  // absent: not run on Slurm
  SlurmJob relays;                                       // in each region's partitions
  std::string relay_cache;          // empty: DIR/relays/REGION; {region} is the region's name
  SlurmJob workers;                 // one array task each, in each region's partitions
  int worker_gpus = 0;              // per worker (array task)
  std::chrono::seconds drain{120};  // SIGTERM this long before a time limit or preemption
  bool requeue = true;              // workers come back after preemption
  int trainer_nodes = 1, trainer_tasks_per_node = 1, trainer_gpus_per_node = 0;
  std::string orchestrator_url;  // when the orchestrator runs elsewhere
  std::string store_url;         // when the store server runs elsewhere (and store.uri is unset)

  const SlurmPartition* FindPartition(const std::string& name) const;
  std::vector<const SlurmPartition*> RegionPartitions(const std::string& region) const;
};

// Resources of one Kubernetes container.
struct KubernetesResources {
  std::string cpu;     // a quantity ("2", "500m"); empty: no request
  std::string memory;  // a quantity ("4Gi"); empty: no request
};

struct KubernetesRegion {
  std::string name;
  std::map<std::string, std::string> node_selector;
};

// deploy.kubernetes.workers.autoscale: a HorizontalPodAutoscaler per region's workers, on the jobs
// the orchestrator has outstanding (queued or leased), `jobs_per_worker` of them per worker.
struct KubernetesAutoscale {
  int min = 1;
  int max = 1;
  int jobs_per_worker = 1;
};

// deploy.kubernetes.workers.models: the directory an engine container starts its model from,
// mounted at `path` in the worker's container too (a worker reads the engine's model directory).
struct KubernetesModels {
  std::string path;
  std::string claim;  // a PersistentVolumeClaim holding the models; empty: an emptyDir
};

struct KubernetesDeploy {
  bool present = false;
  std::string namespace_ = "default";
  std::string image;  // an image with `weft` on its PATH
  std::string image_pull_policy = "IfNotPresent";
  std::string storage_class;  // empty: the cluster's default
  std::string tokens_secret = "weft-tokens";
  std::string s3_secret = "weft-s3";
  std::optional<KubernetesResources> orchestrator, store, trainer;  // absent: not run here
  std::string journal_size = "10Gi";
  std::string store_size = "100Gi";
  KubernetesResources relays;
  std::string relay_cache_size = "50Gi";
  KubernetesResources workers;
  KubernetesResources engine;
  int worker_gpus = 0;  // per worker pod (nvidia.com/gpu on the engine container)
  std::chrono::seconds drain{120};
  std::optional<KubernetesAutoscale> autoscale;  // absent: each region runs regions[].workers
  std::optional<KubernetesModels> models;
  std::vector<KubernetesRegion> regions;
  std::string orchestrator_url;
  std::string store_url;

  const KubernetesRegion* FindRegion(const std::string& name) const;
};

struct DeployConfig {
  bool present = false;  // the config has a deploy: section
  EngineLaunch engine;
  SlurmDeploy slurm;
  KubernetesDeploy kubernetes;
};

// Reads `node` (the config's `deploy:` section, maybe absent) for `config`, whose other sections
// are read already.
Status ParseDeploySection(const YAML::Node& node, const RunConfig& config, DeployConfig* deploy);

// A Kubernetes quantity ("2", "500m", "4Gi", "1.5"): true when it is one.
bool IsKubernetesQuantity(const std::string& value);

}  // namespace weft::cli
