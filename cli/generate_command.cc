// weft generate CONFIG: a run with no trainer. A fixed model's workers (the run's processes, as
// `weft run` starts them: cli/run_processes.h) sample completions of a JSONL dataset's prompts,
// and this process writes them as sharded JSONL records, each (prompt, sample) exactly once,
// however often the orchestrator, the workers or this process itself are killed: the output
// directory is the record of what is done, written and fsynced before the batch that brought it
// is acknowledged, and read back (a torn last line cut off) when the command runs again, which
// then generates only what is missing. Formats: docs/formats.md, "Generated records"; keys:
// docs/run.md, "Generating datasets".
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/commands.h"
#include "cli/run_config.h"
#include "cli/run_processes.h"
#include "cli/supervisor.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "orchestrator/client.h"
#include "policy_store/manifest.h"
#include "policy_store/publish.h"
#include "policy_store/reader.h"
#include "sync/safetensors.h"
#include "trainer_adapter/dataset.h"
#include "trainer_adapter/received_group.h"

namespace weft::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char kRunMarker[] = ".weft-generate";
const char kOutputMarker[] = "weft-generate.json";

// The SHA-256 of a file, read a piece at a time.
Result<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  policy_store::Sha256 hash;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash.Update(
        {reinterpret_cast<const uint8_t*>(buffer.data()), static_cast<size_t>(in.gcount())});
  }
  if (in.bad()) return Unavailable("reading " + path + " failed");
  return hash.HexDigest();
}

// The fixed model the run generates with: published from the checkpoint as its run's first
// version when that run has none, and otherwise checked to be the checkpoint's weights.
struct ModelIdentity {
  std::string digest;
  uint64_t version = 0;
};

Result<ModelIdentity> PrepareModel(const RunConfig& config, const fs::path& dir) {
  const FixedModelConfig& fixed = *config.FindFixedModel(config.generate.model);
  policy_store::OpenOptions open;
  open.create = true;
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<policy_store::ObjectStore> store,
                        policy_store::OpenStore(config.publish_store(dir.string()), open));
  policy_store::StoreReader reader(*store, fixed.run, 1);
  Result<uint64_t> latest = reader.Latest();
  if (!latest.ok() && latest.status().code() != StatusCode::kNotFound) return latest.status();
  std::optional<std::string> wanted;  // the checkpoint's digest
  std::optional<sync::ServedModel> model;
  if (!config.generate.checkpoint.empty()) {
    WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile file,
                          sync::SafetensorsFile::Open(config.generate.checkpoint));
    model = sync::ServedModel::FromSafetensors(file, ThreadsOrAll(0));
    wanted = policy_store::StateDigest(*model);
  }
  if (!latest.ok()) {
    if (!model) {
      return InvalidArgument("generate: the store has no version of run " + fixed.run + " (model " +
                             fixed.name + ") and generate.checkpoint names none to publish");
    }
    WEFT_ASSIGN_OR_RETURN(
        policy_store::Manifest published,
        policy_store::PublishModel(*store, fixed.run, *model, policy_store::KeyframePolicy{},
                                   ThreadsOrAll(0), uint64_t{0}));
    std::printf("published %s as run %s version 0 of the store\n",
                config.generate.checkpoint.c_str(), fixed.run.c_str());
    return ModelIdentity{policy_store::StateDigest(published), published.version};
  }
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest manifest, reader.GetManifest(*latest));
  const std::string digest = policy_store::StateDigest(manifest);
  if (wanted && *wanted != digest) {
    return InvalidArgument("generate.checkpoint " + config.generate.checkpoint + " (digest " +
                           *wanted + ") is not run " + fixed.run + " version " +
                           std::to_string(*latest) + " of the store (digest " + digest +
                           "); give the model another run (fixed_models[].run)");
  }
  return ModelIdentity{digest, manifest.version};
}

