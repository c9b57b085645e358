#include "examples/example_trainer.h"

#include <algorithm>
#include <numeric>
#include <thread>

#include "common/logging.h"
#include "examples/embedded_engine.h"
#include "orchestrator/client.h"
#include "policy_store/object_store.h"
#include "policy_store/reader.h"
#include "trainer_adapter/batch_client.h"
#include "trainer_adapter/dataset.h"
#include "trainer_adapter/received_group.h"

namespace weft::examples {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTokenLimit = int64_t{1} << 31;  // token ids are ints

// A group as the worker submitted it, for the policy gradient: its trajectories parsed and checked
// by the trainer adapter (errors name the job and the sample). Its prompt is text (tokenised as the
// embedded engine tokenises it) or token ids (as the engine got them). A sample without a reward
// (the workers' task leaves rewards to the trainer) is scored here with `task`, on the prompt's
// text; `*computed` says how many were.
Result<Group> ToGroup(const trainer_adapter::ReceivedGroup& received, const ArithmeticTask& task,
                      size_t* computed) {
  const std::string what = "job " + std::to_string(received.job);
  Group group;
  std::string problem;  // the prompt's text
  const Json& prompt = received.prompt;
  if (prompt.is_string()) {
    problem = prompt.get<std::string>();
    Result<std::vector<int>> tokens = EmbeddedEngine::Tokenize(problem);
    if (!tokens.ok()) return tokens.status().WithContext(what);
    group.prompt = std::move(*tokens);
  } else if (prompt.is_array() && !prompt.empty()) {
    for (const Json& id : prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kTokenLimit)
        return InvalidArgument(what + ": the prompt's token ids must be integers from 0");
      group.prompt.push_back(id.get<int>());
    }
    std::vector<int> text(group.prompt);
    if (text.front() == ArithmeticTask::kBegin) text.erase(text.begin());
    problem = ArithmeticTask::Decode(text);
  } else {
    return InvalidArgument(what + ": the prompt must be text or token ids, not " + prompt.dump());
  }
  size_t scored = 0;
  for (const trainer_adapter::ReceivedSample& s : received.samples) {
    Sample sample;
    sample.tokens = s.tokens;
    sample.logprobs = s.logprobs;
    if (s.reward) {
      sample.reward = *s.reward;
    } else {
      sample.reward = task.Reward(problem, sample.tokens);  // 0 for a prompt that is no problem
      ++scored;
    }
    group.samples.push_back(std::move(sample));
  }
  *computed = scored;
  return group;
}

// The teacher of a distillation: published as `teacher.run`'s first version unless that run has
// one already (made by an earlier run, or published by hand). Returns its greedy accuracy on
// `eval` when made here.
Result<std::optional<double>> MakeTeacher(const TeacherOptions& teacher, int max_seq,
                                          const ArithmeticTask& task,
                                          const std::vector<std::string>& eval,
                                          const ExampleTrainerOptions& options,
                                          policy_store::ObjectStore& store,
                                          const std::function<void(int, double)>& on_step) {
  policy_store::StoreReader reader(store, teacher.run, 1);
  Result<uint64_t> latest = reader.Latest();
  if (latest.ok()) {
    WEFT_LOG(kInfo) << "trainer: the teacher " << teacher.name << " is run " << teacher.run
                    << " version " << *latest << " of the store, as published before";
    return std::optional<double>();
  }
  if (latest.status().code() != StatusCode::kNotFound)
    return latest.status().WithContext("reading the teacher's run " + teacher.run);
  TinyLmConfig shape = teacher.model;
  shape.max_seq = max_seq;
  const TinyLmLayout layout(shape);
  WEFT_ASSIGN_OR_RETURN(
      std::vector<float> weights,
      SupervisedPolicy(layout, task, options.seed ^ 0x7EAC4E2ull, teacher.warmup_steps,
                       teacher.warmup_batch, teacher.warmup_learning_rate, options.threads,
                       "teacher " + teacher.name, on_step));
  WEFT_ASSIGN_OR_RETURN(double accuracy,
                        GreedyAccuracy(layout, weights, task, eval, options.threads));
  WEFT_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer_adapter::Publisher> publisher,
      trainer_adapter::Publisher::Start(store, teacher.run, layout.Master(weights),
                                        sync::ServingPlan{}, options.publisher));
  WEFT_LOG(kInfo) << "trainer: the teacher " << teacher.name << " (" << layout.size()
                  << " parameters, greedy accuracy " << accuracy << ") is published as run "
                  << teacher.run << " version 0";
  return std::optional<double>(accuracy);
}

