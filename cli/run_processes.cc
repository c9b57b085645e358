#include "cli/run_processes.h"

#include <cstdio>

#include "common/file_util.h"

namespace weft::cli {

namespace fs = std::filesystem;

Result<RunProcesses> PlanRunProcesses(const RunConfig& config, const fs::path& dir,
                                      const std::string& config_abs) {
  {
    YAML::Node section = YAML::Clone(config.orchestrator_section);
    section["journal"] = (dir / "orchestrator.journal").string();
    YAML::Node root;
    root["orchestrator"] = section;
    YAML::Emitter out;
    out << root;
    WEFT_RETURN_IF_ERROR(
        WriteTextFileAtomic((dir / "orchestrator.yaml").string(), std::string(out.c_str()) + "\n"));
  }
  RunProcesses p;
  std::vector<Child>& children = p.children;
  if (config.store_uri.empty()) {
    children.push_back(MakeChild("store",
                                 {"store", "serve", "--store", (dir / "store").string(), "--listen",
                                  config.store_listen, "--threads", "4"},
                                 true, config.store_listen));
  }
  children.push_back(MakeChild("orchestrator",
                               {"orchestrator", "--config", (dir / "orchestrator.yaml").string()},
                               true, config.orchestrator_listen()));
  for (const RegionConfig& r : config.regions) {
    std::vector<std::string> args = {"relay",
                                     "--upstream",
                                     config.store_url(),
                                     "--cache",
                                     (dir / "relays" / r.name).string(),
                                     "--listen",
                                     r.relay_listen,
                                     "--threads",
                                     "16"};
    if (r.bandwidth > 0)
      args.insert(args.end(), {"--shape-bandwidth", std::to_string(r.bandwidth)});
    if (r.latency.count() > 0)
      args.insert(args.end(), {"--shape-latency", std::to_string(r.latency.count()) + "us"});
    children.push_back(MakeChild("relay-" + r.name, args, true, r.relay_listen));
  }
  p.first_worker = children.size();
  for (const RegionConfig& r : config.regions) {
    for (int i = 1; i <= r.workers; ++i) {
      const std::string name = r.name + "-" + std::to_string(i);
      std::vector<std::string> args = {"worker", "--config", config_abs, "--cluster",
                                       name,     "--region", r.name};
      if (!r.worker_engines.empty()) {
        for (const std::string& url : r.worker_engines[i - 1])
          args.insert(args.end(), {"--engine-url", url});
      }
      children.push_back(MakeChild("worker-" + name, args, false));
    }
    for (const auto& [model, count] : r.model_workers) {
      const auto engines = r.model_engines.find(model);
      for (int i = 1; i <= count; ++i) {
        const std::string name = r.name + "-" + model + "-" + std::to_string(i);
        std::vector<std::string> args = {"worker",   "--config", config_abs, "--cluster", name,
                                         "--region", r.name,     "--model",  model};
        if (engines != r.model_engines.end()) {
          for (const std::string& url : engines->second[i - 1])
            args.insert(args.end(), {"--engine-url", url});
        }
        children.push_back(MakeChild("worker-" + name, args, false));
      }
    }
  }
  return p;
}

Status StartRunProcesses(Supervisor& supervisor, std::vector<Child>& children, size_t first_worker,
                         const fs::path& dir) {
  for (size_t i = 0; i < first_worker; ++i) {
    WEFT_RETURN_IF_ERROR(supervisor.Start(children[i]));
    if (!WaitForPort(children[i].listen, std::chrono::seconds(20), children[i])) {
      StopInfrastructure(supervisor, children, i + 1);
      return Unavailable(children[i].name + " did not start listening on " + children[i].listen +
                         " (see " + dir.string() + "/logs/" + children[i].name + ".log)");
    }
  }
  for (size_t i = first_worker; i < children.size(); ++i)
    WEFT_RETURN_IF_ERROR(supervisor.Start(children[i]));
  return Status::Ok();
}

std::vector<Child*> ReapRunProcesses(Supervisor& supervisor, std::vector<Child>& children,
                                     const fs::path& dir, bool tty, std::string* failure) {
  std::vector<Child*> ended = supervisor.Reap(children);
  for (Child* child : ended) {
    if (child->restart) {
      std::printf("%s%s %s; restarting it\n", tty ? "\n" : "", child->name.c_str(),
                  child->ended.c_str());
      ++child->restarts;
      if (child->restarts > 5) {
        *failure =
            child->name + " keeps dying (see " + dir.string() + "/logs/" + child->name + ".log)";
        break;
      }
      Status restarted = supervisor.Start(*child);
      if (!restarted.ok()) *failure = restarted.message();
    } else if (child->name.rfind("worker-", 0) == 0) {
      std::printf("%s%s %s; its jobs go to the other workers\n", tty ? "\n" : "",
                  child->name.c_str(), child->ended.c_str());
    }
  }
  // Said at once: a log file may be all that is left of a process killed next.
  if (!ended.empty()) std::fflush(stdout);
  return ended;
}

void StopWorkers(Supervisor& supervisor, std::vector<Child>& children, size_t from) {
  std::vector<Child*> workers;
  for (size_t i = from; i < children.size(); ++i) workers.push_back(&children[i]);
  supervisor.Stop(workers, std::chrono::seconds(20));
}

void StopInfrastructure(Supervisor& supervisor, std::vector<Child>& children, size_t first_worker) {
  std::vector<Child*> infrastructure;
  for (size_t i = first_worker; i-- > 0;) infrastructure.push_back(&children[i]);
  supervisor.Stop(infrastructure, std::chrono::seconds(10));
}

}  // namespace weft::cli
