#include "cli/builtins.h"

#include "cli/run_config.h"
#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"

namespace weft::cli {
namespace {

rollout_worker::Registry MakeBuiltins() {
  rollout_worker::Registry registry;
  Status added = registry.AddTask(
      "arithmetic",
      [](const rollout_worker::ComponentConfig& config)
          -> Result<std::unique_ptr<rollout_worker::Task>> {
        std::string name;
        int digits = 2;
        WEFT_RETURN_IF_ERROR(
            ParseTaskSection(config.document["task"], &name, &digits).WithContext(config.path));
        return std::unique_ptr<rollout_worker::Task>(
            new examples::ArithmeticVerifier(examples::ArithmeticTask(digits)));
      });
  if (added.ok()) {
    added = registry.AddEngine(
        "embedded",
        [](const rollout_worker::ComponentConfig& config,
           const rollout_worker::Task& task) -> Result<std::unique_ptr<rollout_worker::Engine>> {
          examples::TinyLmConfig model;
          WEFT_RETURN_IF_ERROR(
              ParseModelSection(config.document["model"], &model).WithContext(config.path));
          const rollout_worker::TaskLimits limits = task.limits();
          model.max_seq = limits.max_prompt_tokens + limits.max_completion_tokens;
          return std::unique_ptr<rollout_worker::Engine>(
              new examples::EmbeddedEngine(model, config.threads));
        });
  }
  if (!added.ok()) std::abort();  // two built-ins of one name: a programming error
  return registry;
}

}  // namespace

const rollout_worker::Registry& Builtins() {
  static const rollout_worker::Registry registry = MakeBuiltins();
  return registry;
}

}  // namespace weft::cli