// A score job for the teacher: `group`'s samples after its prompt.
orchestrator::NewJob ScoreJobFor(const Group& group, const std::string& teacher) {
  orchestrator::NewJob job;
  job.prompt = group.prompt;
  job.targets = Json::array();
  for (const Sample& s : group.samples) job.targets.push_back(s.tokens);
  job.samples = static_cast<uint32_t>(group.samples.size());
  job.model = teacher;
  job.kind = orchestrator::JobKind::kScore;
  return job;
}

// A teacher's scores (a score group, `d`) joined to the policy's group waiting for them, which
// then goes to `take` with its lag; errors name the job.
Status AttachTeacher(const orchestrator::Delivered& d, uint64_t version,
                     std::map<uint64_t, std::pair<Group, uint64_t>>* awaiting,
                     const std::function<void(Group, uint64_t)>& take) {
  const std::string what = "score job " + std::to_string(d.group.job);
  auto found = awaiting->find(d.group.job);
  if (found == awaiting->end()) return NotFound(what + ": no group of this trainer's waits for it");
  std::pair<Group, uint64_t> waiting = std::move(found->second);
  awaiting->erase(found);
  WEFT_ASSIGN_OR_RETURN(trainer_adapter::ReceivedGroup received,
                        trainer_adapter::ParseGroup(d, version));
  std::vector<Sample>& samples = waiting.first.samples;
  if (received.samples.size() != samples.size())
    return DataLoss(what + ": " + std::to_string(received.samples.size()) + " samples scored of " +
                    std::to_string(samples.size()));
  for (size_t i = 0; i < samples.size(); ++i) {
    if (received.samples[i].tokens != samples[i].tokens)
      return DataLoss(what + ": sample " + std::to_string(i) + " came back with other tokens");
    samples[i].teacher_logprobs = received.samples[i].logprobs;
  }
  take(std::move(waiting.first), waiting.second);
  return Status::Ok();
}

double MeanReward(const std::vector<StepRecord>& steps, size_t from, size_t to) {
  if (from >= to) return 0;
  double sum = 0;
  size_t samples = 0;
  for (size_t i = from; i < to; ++i) {
    sum += steps[i].reward * static_cast<double>(steps[i].samples);
    samples += steps[i].samples;
  }
  return samples > 0 ? sum / static_cast<double>(samples) : 0;
}

}  // namespace

Result<std::vector<float>> SupervisedPolicy(const TinyLmLayout& layout, const ArithmeticTask& task,
                                            uint64_t seed, int steps, int batch,
                                            double learning_rate, int threads,
                                            const std::string& name,
                                            const std::function<void(int, double)>& on_step) {
  std::vector<float> weights = layout.Initialize(seed);
  std::mt19937_64 rng(seed);
  AdamWConfig warmup;
  warmup.learning_rate = learning_rate;
  AdamW optimizer(layout, warmup);
  for (int step = 1; step <= steps; ++step) {
    WEFT_ASSIGN_OR_RETURN(double loss,
                          SupervisedStep(layout, weights, optimizer, task, rng, batch, threads));
    if (step % 250 == 0 || step == steps) {
      WEFT_LOG(kInfo) << name << ": supervised step " << step << " loss " << loss;
    }
    if (on_step) on_step(step, loss);
  }
  return weights;
}

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRft:
      return "rft";
    case Algorithm::kDistill:
      return "distill";
    case Algorithm::kGrpo:
      break;
  }
  return "grpo";
}

std::optional<Algorithm> AlgorithmFromName(std::string_view name) {
  for (Algorithm a : {Algorithm::kGrpo, Algorithm::kRft, Algorithm::kDistill}) {
    if (name == AlgorithmName(a)) return a;
  }
  return std::nullopt;
}

