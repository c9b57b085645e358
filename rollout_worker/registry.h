// Registry: engines and tasks by name. A run's configuration names the engine its workers drive
// (`worker.engine`) and the task they generate for (`task.kind`, docs/run.md); a Registry makes
// them. Components register a factory under a name; the weft binary registers its built-in engine
// and task in one place (cli/builtins.h), and a program embedding the worker can register its own.
// A factory gets the run's whole configuration document and reads its own section, reporting bad
// values as errors that name the key (an exception a factory lets out is reported as such an
// error). Register before use; lookups are then thread-safe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "rollout_worker/engine.h"
#include "rollout_worker/task.h"

namespace weft::rollout_worker {

struct ComponentConfig {
  YAML::Node document;       // the run's configuration; each component reads its own section
  std::string path;          // the file it came from, for errors
  int threads = 1;           // compute threads the component may use
  std::string cluster = {};  // the worker's cluster name ("" when validating)
  std::vector<std::string> engine_urls = {};  // the worker's own engine replicas, if given
};

class Registry {
 public:
  using TaskFactory = std::function<Result<std::unique_ptr<Task>>(const ComponentConfig&)>;
  // An engine is made for the task it will generate for (its lengths, its vocabulary).
  using EngineFactory =
      std::function<Result<std::unique_ptr<Engine>>(const ComponentConfig&, const Task&)>;

  // kConflict when the name is taken.
  Status AddTask(const std::string& name, TaskFactory factory);
  Status AddEngine(const std::string& name, EngineFactory factory);

  // kNotFound naming the registered names when `name` is not one.
  Result<std::unique_ptr<Task>> MakeTask(const std::string& name,
                                         const ComponentConfig& config) const;
  Result<std::unique_ptr<Engine>> MakeEngine(const std::string& name, const ComponentConfig& config,
                                             const Task& task) const;
  bool HasTask(const std::string& name) const { return tasks_.count(name) > 0; }
  bool HasEngine(const std::string& name) const { return engines_.count(name) > 0; }
  std::vector<std::string> tasks() const;
  std::vector<std::string> engines() const;

 private:
  std::map<std::string, TaskFactory> tasks_;
  std::map<std::string, EngineFactory> engines_;
};

}  // namespace weft::rollout_worker
