#include "rollout_worker/registry.h"

#include <doctest/doctest.h>

namespace weft::rollout_worker {
namespace {

// A task whose lengths come from its config section, and an engine that only records its task.
class FixedTask : public Task {
 public:
  explicit FixedTask(int length) : length_(length) {}
  TaskLimits limits() const override { return {length_, length_ + 1, 7}; }
  Result<Prompt> Encode(const nlohmann::json&) const override { return Prompt{{1}, ""}; }
  Result<std::optional<double>> Reward(const nlohmann::json&, const nlohmann::json&,
                                       const Completion&) const override {
    return std::optional<double>(0);
  }

 private:
  int length_;
};

class NullEngine : public Engine {
 public:
  explicit NullEngine(TaskLimits limits) : limits(limits) {}
  Status Stage(const sync::ServedModel&, uint64_t) override { return Status::Ok(); }
  Result<int64_t> Commit() override { return 0; }
  std::optional<uint64_t> version() const override { return std::nullopt; }
  Result<std::vector<Completion>> Generate(const std::vector<Prompt>&, const Sampling&) override {
    return std::vector<Completion>();
  }
  EngineHealth Health() const override { return {}; }
  TaskLimits limits;
};

TEST_CASE("registry: engines and tasks by name, each reading its own section") {
  Registry registry;
  REQUIRE(registry
              .AddTask("fixed",
                       [](const ComponentConfig& config) -> Result<std::unique_ptr<Task>> {
                         const YAML::Node task = config.document["task"];
                         if (!task || !task["length"]) {
                           return InvalidArgument(config.path + ": task.length is needed");
                         }
                         return std::unique_ptr<Task>(new FixedTask(task["length"].as<int>()));
                       })
              .ok());
  REQUIRE(registry
              .AddEngine(
                  "null",
                  [](const ComponentConfig&, const Task& task) -> Result<std::unique_ptr<Engine>> {
                    return std::unique_ptr<Engine>(new NullEngine(task.limits()));
                  })
              .ok());
  CHECK(registry
            .AddTask("fixed",
                     [](const ComponentConfig&) -> Result<std::unique_ptr<Task>> {
                       return Internal("never");
                     })
            .code() == StatusCode::kConflict);
  CHECK(registry.AddEngine("", nullptr).code() == StatusCode::kInvalidArgument);
  CHECK(registry.tasks() == std::vector<std::string>{"fixed"});
  CHECK(registry.engines() == std::vector<std::string>{"null"});
  CHECK(registry.HasEngine("null"));
  CHECK(!registry.HasTask("null"));

  ComponentConfig config{YAML::Load("task: {name: fixed, length: 5}"), "run.yaml", 2};
  auto task = registry.MakeTask("fixed", config);
  REQUIRE(task.ok());
  CHECK((*task)->limits().max_prompt_tokens == 5);
  auto engine = registry.MakeEngine("null", config, **task);
  REQUIRE(engine.ok());
  CHECK(static_cast<NullEngine&>(**engine).limits.max_completion_tokens == 6);
  // Unknown names list the known ones; a factory's own errors come through.
  CHECK(registry.MakeEngine("sglang", config, **task).status().message() ==
        "no engine named 'sglang' (known: null)");
  CHECK(Registry().MakeTask("fixed", config).status().message() ==
        "no task named 'fixed' (known: none)");
  ComponentConfig empty{YAML::Load("{}"), "run.yaml", 1};
  CHECK(registry.MakeTask("fixed", empty).status().message() == "run.yaml: task.length is needed");
  // A factory that lets an exception out is reported, not let through.
  ComponentConfig words{YAML::Load("task: {length: many}"), "run.yaml", 1};
  Status thrown = registry.MakeTask("fixed", words).status();
  CHECK(thrown.code() == StatusCode::kInvalidArgument);
  CHECK(thrown.message().rfind("run.yaml: task 'fixed': ", 0) == 0);
}

}  // namespace
}  // namespace weft::rollout_worker