Json TrainerSummary::ToJson() const {
  Json records = Json::array();
  for (const StepRecord& r : steps) {
    records.push_back({{"step", r.step},
                       {"version", r.version},
                       {"reward", r.reward},
                       {"groups", r.groups},
                       {"samples", r.samples},
                       {"mean_lag", r.mean_lag},
                       {"max_lag", r.max_lag},
                       {"delta_bytes", r.delta_bytes},
                       {"keyframe_bytes", r.keyframe_bytes},
                       {"changed_elements", r.changed_elements},
                       {"density", r.density},
                       {"mean_ratio", r.mean_ratio},
                       {"truncated", r.truncated},
                       {"seconds", r.seconds},
                       {"wait_seconds", r.wait_seconds},
                       {"survivors", r.survivors},
                       {"reverse_kl", r.reverse_kl}});
  }
  return Json{{"phase", phase},
              {"warmup_step", warmup_step},
              {"warmup_loss", warmup_loss},
              {"warmup_steps", warmup_steps},
              {"steps_total", steps_total},
              {"eval_accuracy_before", eval_accuracy_before},
              {"eval_accuracy_after", eval_accuracy_after},
              {"random_policy_reward", random_policy_reward},
              {"initial_reward", initial_reward},
              {"final_reward", final_reward},
              {"versions_published", versions_published},
              {"served_bytes", served_bytes},
              {"parameters", parameters},
              {"bytes_published", bytes_published},
              {"groups_stale_delivered", groups_stale_delivered},
              {"staleness_violations", staleness_violations},
              {"groups_with_metadata", groups_with_metadata},
              {"rewards_computed", rewards_computed},
              {"algorithm", algorithm},
              {"teacher_accuracy", teacher_accuracy ? Json(*teacher_accuracy) : Json(nullptr)},
              {"groups_scored", groups_scored},
              {"steps", records}};
}

TinyLmConfig ExampleTrainerOptions::PolicyShape() const {
  TinyLmConfig shape = model;
  shape.max_seq = sequence_length > 0 ? sequence_length : ArithmeticTask(digits).max_length();
  return shape;
}

