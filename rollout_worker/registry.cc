#include "rollout_worker/registry.h"

namespace weft::rollout_worker {
namespace {

template <typename Factory>
std::vector<std::string> Names(const std::map<std::string, Factory>& factories) {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories) names.push_back(name);
  return names;
}

template <typename Factory>
Status Add(std::map<std::string, Factory>& factories, const std::string& kind,
           const std::string& name, Factory factory) {
  if (name.empty() || !factory) return InvalidArgument("a " + kind + " needs a name and a factory");
  if (!factories.emplace(name, std::move(factory)).second) {
    return Conflict("a " + kind + " named '" + name + "' is registered already");
  }
  return Status::Ok();
}

template <typename Factory>
Result<const Factory*> Find(const std::map<std::string, Factory>& factories,
                            const std::string& kind, const std::string& name) {
  auto found = factories.find(name);
  if (found != factories.end()) return &found->second;
  std::string known;
  for (const std::string& n : Names(factories)) known += (known.empty() ? "" : ", ") + n;
  return NotFound("no " + kind + " named '" + name +
                  "' (known: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace

Status Registry::AddTask(const std::string& name, TaskFactory factory) {
  return Add(tasks_, "task", name, std::move(factory));
}

Status Registry::AddEngine(const std::string& name, EngineFactory factory) {
  return Add(engines_, "engine", name, std::move(factory));
}

Result<std::unique_ptr<Task>> Registry::MakeTask(const std::string& name,
                                                 const ComponentConfig& config) const {
  WEFT_ASSIGN_OR_RETURN(const TaskFactory* factory, Find(tasks_, "task", name));
  try {
    return (*factory)(config);
  } catch (const std::exception& error) {
    return InvalidArgument(config.path + ": task '" + name + "': " + error.what());
  }
}

Result<std::unique_ptr<Engine>> Registry::MakeEngine(const std::string& name,
                                                     const ComponentConfig& config,
                                                     const Task& task) const {
  WEFT_ASSIGN_OR_RETURN(const EngineFactory* factory, Find(engines_, "engine", name));
  try {
    return (*factory)(config, task);
  } catch (const std::exception& error) {
    return InvalidArgument(config.path + ": engine '" + name + "': " + error.what());
  }
}

std::vector<std::string> Registry::tasks() const { return Names(tasks_); }
std::vector<std::string> Registry::engines() const { return Names(engines_); }

}  // namespace weft::rollout_worker