// The output directory: its records, read back when it is opened, and the shards being written.
class Output {
 public:
  // `ids`: each prompt's id as its record holds it (JSON text) -> its index; `samples`: how many
  // each prompt wants.
  static Result<Output> Open(const std::string& dir, const Json& identity,
                             const std::map<std::string, size_t>& ids,
                             const std::vector<uint32_t>& samples, uint64_t shard_records) {
    Output out;
    out.dir_ = dir;
    out.shard_records_ = shard_records;
    for (uint32_t n : samples) out.done_.emplace_back(n, false);
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) return Unavailable("cannot create " + dir + ": " + error.message());
    const std::string marker = dir + "/" + kOutputMarker;
    Result<std::vector<uint8_t>> held = ReadFile(marker);
    if (held.ok()) {
      const Json theirs = Json::parse(held->begin(), held->end(), nullptr, false);
      if (theirs != identity) {
        return InvalidArgument(
            "generate.output " + dir + " holds another run's records (its " + kOutputMarker + ": " +
            (theirs.is_discarded() ? std::string("not JSON") : theirs.dump()) +
            "; this run: " + identity.dump() + "); give another output directory");
      }
    } else if (held.status().code() != StatusCode::kNotFound) {
      return held.status();
    } else {
      for (const auto& entry : fs::directory_iterator(dir)) {
        return InvalidArgument("generate.output " + dir + " holds " +
                               entry.path().filename().string() +
                               ", which weft generate did not write; give an empty directory");
      }
      WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(marker, identity.dump() + "\n"));
    }
    for (const char* kind : {"part", "rejected"}) {
      WEFT_RETURN_IF_ERROR(out.Recover(kind, ids));
    }
    return out;
  }

  Output(Output&&) = default;
  ~Output() {
    for (auto& [kind, shard] : shards_) {
      if (shard.fd >= 0) ::close(shard.fd);
    }
  }

  bool Done(size_t prompt, uint32_t sample) const {
    return sample < done_[prompt].size() && done_[prompt][sample];
  }
  uint64_t records() const { return records_; }
  uint64_t kept() const { return kept_; }

  // Appends the records (each one line of JSON, with `prompt` and `sample` its place) to the
  // current shard of `kind`; Sync makes them durable.
  Status Add(const char* kind, size_t prompt, uint32_t sample, const std::string& line) {
    Shard& shard = shards_[kind];
    if (shard.fd >= 0 && shard.records >= shard_records_) {  // full: the next shard
      WEFT_RETURN_IF_ERROR(Flush(kind, shard));
      ::close(shard.fd);
      shard.fd = -1;
    }
    if (shard.fd < 0) {
      if (shard.records >= shard_records_) {
        ++shard.number;
        shard.records = 0;
      }
      const std::string path = ShardPath(kind, shard.number);
      shard.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (shard.fd < 0) return Unavailable("cannot open " + path + ": " + ErrnoText());
      WEFT_RETURN_IF_ERROR(SyncParentDirectory(path));
    }
    shard.pending += line;
    shard.pending += '\n';
    ++shard.records;
    done_[prompt][sample] = true;
    ++records_;
    if (std::string(kind) == "part") ++kept_;
    return Status::Ok();
  }

  // Writes what was added and fsyncs it: after this, the records survive any crash.
  Status Sync() {
    for (auto& [kind, shard] : shards_) WEFT_RETURN_IF_ERROR(Flush(kind.c_str(), shard));
    return Status::Ok();
  }

 private:
  struct Shard {
    int number = 0;
    uint64_t records = 0;  // in the current file
    int fd = -1;
    std::string pending;  // added, not written yet
  };

  Output() = default;

  std::string ShardPath(const std::string& kind, int number) const {
    char name[64];
    std::snprintf(name, sizeof(name), "%s-%05d.jsonl", kind.c_str(), number);
    return dir_ + "/" + name;
  }

  Status Flush(const char* kind, Shard& shard) {
    size_t at = 0;
    while (at < shard.pending.size()) {
      const ssize_t n = ::write(shard.fd, shard.pending.data() + at, shard.pending.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return Unavailable("writing " + ShardPath(kind, shard.number) + ": " + ErrnoText());
      at += static_cast<size_t>(n);
    }
    shard.pending.clear();
    if (shard.fd >= 0 && ::fsync(shard.fd) != 0)
      return Unavailable("fsync of " + ShardPath(kind, shard.number) + ": " + ErrnoText());
    return Status::Ok();
  }

  // Reads the shards of `kind` back: every complete line must be a record of this run's prompts,
  // each (prompt, sample) once; a last line the crash left without its end is cut off (it was
  // never acknowledged), anything else damaged is refused, naming the file and line.
  Status Recover(const std::string& kind, const std::map<std::string, size_t>& ids) {
    Shard& shard = shards_[kind];
    for (int number = 0;; ++number) {
      const std::string path = ShardPath(kind, number);
      if (!fs::exists(path)) break;
      std::ifstream in(path, std::ios::binary);
      std::string line;
      uint64_t line_number = 0, complete_bytes = 0, records = 0;
      while (std::getline(in, line)) {
        ++line_number;
        if (in.eof()) {
          // No newline: the write a crash cut short. Only the last shard may end so.
          if (fs::exists(ShardPath(kind, number + 1)))
            return DataLoss(path + ":" + std::to_string(line_number) +
                            ": a record cut short in a shard that is not the last");
          std::printf("%s:%llu: a record cut short by a crash; cut off and generated again\n",
                      path.c_str(), static_cast<unsigned long long>(line_number));
          fs::resize_file(path, complete_bytes);
          break;
        }
        complete_bytes += line.size() + 1;
        const std::string where = path + ":" + std::to_string(line_number);
        const Json record = Json::parse(line, nullptr, false);
        if (record.is_discarded() || !record.is_object() || !record.contains("prompt_id") ||
            !record.contains("sample") || !record["sample"].is_number_unsigned())
          return DataLoss(where + ": not a record of weft generate (damaged?)");
        auto id = ids.find(record["prompt_id"].dump());
        if (id == ids.end())
          return DataLoss(where + ": prompt id " + record["prompt_id"].dump() +
                          " is not in the dataset");
        const uint64_t sample = record["sample"].get<uint64_t>();
        if (sample >= done_[id->second].size())
          return DataLoss(where + ": sample " + std::to_string(sample) + " of prompt " +
                          record["prompt_id"].dump() + " is beyond its " +
                          std::to_string(done_[id->second].size()) + " samples");
        if (done_[id->second][sample])
          return DataLoss(where + ": prompt " + record["prompt_id"].dump() + " sample " +
                          std::to_string(sample) + " is there twice");
        done_[id->second][sample] = true;
        ++records_;
        if (kind == "part") ++kept_;
        ++records;
      }
      shard.number = number;
      shard.records = records;
    }
    return Status::Ok();
  }

  std::string dir_;
  uint64_t shard_records_ = 0;
  std::vector<std::vector<bool>> done_;
  uint64_t records_ = 0, kept_ = 0;
  std::map<std::string, Shard> shards_;
};