Result<TrainerSummary> RunExampleTrainer(
    const ExampleTrainerOptions& options,
    const std::function<void(const TrainerSummary&)>& progress) {
  if (options.steps < 1 || options.prompts_per_step < 1 || options.samples_per_prompt < 2 ||
      options.steps_ahead < 1) {
    return InvalidArgument(
        "trainer: steps, prompts_per_step and steps_ahead must be at least 1, samples_per_prompt "
        "at least 2");
  }
  const ArithmeticTask task(options.digits);
  TinyLmConfig config = options.PolicyShape();
  if (config.max_seq < task.max_length()) {
    return InvalidArgument(
        "trainer: the workers' task gives sequences of " + std::to_string(config.max_seq) +
        " tokens (task.max_prompt_tokens + task.max_tokens); the example trainer's problems of " +
        std::to_string(options.digits) + " digits with their answers need " +
        std::to_string(task.max_length()));
  }
  // The dataset is read before anything else, so that a bad line fails the run at once.
  std::vector<trainer_adapter::DatasetPrompt> dataset;
  if (!options.dataset.empty()) {
    Result<std::vector<trainer_adapter::DatasetPrompt>> read =
        trainer_adapter::ReadPromptDataset(options.dataset);
    if (!read.ok()) return read.status().WithContext("task.dataset");
    dataset = std::move(*read);
    WEFT_LOG(kInfo) << "trainer: " << dataset.size() << " prompts from " << options.dataset;
  }
  size_t next_prompt = 0;  // the dataset's next row
  const TinyLmLayout layout(config);
  std::vector<float> weights = layout.Initialize(options.seed);
  std::mt19937_64 rng(options.seed);
  TrainerSummary summary;
  summary.parameters = layout.size();
  summary.warmup_steps = options.warmup_steps;
  summary.steps_total = options.steps;
  const std::vector<std::string> eval = task.HeldOutProblems(options.seed, options.eval_problems);
  for (const std::string& p : eval) summary.random_policy_reward += task.RandomPolicyReward(p);
  summary.random_policy_reward /= std::max<size_t>(1, eval.size());

  summary.algorithm = AlgorithmName(options.algorithm);
  policy_store::OpenOptions open;
  open.create = true;  // the run's first version may start the store
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<policy_store::ObjectStore> store,
                        policy_store::OpenStore(options.store, open));
  // 0. Distillation's teacher, first: its clusters get ready while the policy warms up.
  if (options.algorithm == Algorithm::kDistill) {
    if (options.teacher.name.empty() || options.teacher.run.empty())
      return InvalidArgument("trainer: distillation needs a teacher (a fixed model)");
    // Reported as the teacher's phase, in the warm-up's fields.
    summary.phase = "teacher";
    summary.warmup_steps = options.teacher.warmup_steps;
    WEFT_ASSIGN_OR_RETURN(summary.teacher_accuracy,
                          MakeTeacher(options.teacher, config.max_seq, task, eval, options, *store,
                                      [&](int step, double loss) {
                                        summary.warmup_step = step;
                                        summary.warmup_loss = loss;
                                        if (step % 25 == 0 || step == options.teacher.warmup_steps)
                                          progress(summary);
                                      }));
    summary.warmup_step = 0;
    summary.warmup_steps = options.warmup_steps;
  }

  // 1. Supervised warm-up, locally.
  summary.phase = "warm-up";
  {
    AdamWConfig warmup;
    warmup.learning_rate = options.warmup_learning_rate;
    AdamW optimizer(layout, warmup);
    for (int step = 1; step <= options.warmup_steps; ++step) {
      WEFT_ASSIGN_OR_RETURN(summary.warmup_loss,
                            SupervisedStep(layout, weights, optimizer, task, rng,
                                           options.warmup_batch, options.threads));
      summary.warmup_step = step;
      if (step % 25 == 0 || step == options.warmup_steps) progress(summary);
    }
  }
  WEFT_ASSIGN_OR_RETURN(summary.eval_accuracy_before,
                        GreedyAccuracy(layout, weights, task, eval, options.threads));

  // 2. Version 0: the warm-started policy.
  WEFT_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer_adapter::Publisher> publisher,
      trainer_adapter::Publisher::Start(*store, options.run_id, layout.Master(weights),
                                        sync::ServingPlan{}, options.publisher));
  summary.served_bytes = publisher->served().byte_count();
  summary.versions_published = 1;
  summary.bytes_published += publisher->last().keyframe_bytes();
  HttpClientOptions http;
  http.deadline = options.deadline;
  // The deadline alone bounds a call, however many tries it takes: an orchestrator a scheduler
  // requeues onto another node may be away for a minute.
  http.attempts = 1 << 20;
  orchestrator::OrchestratorClient client(options.orchestrator, options.trainer_token, http);
  WEFT_RETURN_IF_ERROR(client.AnnounceVersion(0).WithContext("announcing version 0"));
  trainer_adapter::BatchClient batches(client, options.max_staleness);

  // 3. Reinforcement learning.
  summary.phase = "rl";
  const std::unique_ptr<Optimizer> optimizer =
      MakeOptimizer(options.optimizer_kind, layout, options.optimizer, options.threads);
  const auto started = Clock::now();
  uint64_t version = 0;
  const size_t per_step = static_cast<size_t>(options.prompts_per_step);
  // Queues prompts until `want` jobs are queued, leased or buffered at the orchestrator.
  auto top_up = [&](size_t want) -> Status {
    WEFT_ASSIGN_OR_RETURN(orchestrator::wire::StatusPage status, client.GetStatus());
    // The policy's jobs (a teacher's score jobs are not prompts).
    size_t queued = status.jobs.queued + status.jobs.leased;
    for (const orchestrator::wire::StatusPage::Model& m : status.models) {
      if (m.name.empty()) queued = m.queued + m.leased;
    }
    const size_t pending = queued + status.trajectories.buffered;
    if (pending >= want) return Status::Ok();
    const auto samples = static_cast<uint32_t>(options.samples_per_prompt);
    Status added = Status::Ok();
    if (dataset.empty()) {
      std::vector<std::pair<Json, uint32_t>> prompts;
      for (size_t i = pending; i < want; ++i)
        prompts.emplace_back(Json(task.Problem(rng)), samples);
      added = client.AddJobs(prompts).status();
    } else {
      // The dataset's prompts in order, starting over at its end, each with its metadata.
      std::vector<orchestrator::NewJob> jobs;
      for (size_t i = pending; i < want; ++i) {
        jobs.push_back(dataset[next_prompt].Job(samples));
        next_prompt = (next_prompt + 1) % dataset.size();
      }
      added = client.AddJobs(jobs).status();
    }
    if (added.code() == StatusCode::kUnavailable || added.code() == StatusCode::kTimeout) {
      // The request may or may not have reached the orchestrator (it restarted, say). Not fatal:
      // the next top-up counts what is pending and queues only what is missing.
      WEFT_LOG(kWarning) << "trainer: queueing prompts: " << added.message()
                         << "; will count again";
      return Status::Ok();
    }
    return added.WithContext("queueing prompts");
  };
  // Distillation: the policy's groups waiting for the teacher's scores, by their score job, with
  // their lag when they arrived.
  std::map<uint64_t, std::pair<Group, uint64_t>> awaiting;
  for (int step = 1; step <= options.steps; ++step) {
    const auto step_started = Clock::now();
    // Keep `steps_ahead` steps of prompts queued, leased or waiting (and no more than the
    // remaining steps need).
    WEFT_RETURN_IF_ERROR(top_up(
        per_step * static_cast<size_t>(std::min(options.steps_ahead, options.steps - step + 1))));
    // The step's groups.
    StepRecord record;
    std::vector<Group> groups;
    auto last_arrival = Clock::now();
    size_t samples = 0;
    uint64_t lag_sum = 0;
    while (groups.size() < per_step) {
      const size_t wanted =
          (per_step - groups.size()) * static_cast<size_t>(options.samples_per_prompt);
      const Clock::time_point asked = Clock::now();
      Result<std::vector<orchestrator::Delivered>> taken =
          batches.NextBatch(wanted, version, std::chrono::milliseconds(2000));
      record.wait_seconds += std::chrono::duration<double>(Clock::now() - asked).count();
      WEFT_ASSIGN_OR_RETURN(std::vector<orchestrator::Delivered> batch, std::move(taken));
      if (batch.empty()) {
        // Nothing came: the work for this step may have been dropped as stale. Queue what is
        // missing.
        WEFT_RETURN_IF_ERROR(top_up(per_step - groups.size()));
      } else {
        last_arrival = Clock::now();
      }
      std::vector<orchestrator::NewJob> scoring;  // distillation: this batch's groups
      std::vector<std::pair<Group, uint64_t>> to_score;
      auto take = [&](Group group, uint64_t lag) {
        samples += group.samples.size();
        groups.push_back(std::move(group));
        lag_sum += lag;
        record.max_lag = std::max(record.max_lag, lag);
      };
      for (const orchestrator::Delivered& d : batch) {
        if (d.kind == orchestrator::JobKind::kScore) {
          Status scored = AttachTeacher(d, version, &awaiting, take);
          if (scored.ok()) {
            ++summary.groups_scored;
          } else {
            WEFT_LOG(kError) << "trainer: skipping a teacher's scores: " << scored.message();
          }
          continue;
        }
        size_t computed = 0;
        Result<trainer_adapter::ReceivedGroup> received = trainer_adapter::ParseGroup(d, version);
        Result<Group> group =
            received.ok() ? ToGroup(*received, task, &computed) : Result<Group>(received.status());
        if (!group.ok()) {
          WEFT_LOG(kError) << "trainer: skipping a malformed trajectory group: "
                           << group.status().message();
          continue;
        }
        summary.rewards_computed += computed;
        if (!d.metadata.empty()) ++summary.groups_with_metadata;
        const uint64_t lag = trainer_adapter::LagOf(d.group, version);
        if (options.algorithm == Algorithm::kDistill) {
          scoring.push_back(ScoreJobFor(*group, options.teacher.name));
          to_score.emplace_back(std::move(*group), lag);
        } else {
          take(std::move(*group), lag);
        }
      }
      if (!scoring.empty()) {
        // The teacher scores them; they join the step when its answers come back.
        Result<std::vector<uint64_t>> ids = client.AddJobs(scoring);
        if (!ids.ok() || ids->size() != to_score.size()) {
          WEFT_LOG(kWarning) << "trainer: asking the teacher to score " << scoring.size()
                             << " groups failed ("
                             << (ids.ok() ? "wrong answer" : ids.status().message())
                             << "); they are dropped";
        } else {
          for (size_t i = 0; i < ids->size(); ++i) awaiting[(*ids)[i]] = std::move(to_score[i]);
        }
      }
      if (Clock::now() - last_arrival > options.stall_after) {
        return Unavailable("trainer: no trajectories for " +
                           std::to_string(options.stall_after.count() / 1000) + " s at step " +
                           std::to_string(step) + " (are any workers ready?)");
      }
    }
    record.step = step;
    record.groups = groups.size();
    record.samples = samples;
    double rewards = 0;
    for (const Group& g : groups) {
      for (const Sample& s : g.samples) rewards += s.reward;
    }
    record.reward = samples > 0 ? rewards / static_cast<double>(samples) : 0;
    record.mean_lag = static_cast<double>(lag_sum) / static_cast<double>(groups.size());
    Result<StepStats> stepped = InvalidArgument("no learning rule");
    switch (options.algorithm) {
      case Algorithm::kGrpo:
        stepped = PolicyGradientStep(layout, weights, *optimizer, groups, options.policy_gradient,
                                     options.threads);
        break;
      case Algorithm::kRft:
        stepped = RejectionSamplingStep(layout, weights, *optimizer, groups, options.rft_threshold,
                                        options.threads);
        break;
      case Algorithm::kDistill:
        stepped = DistillationStep(layout, weights, *optimizer, groups, options.policy_gradient,
                                   options.threads);
        break;
    }
    WEFT_ASSIGN_OR_RETURN(StepStats stats, std::move(stepped));
    record.mean_ratio = stats.mean_ratio;
    record.truncated = stats.truncated;
    record.survivors = stats.survivors;
    record.reverse_kl = stats.reverse_kl;
    // Publish the new version.
    const Clock::time_point publishing = Clock::now();
    WEFT_ASSIGN_OR_RETURN(policy_store::Manifest manifest,
                          publisher->Publish(layout.Master(weights)));
    const double publish_seconds = std::chrono::duration<double>(Clock::now() - publishing).count();
    record.changed_elements = publisher->last_stats().changed_elements;
    record.density = publisher->last_stats().density();
    version = manifest.version;
    record.version = version;
    record.delta_bytes = manifest.delta ? manifest.delta->bytes : 0;
    record.keyframe_bytes = manifest.keyframe_bytes();
    summary.bytes_published += record.delta_bytes + record.keyframe_bytes;
    for (const policy_store::SkipDelta& skip : manifest.skips)
      summary.bytes_published += skip.blob.bytes;
    ++summary.versions_published;
    WEFT_RETURN_IF_ERROR(client.AnnounceVersion(version, publish_seconds)
                             .WithContext("announcing version " + std::to_string(version)));
    record.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    summary.steps.push_back(record);
    summary.groups_stale_delivered = batches.staleness().stale_delivered;
    summary.staleness_violations = batches.staleness().violations;
    const size_t window = std::min<size_t>(5, summary.steps.size());
    summary.initial_reward = MeanReward(summary.steps, 0, window);
    summary.final_reward =
        MeanReward(summary.steps, summary.steps.size() - window, summary.steps.size());
    progress(summary);
    std::this_thread::sleep_until(step_started + options.min_step_time);
  }
  WEFT_RETURN_IF_ERROR(client.AcknowledgeBatches().WithContext("acknowledging the last batch"));
  WEFT_ASSIGN_OR_RETURN(summary.eval_accuracy_after,
                        GreedyAccuracy(layout, weights, task, eval, options.threads));
  summary.phase = "done";
  progress(summary);
  return summary;
}

}  // namespace weft::examples
