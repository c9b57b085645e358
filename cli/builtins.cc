#include "cli/builtins.h"

#include "cli/run_config.h"
#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"
#include "rollout_worker/http_engine.h"
#include "rollout_worker/http_task.h"

namespace weft::cli {
namespace {

rollout_worker::Registry MakeBuiltins() {
  rollout_worker::Registry registry;
  Status added = registry.AddTask(
      "arithmetic",
      [](const rollout_worker::ComponentConfig& config)
          -> Result<std::unique_ptr<rollout_worker::Task>> {
        TaskSection section;
        WEFT_RETURN_IF_ERROR(
            ParseTaskSection(config.document["task"], &section).WithContext(config.path));
        return std::unique_ptr<rollout_worker::Task>(
            new examples::ArithmeticVerifier(examples::ArithmeticTask(section.digits)));
      });
  // Tasks at the text level (rollout_worker/http_task.h): rewards from a reward service, or from
  // the trainer.
  if (added.ok()) {
    added = registry.AddTask("http",
                             [](const rollout_worker::ComponentConfig& config)
                                 -> Result<std::unique_ptr<rollout_worker::Task>> {
                               Result<rollout_worker::HttpTaskSettings> settings =
                                   rollout_worker::ParseHttpTaskSection(config.document["task"],
                                                                        TrainerTaskKeys());
                               if (!settings.ok())
                                 return settings.status().WithContext(config.path);
                               return std::unique_ptr<rollout_worker::Task>(
                                   new rollout_worker::HttpRewardTask(std::move(*settings)));
                             });
  }
  if (added.ok()) {
    added = registry.AddTask("trainer",
                             [](const rollout_worker::ComponentConfig& config)
                                 -> Result<std::unique_ptr<rollout_worker::Task>> {
                               Result<rollout_worker::TaskLimits> limits =
                                   rollout_worker::ParseTrainerTaskSection(config.document["task"],
                                                                           TrainerTaskKeys());
                               if (!limits.ok()) return limits.status().WithContext(config.path);
                               return std::unique_ptr<rollout_worker::Task>(
                                   new rollout_worker::TrainerRewardTask(*limits));
                             });
  }
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
  // Serving engines behind HTTP (rollout_worker/http_engine.h), configured by the `engine:`
  // section; a worker's replica URLs come from its command line or region.
  for (const rollout_worker::EngineApi& kind : rollout_worker::EngineApis()) {
    if (!added.ok()) break;
    const std::string api = kind.name;
    added = registry.AddEngine(
        api,
        [api](const rollout_worker::ComponentConfig& config,
              const rollout_worker::Task&) -> Result<std::unique_ptr<rollout_worker::Engine>> {
          Result<rollout_worker::HttpEngineOptions> options = rollout_worker::ParseEngineSection(
              config.document["engine"], api, config.cluster.empty() ? "check" : config.cluster,
              config.engine_urls);
          if (!options.ok()) return options.status().WithContext(config.path);
          WEFT_ASSIGN_OR_RETURN(std::unique_ptr<rollout_worker::HttpEngine> engine,
                                rollout_worker::HttpEngine::Create(std::move(*options)));
          return std::unique_ptr<rollout_worker::Engine>(std::move(engine));
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