std::string Duration(double seconds) {
  char text[32];
  if (seconds < 120) {
    std::snprintf(text, sizeof(text), "%.0f s", seconds);
  } else if (seconds < 7200) {
    std::snprintf(text, sizeof(text), "%.1f min", seconds / 60);
  } else {
    std::snprintf(text, sizeof(text), "%.1f h", seconds / 3600);
  }
  return text;
}

Status RunGenerate(const std::string& config_path) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(config_path));
  const GenerateSettings& g = config.generate;
  if (!g.present) return InvalidArgument(config_path + " has no generate: section");
  WEFT_RETURN_IF_ERROR(config.NeedTokens(true, true, true));
  // The dataset: every line checked, each with an id of its own.
  WEFT_ASSIGN_OR_RETURN(std::vector<trainer_adapter::DatasetPrompt> dataset,
                        trainer_adapter::ReadPromptDataset(g.dataset));
  std::map<std::string, size_t> ids;
  std::vector<uint32_t> wanted;
  uint64_t total = 0;
  for (size_t i = 0; i < dataset.size(); ++i) {
    const trainer_adapter::DatasetPrompt& p = dataset[i];
    const std::string where = g.dataset + ":" + std::to_string(p.line);
    if (p.id.is_null())
      return InvalidArgument(where + ": the prompt has no id (weft generate needs one per line)");
    auto [at, added] = ids.emplace(p.id.dump(), i);
    if (!added)
      return InvalidArgument(where + ": id " + p.id.dump() + " is also the id of line " +
                             std::to_string(dataset[at->second].line));
    wanted.push_back(p.samples.value_or(g.samples));
    total += wanted.back();
  }
  WEFT_ASSIGN_OR_RETURN(std::string dataset_sha, FileSha256(g.dataset));

  // The run directory: kept between runs (the store holds the model), but the orchestrator starts
  // afresh: what is done is what the output holds.
  const fs::path dir = fs::absolute(config.dir);
  std::error_code error;
  if (fs::exists(dir) && !fs::is_empty(dir) && !fs::exists(dir / kRunMarker)) {
    return InvalidArgument("run.dir " + dir.string() +
                           " holds files weft generate did not write; pick another run.dir");
  }
  fs::create_directories(dir, error);
  if (error) return Internal("cannot create " + dir.string() + ": " + error.message());
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("orchestrator.journal", 0) == 0 || name == "relays" || name == "logs")
      fs::remove_all(entry.path(), error);
  }
  fs::create_directories(dir / "logs", error);
  if (config.store_uri.empty()) fs::create_directories(dir / "store", error);
  std::ofstream(dir / kRunMarker) << "made by weft generate\n";

  WEFT_ASSIGN_OR_RETURN(ModelIdentity model, PrepareModel(config, dir));
  const Json identity = {{"model", g.model},
                         {"model_digest", model.digest},
                         {"dataset_sha256", dataset_sha},
                         {"samples", g.samples},
                         {"min_reward", g.min_reward ? Json(*g.min_reward) : Json(nullptr)}};
  WEFT_ASSIGN_OR_RETURN(Output output,
                        Output::Open(g.output, identity, ids, wanted, g.shard_records));
  const uint64_t done_before = output.records();
  // What is left: each prompt's missing samples, in the dataset's order.
  std::deque<size_t> queue;
  std::vector<bool> in_flight(dataset.size(), false);
  auto missing = [&](size_t p) {
    std::vector<uint32_t> list;
    for (uint32_t s = 0; s < wanted[p]; ++s) {
      if (!output.Done(p, s)) list.push_back(s);
    }
    return list;
  };
  for (size_t p = 0; p < dataset.size(); ++p) {
    if (!missing(p).empty()) queue.push_back(p);
  }
  std::printf("weft generate %s: %llu of %llu samples already in %s; model %s (digest %s)\n",
              config_path.c_str(), static_cast<unsigned long long>(done_before),
              static_cast<unsigned long long>(total), g.output.c_str(), g.model.c_str(),
              model.digest.c_str());
  std::fflush(stdout);

  const std::string config_abs = fs::absolute(config_path).string();
  WEFT_ASSIGN_OR_RETURN(RunProcesses processes, PlanRunProcesses(config, dir, config_abs));
  std::vector<Child>& children = processes.children;
  WEFT_ASSIGN_OR_RETURN(const std::string self, ThisProgramPath());
  StopSignals stop;
  Supervisor supervisor(self, (dir / "logs").string());
  if (output.records() < total)
    WEFT_RETURN_IF_ERROR(StartRunProcesses(supervisor, children, processes.first_worker, dir));

  // Short calls: this loop also restarts the infrastructure (an orchestrator that died is restarted
  // between two calls, not after a call has waited out a long deadline).
  HttpClientOptions http;
  http.deadline = std::chrono::milliseconds(3000);
  orchestrator::OrchestratorClient client(config.orchestrator_url(),
                                          config.orchestrator.service.trainer_token, http);
  const bool tty = isatty(1);
  const auto started = Clock::now();
  std::optional<Clock::time_point> first_record;
  auto last_line = Clock::now(), last_check = Clock::now();
  uint64_t jobs_out = 0, duplicates = 0, written = 0;
  std::string failure;
  bool interrupted = false;
  while (output.records() < total) {
    if (stop.WaitFor(std::chrono::milliseconds(0))) {
      interrupted = true;
      break;
    }
    ReapRunProcesses(supervisor, children, dir, tty, &failure);
    if (!failure.empty()) break;
    // Keep jobs_ahead jobs out: one per prompt, for the samples it misses.
    std::vector<orchestrator::NewJob> jobs;
    std::vector<size_t> prompts;
    while (jobs_out + jobs.size() < g.jobs_ahead && !queue.empty() && jobs.size() < 1000) {
      const size_t p = queue.front();
      queue.pop_front();
      const std::vector<uint32_t> samples = missing(p);
      if (samples.empty() || in_flight[p]) continue;
      orchestrator::NewJob job;
      job.prompt = dataset[p].prompt;
      job.samples = static_cast<uint32_t>(samples.size());
      job.metadata = {{"p", p}, {"s", samples}};
      job.model = g.model;
      jobs.push_back(std::move(job));
      prompts.push_back(p);
    }
    if (!jobs.empty()) {
      Result<std::vector<uint64_t>> added = client.AddJobs(jobs);
      if (!added.ok()) {
        // Perhaps added (the answer was lost): the prompts are asked again only if their
        // samples do not arrive (below); a repeat is written once all the same.
        WEFT_LOG(kWarning) << "generate: adding " << jobs.size()
                           << " jobs: " << added.status().message();
      }
      for (size_t p : prompts) in_flight[p] = true;
      jobs_out += prompts.size();
    }
    Result<std::vector<orchestrator::Delivered>> batch =
        client.TakeBatch(256, std::chrono::milliseconds(1000));
    if (!batch.ok()) {
      WEFT_LOG(kWarning) << "generate: taking a batch: " << batch.status().message();
      continue;
    }
    for (const orchestrator::Delivered& d : *batch) {
      const std::string what = "job " + std::to_string(d.group.job);
      const Json meta = Json::parse(d.metadata, nullptr, false);
      if (meta.is_discarded() || !meta.is_object() || !meta.contains("p") ||
          !meta["p"].is_number_unsigned() || meta["p"].get<uint64_t>() >= dataset.size() ||
          !meta.contains("s") || !meta["s"].is_array()) {
        WEFT_LOG(kError) << "generate: " << what << " is not one of this run's; skipped";
        continue;
      }
      const size_t p = meta["p"].get<size_t>();
      Result<trainer_adapter::ReceivedGroup> group = trainer_adapter::ParseGroup(d, 0);
      if (!group.ok() || group->samples.size() != meta["s"].size()) {
        WEFT_LOG(kError) << "generate: " << what << ": "
                         << (group.ok() ? "its samples do not match its job"
                                        : group.status().message())
                         << "; the prompt is asked again";
      } else {
        for (size_t i = 0; i < group->samples.size(); ++i) {
          const trainer_adapter::ReceivedSample& s = group->samples[i];
          const auto sample = meta["s"][i].get<uint32_t>();
          if (output.Done(p, sample)) {
            ++duplicates;  // a batch handed out again, or a job added twice
            continue;
          }
          const bool keep = !g.min_reward || (s.reward && *s.reward >= *g.min_reward);
          Json record = {{"prompt_id", dataset[p].id},
                         {"sample", sample},
                         {"model", g.model},
                         {"model_digest", model.digest},
                         {"model_version", d.group.version_start},
                         {"prompt", dataset[p].prompt},
                         {"tokens", s.tokens},
                         {"text", s.text ? Json(*s.text) : Json(nullptr)},
                         {"reward", s.reward ? Json(*s.reward) : Json(nullptr)}};
          if (!keep) record.erase("tokens");
          WEFT_RETURN_IF_ERROR(
              output.Add(keep ? "part" : "rejected", p, sample,
                         record.dump(-1, ' ', false, Json::error_handler_t::replace)));
          ++written;
        }
      }
      if (in_flight[p]) {
        in_flight[p] = false;
        --jobs_out;
      }
      if (!missing(p).empty()) queue.push_back(p);
    }
    // Durable before the next request acknowledges the batch.
    WEFT_RETURN_IF_ERROR(output.Sync());
    if (written > 0 && !first_record) first_record = Clock::now();
    // Jobs the orchestrator no longer holds (given up after their attempts, or added by a request
    // whose answer was lost and that never arrived): their prompts are asked again.
    if (Clock::now() - last_check > std::chrono::seconds(10) && jobs_out > 0) {
      last_check = Clock::now();
      Result<orchestrator::wire::StatusPage> status = client.GetStatus();
      if (status.ok() && status->jobs.queued + status->jobs.leased + status->trajectories.buffered +
                                 status->trajectories.outstanding ==
                             0) {
        WEFT_LOG(kWarning) << "generate: " << jobs_out
                           << " jobs are not at the orchestrator; asking for their prompts again";
        for (size_t p = 0; p < dataset.size(); ++p) {
          if (in_flight[p]) {
            in_flight[p] = false;
            queue.push_back(p);
          }
        }
        jobs_out = 0;
      }
    }
    if (Clock::now() - last_line >= std::chrono::seconds(tty ? 1 : 5)) {
      last_line = Clock::now();
      const double elapsed =
          first_record ? std::chrono::duration<double>(Clock::now() - *first_record).count() : 0;
      const double rate = elapsed > 0 ? static_cast<double>(written) / elapsed : 0;
      const uint64_t left = total - output.records();
      const std::string eta = rate > 0 ? Duration(static_cast<double>(left) / rate) : "-";
      std::printf(
          "%s[%5.0fs] %llu/%llu samples (%.1f%%), %.1f samples/s, ETA %s%s", tty ? "\r\033[K" : "",
          std::chrono::duration<double>(Clock::now() - started).count(),
          static_cast<unsigned long long>(output.records()), static_cast<unsigned long long>(total),
          100.0 * static_cast<double>(output.records()) / static_cast<double>(total), rate,
          eta.c_str(), tty ? "" : "\n");
      std::fflush(stdout);
    }
  }
  if (tty) std::printf("\n");
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const double steady =
      first_record ? std::chrono::duration<double>(Clock::now() - *first_record).count() : 0;
  if (output.records() == total) (void)client.AcknowledgeBatches();
  StopWorkers(supervisor, children, processes.first_worker);
  StopInfrastructure(supervisor, children, processes.first_worker);
  Json restarts = Json::object();
  for (const Child& c : children) {
    if (c.restarts > 0) restarts[c.name] = c.restarts;
  }
  const Json report = {{"config", config_abs},
                       {"output", fs::absolute(g.output).string()},
                       {"model", g.model},
                       {"model_digest", model.digest},
                       {"model_version", model.version},
                       {"completed", output.records() == total},
                       {"samples_total", total},
                       {"samples_before", done_before},
                       {"samples_written", written},
                       {"records_kept", output.kept()},
                       {"records_rejected", output.records() - output.kept()},
                       {"duplicates_skipped", duplicates},
                       {"seconds", seconds},
                       {"samples_per_second",
                        steady > 0 ? Json(static_cast<double>(written) / steady) : Json(nullptr)},
                       {"restarts", restarts}};
  WEFT_RETURN_IF_ERROR(
      WriteTextFileAtomic((dir / "generate-report.json").string(), report.dump(2) + "\n"));
  std::printf(
      "%llu of %llu samples in %s (%llu kept, %llu rejected); %llu written in %.1f s "
      "(%.1f samples/s once the first arrived), %llu repeats skipped; report: %s\n",
      static_cast<unsigned long long>(output.records()), static_cast<unsigned long long>(total),
      g.output.c_str(), static_cast<unsigned long long>(output.kept()),
      static_cast<unsigned long long>(output.records() - output.kept()),
      static_cast<unsigned long long>(written), seconds,
      steady > 0 ? static_cast<double>(written) / steady : 0.0,
      static_cast<unsigned long long>(duplicates), (dir / "generate-report.json").string().c_str());
  if (interrupted)
    return Unavailable("interrupted; what was written stays, and running again resumes");
  if (!failure.empty()) return Internal(failure);
  return Status::Ok();
}

}  // namespace

void RegisterGenerate(CLI::App& app, Action* action) {
  auto config = std::make_shared<std::string>();
  CLI::App* g = app.add_subcommand(
      "generate",
      "Generate a dataset with a fixed model on the run's fleet: every (prompt, sample) of a "
      "JSONL dataset written once to sharded JSONL; run again to resume (its generate: section)");
  g->add_option("config", *config, "the run's YAML config")->required()->check(CLI::ExistingFile);
  g->callback([config, action] { *action = [config] { return RunGenerate(*config); }; });
}

}  // namespace weft::cli
