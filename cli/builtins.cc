#include "cli/builtins.h"

#include <set>

#include "common/yaml_fields.h"
#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"
#include "examples/tiny_lm.h"
#include "rollout_worker/http_engine.h"
#include "rollout_worker/http_task.h"

namespace weft::cli {
namespace {

// The model section's defaults are the example policy's.
constexpr ModelSection kModelDefaults;
constexpr examples::TinyLmConfig kTinyLmDefaults;
static_assert(kModelDefaults.vocab == kTinyLmDefaults.vocab &&
                  kModelDefaults.vocab == examples::ArithmeticTask::kVocab &&
                  kModelDefaults.d_model == kTinyLmDefaults.d_model &&
                  kModelDefaults.layers == kTinyLmDefaults.layers &&
                  kModelDefaults.heads == kTinyLmDefaults.heads &&
                  kModelDefaults.d_ff == kTinyLmDefaults.d_ff,
              "the model section's defaults must be the example policy's");

// The keys of `task:` that the trainers read and the workers' task kinds leave alone.
const std::set<std::string>& TrainerTaskKeys() {
  static const std::set<std::string> keys = {"digits", "dataset"};
  return keys;
}

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
          ModelSection section;
          WEFT_RETURN_IF_ERROR(
              ParseModelSection(config.document["model"], &section).WithContext(config.path));
          examples::TinyLmConfig model;
          model.vocab = section.vocab;
          model.d_model = section.d_model;
          model.layers = section.layers;
          model.heads = section.heads;
          model.d_ff = section.d_ff;
          Result<int> positions = ModelPositions(section, task.limits());
          if (!positions.ok()) return positions.status().WithContext(config.path);
          model.max_seq = *positions;
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

Status ParseModelSection(const YAML::Node& m, ModelSection* model) {
  if (!m) return Status::Ok();
  WEFT_RETURN_IF_ERROR(CheckKeys(m, "model", {"d_model", "layers", "heads", "d_ff", "context"}));
  WEFT_RETURN_IF_ERROR(ReadInt(m, "model", "d_model", &model->d_model, 4, 4096));
  WEFT_RETURN_IF_ERROR(ReadInt(m, "model", "layers", &model->layers, 1, 64));
  WEFT_RETURN_IF_ERROR(ReadInt(m, "model", "heads", &model->heads, 1, 64));
  WEFT_RETURN_IF_ERROR(ReadInt(m, "model", "d_ff", &model->d_ff, 4, 65536));
  if (m["context"])  // (absent: 0, the task's length)
    WEFT_RETURN_IF_ERROR(ReadInt(m, "model", "context", &model->context, 2, 1 << 20));
  if (model->d_model % model->heads != 0) {
    return InvalidArgument("model.d_model must be a multiple of model.heads");
  }
  return Status::Ok();
}

Result<int> ModelPositions(const ModelSection& model, const rollout_worker::TaskLimits& limits) {
  const int sequence = limits.sequence_tokens();
  if (model.context == 0) return sequence;
  if (model.context < sequence) {
    return InvalidArgument("model.context is " + std::to_string(model.context) +
                           " tokens; the task's sequences are up to " + std::to_string(sequence) +
                           " (max_prompt_tokens " + std::to_string(limits.max_prompt_tokens) +
                           " + max_tokens " + std::to_string(limits.max_completion_tokens) + ")");
  }
  return model.context;
}

Status ParseTaskSection(const YAML::Node& task, TaskSection* section) {
  if (!task) return Status::Ok();
  if (!task.IsMap()) return InvalidArgument("task must be a map of settings" + LineOf(task));
  if (const YAML::Node name = task["name"]) {
    // Older configs named the task with `name`; say what to write rather than "unknown key".
    const std::string kind = name.IsScalar() ? name.Scalar() : "...";
    return InvalidArgument("task.name" + LineOf(name) +
                           ": the task is chosen by `kind`; write task: {kind: " + kind + ", ...}");
  }
  WEFT_RETURN_IF_ERROR(ReadString(task, "task", "kind", &section->kind));
  if (!Builtins().HasTask(section->kind)) {
    std::string known;
    for (const std::string& k : Builtins().tasks()) known += (known.empty() ? "" : ", ") + k;
    return InvalidArgument("task.kind: '" + section->kind +
                           "' is not a task kind (known: " + known + ")" + LineOf(task["kind"]));
  }
  if (section->kind == "arithmetic")
    WEFT_RETURN_IF_ERROR(CheckKeys(task, "task", {"kind", "digits", "dataset"}));
  WEFT_RETURN_IF_ERROR(ReadInt(task, "task", "digits", &section->digits, 1, 6));
  WEFT_RETURN_IF_ERROR(ReadString(task, "task", "dataset", &section->dataset));
  if (task["dataset"] && section->dataset.empty())
    return InvalidArgument("task.dataset is empty: name a JSONL file" + LineOf(task["dataset"]));
  return Status::Ok();
}

}  // namespace weft::cli
