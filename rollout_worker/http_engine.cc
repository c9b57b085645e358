#include "rollout_worker/http_engine.h"

#include <algorithm>
#include <charconv>

#include <cstdlib>

#include "common/concurrent.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/yaml_fields.h"

namespace weft::rollout_worker {
namespace {

using Clock = std::chrono::steady_clock;

// Requests one sample may take: continued after aborts, or sent again after a switch whose place
// is unknown.
constexpr int kMaxRounds = 64;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::optional<uint64_t> ParseVersion(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// Appends `tokens` generated at `version` to a completion, opening a segment when the version
// changes.
void Append(Completion& c, const std::vector<int>& tokens, const std::vector<float>& logprobs,
            size_t from, size_t to, uint64_t version) {
  if (from >= to) return;
  if (c.segments.empty() || c.segments.back().first != version)
    c.segments.emplace_back(version, c.tokens.size());
  c.tokens.insert(c.tokens.end(), tokens.begin() + from, tokens.begin() + to);
  c.logprobs.insert(c.logprobs.end(), logprobs.begin() + from, logprobs.begin() + to);
}

}  // namespace

struct HttpEngine::Replica {
  enum class State { kDown, kReady, kPausing };
  std::unique_ptr<ReplicaApi> api;
  State state = State::kDown;  // down until it is loaded with a version
  std::optional<uint64_t> version;
  uint64_t epoch = 0;  // counts pauses: a request that sees it change overlapped one
  int in_flight = 0;
  ReplicaStats stats;
  bool retired = false;  // gone from urls_file: no requests, no loads, not counted
  std::string refused;  // why it answers but is not loaded (an engine weft cannot drive), once said
  std::string unprobed;  // why its logprobs could not be probed, once said
};

Status HttpEngine::Usable(Replica& r, const ReplicaInfo& info) {
  if (info.logprobs == LogprobsKind::kUnknown) {
    MutexLock lock(mutex_);
    if (r.unprobed != info.logprobs_probe) {
      r.unprobed = info.logprobs_probe;
      WEFT_LOG(kWarning) << "engine replica " << r.api->url()
                         << ": could not tell whether its logprobs are at temperature 1, as the "
                            "trainer needs them ("
                         << info.logprobs_probe << ")";
    }
  }
  return kind_->check(r.api->url(), info, options_.pause_mode);
}

Result<std::unique_ptr<HttpEngine>> HttpEngine::Create(HttpEngineOptions options) {
  WEFT_ASSIGN_OR_RETURN(const EngineApi* kind, FindEngineApi(options.api));
  if (options.pause_mode.empty()) options.pause_mode = kind->pause_modes.front();
  WEFT_RETURN_IF_ERROR(kind->CheckPauseModeName(options.pause_mode, "pause mode"));
  if (options.urls.empty() && !options.urls_file.empty()) {
    WEFT_ASSIGN_OR_RETURN(options.urls, ReadReplicaUrls(options.urls_file));
    if (options.urls.empty())
      return InvalidArgument(options.urls_file + " lists no engine URL: a worker needs replicas");
  }
  if (options.urls.empty()) return InvalidArgument("no engine URL: a worker needs its replicas");
  if (options.checkpoint_dir.empty())
    return InvalidArgument("no served checkpoint directory for the engine to load from");
  if (options.max_paused < 1) return InvalidArgument("max_paused must be at least 1");
  std::unique_ptr<HttpEngine> engine(new HttpEngine(options));
  engine->kind_ = kind;
  for (const std::string& url : options.urls) {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Replica> r, engine->MakeReplica(url));
    for (const auto& other : engine->replicas_) {
      if (other->api->url() == r->api->url())
        return InvalidArgument("engine URL " + url + " appears twice");
    }
    engine->replicas_.push_back(std::move(r));
  }
  engine->monitor_ = std::thread([e = engine.get()] { e->MonitorLoop(); });
  return engine;
}

Result<std::unique_ptr<HttpEngine::Replica>> HttpEngine::MakeReplica(const std::string& url) const {
  ReplicaOptions replica;
  replica.url = url;
  while (!replica.url.empty() && replica.url.back() == '/') replica.url.pop_back();
  replica.api_key = options_.api_key;
  replica.request_timeout = options_.request_timeout;
  replica.control_timeout = options_.control_timeout;
  replica.load_timeout = options_.load_timeout;
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaApi> api, MakeReplicaApi(*kind_, replica));
  auto r = std::make_unique<Replica>();
  r->api = std::move(api);
  r->stats.url = r->api->url();
  return r;
}

std::vector<HttpEngine::Replica*> HttpEngine::Serving() const {
  MutexLock lock(mutex_);
  std::vector<Replica*> serving;
  for (const auto& r : replicas_) {
    if (!r->retired) serving.push_back(r.get());
  }
  return serving;
}

Result<std::vector<std::string>> ReadReplicaUrls(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(std::string text,
                        ReadTextFile(path, 1 << 20, "the engine's replica URL file"));
  std::vector<std::string> urls;
  size_t line_number = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") + 1 - first);
    while (!line.empty() && line.back() == '/') line.pop_back();
    const std::string where = path + ":" + std::to_string(line_number);
    if (line.rfind("http://", 0) != 0 && line.rfind("https://", 0) != 0)
      return InvalidArgument(where + ": '" + line + "' is not an http:// or https:// URL");
    if (std::find(urls.begin(), urls.end(), line) != urls.end())
      return InvalidArgument(where + ": " + line + " appears twice");
    urls.push_back(line);
  }
  return urls;
}

void HttpEngine::ReadUrlsFile() {
  Result<std::vector<std::string>> listed = ReadReplicaUrls(options_.urls_file);
  if (!listed.ok()) {
    // The set stays as it was (a launcher may be rewriting the file); said once per error.
    if (urls_file_error_ != listed.status().message()) {
      urls_file_error_ = listed.status().message();
      WEFT_LOG(kWarning) << "engine replicas unchanged: " << urls_file_error_;
    }
    return;
  }
  urls_file_error_.clear();
  std::vector<std::unique_ptr<Replica>> added;
  {
    MutexLock lock(mutex_);
    for (const auto& r : replicas_) {
      const bool listed_now =
          std::find(listed->begin(), listed->end(), r->api->url()) != listed->end();
      if (!r->retired && !listed_now) {
        r->retired = true;
        r->state = Replica::State::kDown;
        WEFT_LOG(kInfo) << "engine replica " << r->api->url() << " is no longer listed in "
                        << options_.urls_file << ": it gets no more requests";
      }
    }
  }
  for (const std::string& url : *listed) {
    bool known = false;
    {
      MutexLock lock(mutex_);
      for (const auto& r : replicas_) known = known || (!r->retired && r->api->url() == url);
    }
    if (known) continue;
    Result<std::unique_ptr<Replica>> made = MakeReplica(url);
    if (!made.ok()) {
      WEFT_LOG(kWarning) << "engine replica " << url << ": " << made.status().message();
      continue;
    }
    WEFT_LOG(kInfo) << "engine replica " << url << " is listed in " << options_.urls_file
                    << ": it is loaded with the current version before it gets requests";
    added.push_back(std::move(*made));
  }
  MutexLock lock(mutex_);
  for (auto& r : added) replicas_.push_back(std::move(r));
  changed_.notify_all();
}

HttpEngine::HttpEngine(HttpEngineOptions options)
    : options_(std::move(options)), checkpoint_(options_.checkpoint_dir) {
  if (options_.flush_mapped_writes)
    checkpoint_.set_flush_mapped_writes(*options_.flush_mapped_writes);
}

HttpEngine::~HttpEngine() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

Status HttpEngine::Stage(const sync::ServedModel& model, uint64_t version) {
  MutexLock load(load_mutex_);
  if (!model_checked_) {
    // Before anything is loaded: every replica that answers must serve this model (names, shapes,
    // dtypes), read from the directory it was started from.
    Status last = Unavailable("no replica answers");
    std::vector<std::string> paths;
    for (Replica* r : Serving()) {
      Status healthy = r->api->Health();
      Result<std::string> found = healthy.ok() ? r->api->ModelPath() : Result<std::string>(healthy);
      if (!found.ok()) {
        last = found.status();
        continue;
      }
      // An engine that cannot work with weft (too old a release, a setting) is refused here,
      // before anything is loaded, with what it lacks.
      Result<ReplicaInfo> info = r->api->Info();
      if (!info.ok() && info.status().code() == StatusCode::kInvalidArgument) return info.status();
      if (info.ok()) WEFT_RETURN_IF_ERROR(Usable(*r, *info));
      if (std::find(paths.begin(), paths.end(), *found) == paths.end()) {
        WEFT_RETURN_IF_ERROR(
            CheckModelDirectory(*found, model).WithContext("replica " + r->api->url()));
        paths.push_back(*found);
      }
    }
    if (paths.empty())
      return Unavailable("cannot check the engine's model: " + std::string(last.message()));
    template_dir_ = paths.front();
    model_checked_ = true;
  }
  // Until the write completes the directory holds no version (an in-place write that fails leaves
  // it mixed): nothing is loaded from it meanwhile.
  dir_version_.reset();
  WEFT_RETURN_IF_ERROR(checkpoint_.Write(model, template_dir_)
                           .WithContext("writing version " + std::to_string(version) +
                                        " into the served checkpoint directory"));
  dir_version_ = version;
  staged_ = version;
  MutexLock lock(mutex_);
  stats_.last_bytes_written = checkpoint_.last_bytes_written();
  return Status::Ok();
}

Result<std::shared_ptr<NewWeightsFile>> HttpEngine::NewDirectoryFile(
    const std::vector<sync::TensorSpec>& specs) {
  MutexLock load(load_mutex_);
  return checkpoint_.NewFile(specs);
}

void HttpEngine::ForgetDirectory() {
  MutexLock load(load_mutex_);
  dir_version_.reset();
  checkpoint_.WillChangeInPlace();
}

Result<int64_t> HttpEngine::Reload(Replica& r, uint64_t version) {
  const std::string& mode = options_.pause_mode;
  {
    MutexLock lock(mutex_);
    r.state = Replica::State::kPausing;  // no new requests from here on
    if (mode == "wait") {
      // Let this replica's requests finish first, so that none overlaps the pause.
      changed_.wait_for(lock.native(), options_.control_timeout,
                        [&]() REQUIRES(mutex_) { return r.in_flight == 0 || stopping_; });
    }
    ++r.epoch;
  }
  const std::string version_text = std::to_string(version);
  const Clock::time_point start = Clock::now();
  Status done = r.api->Pause(mode);
  if (done.ok()) {
    const Clock::time_point load_start = Clock::now();
    done = r.api->Load(checkpoint_.dir(), version_text);
    // (The client's own clock may give up a little before this one has counted it all.)
    if (!done.ok() && Clock::now() - load_start >= options_.load_timeout * 9 / 10) {
      done = Timeout(r.api->url() + ": the load of version " + version_text +
                     " did not finish within engine.load_timeout (" +
                     std::to_string(options_.load_timeout.count()) +
                     " ms): " + std::string(done.message()));
    }
  }
  // Always, even after a pause that failed (it may have taken effect): a replica left paused holds
  // every request and fails its health route.
  Status resumed = r.api->Resume();
  if (done.ok()) done = resumed;
  const Clock::duration pause = Clock::now() - start;
  if (done.ok()) {
    Result<std::string> serving = r.api->WeightVersion();
    if (!serving.ok()) {
      done = serving.status();
    } else if (*serving != version_text) {
      done = Internal(r.api->url() + " reports weight version '" + *serving + "' after loading " +
                      version_text);
    }
  }
  MutexLock lock(mutex_);
  if (!done.ok()) {
    r.state = Replica::State::kDown;
    ++r.stats.failures;
    r.stats.failed_pause_ms += Milliseconds(pause);
    changed_.notify_all();
    return done;
  }
  r.state = Replica::State::kReady;
  r.version = version;
  ++r.stats.loads;
  r.stats.last_pause_ms = Milliseconds(pause);
  r.stats.max_pause_ms = std::max(r.stats.max_pause_ms, r.stats.last_pause_ms);
  r.stats.total_pause_ms += r.stats.last_pause_ms;
  changed_.notify_all();
  return std::chrono::duration_cast<std::chrono::microseconds>(pause).count();
}

Result<int64_t> HttpEngine::Commit() {
  MutexLock load(load_mutex_);
  if (!staged_ || dir_version_ != staged_) return InvalidArgument("nothing staged to commit");
  const uint64_t version = *staged_;
  const Clock::time_point start = Clock::now();
  // Every replica that is up; a down one is loaded by the monitor once it answers again.
  // Every replica that is up, those not serving first (they lose nothing by pausing); a down one
  // is loaded by the monitor once it answers again.
  std::vector<Replica*> targets, serving;
  for (Replica* r : Serving()) {
    bool down;
    {
      MutexLock lock(mutex_);
      down = r->state == Replica::State::kDown;
    }
    if (!down) {
      serving.push_back(r);
    } else if (r->api->Health().ok()) {
      targets.push_back(r);
    }
  }
  targets.insert(targets.end(), serving.begin(), serving.end());
  if (targets.empty()) return Unavailable("no replica of the engine answers its health check");
  // At most max_paused at once, and with several replicas up never all of them: the others keep
  // generating.
  size_t parallel = static_cast<size_t>(options_.max_paused);
  if (targets.size() > 1) parallel = std::min(parallel, targets.size() - 1);
  parallel = std::max<size_t>(1, std::min(parallel, targets.size()));
  std::mutex results_mutex;
  size_t next = 0, loaded = 0;
  int64_t max_pause = 0;
  Status first_error = Status::Ok();
  auto run = [&] {
    while (true) {
      Replica* r;
      {
        std::lock_guard<std::mutex> lock(results_mutex);
        if (next == targets.size()) return;
        r = targets[next++];
      }
      Result<int64_t> pause = Reload(*r, version);
      std::lock_guard<std::mutex> lock(results_mutex);
      if (pause.ok()) {
        ++loaded;
        max_pause = std::max(max_pause, *pause);
        WEFT_LOG(kInfo) << "engine replica " << r->api->url() << " serves version " << version
                        << " (pause " << *pause / 1000.0 << " ms)";
      } else {
        WEFT_LOG(kWarning) << "engine replica " << r->api->url() << " did not load version "
                           << version << ": " << pause.status().message();
        if (first_error.ok()) first_error = pause.status();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < parallel; ++i) threads.emplace_back(run);
  run();
  for (std::thread& t : threads) t.join();
  if (loaded == 0) {
    return Unavailable("no replica loaded version " + std::to_string(version) + ": " +
                       std::string(first_error.message()));
  }
  staged_.reset();
  MutexLock lock(mutex_);
  committed_ = version;
  ++stats_.commits;
  stats_.last_commit_ms = Milliseconds(Clock::now() - start);
  stats_.max_commit_ms = std::max(stats_.max_commit_ms, stats_.last_commit_ms);
  changed_.notify_all();
  return max_pause;
}

std::optional<uint64_t> HttpEngine::version() const {
  MutexLock lock(mutex_);
  return committed_;
}

EngineHealth HttpEngine::Health() const {
  MutexLock lock(mutex_);
  EngineHealth health;
  health.replicas = 0;
  health.ready_replicas = 0;
  for (const auto& r : replicas_) {
    if (r->retired) continue;
    ++health.replicas;
    health.ready_replicas += r->state == Replica::State::kReady;
    health.loading_replicas += r->state == Replica::State::kPausing;
    health.paused_ms_total += r->stats.total_pause_ms + r->stats.failed_pause_ms;
    orchestrator::ReplicaReport& each = health.each.emplace_back();
    each.url = r->api->url();
    each.state = r->state == Replica::State::kReady     ? "ready"
                 : r->state == Replica::State::kPausing ? "loading"
                                                        : "down";
    each.version = r->version;
    each.loads = r->stats.loads;
    each.failures = r->stats.failures;
    each.last_pause_ms = r->stats.last_pause_ms;
    each.paused_ms_total = r->stats.total_pause_ms + r->stats.failed_pause_ms;
  }
  health.ok = health.ready_replicas > 0;
  health.detail = std::to_string(health.ready_replicas) + " of " + std::to_string(health.replicas) +
                  " " + options_.api + " replicas ready" +
                  (committed_ ? " (version " + std::to_string(*committed_) + ")" : "");
  return health;
}

HttpEngineStats HttpEngine::stats() const {
  MutexLock lock(mutex_);
  HttpEngineStats stats = stats_;
  for (const auto& r : replicas_) {
    ReplicaStats s = r->stats;
    s.ready = r->state == Replica::State::kReady && !r->retired;
    s.retired = r->retired;
    s.version = r->version;
    stats.replicas.push_back(s);
  }
  return stats;
}

HttpEngine::Replica* HttpEngine::Acquire(Clock::time_point deadline, uint64_t* epoch,
                                         uint64_t* version) {
  MutexLock lock(mutex_);
  Replica* chosen = nullptr;
  bool all_down = false;
  changed_.wait_until(lock.native(), deadline, [&]() REQUIRES(mutex_) {
    if (stopping_) return true;
    all_down = true;
    for (const auto& r : replicas_) {
      if (r->retired) continue;
      all_down = all_down && r->state == Replica::State::kDown;
      if (r->state != Replica::State::kReady || !r->version) continue;
      if (chosen == nullptr || r->in_flight < chosen->in_flight) chosen = r.get();
    }
    // A replica loading a version will be back in a moment: wait for it. With every replica down
    // there is nothing to wait for: the job goes back to the queue at once.
    return chosen != nullptr || all_down;
  });
  if (stopping_ || chosen == nullptr) return nullptr;
  ++chosen->in_flight;
  ++chosen->stats.requests;
  *epoch = chosen->epoch;
  *version = *chosen->version;
  return chosen;
}

void HttpEngine::Release(Replica& r, bool failed, const Status& status) {
  MutexLock lock(mutex_);
  --r.in_flight;
  if (failed && r.state == Replica::State::kReady) {
    // It could not be reached (or answered 5xx): no more requests until the monitor finds it
    // healthy again.
    r.state = Replica::State::kDown;
    ++r.stats.failures;
    r.api->ForgetInfo();  // it may come back as another build
    WEFT_LOG(kWarning) << "engine replica " << r.api->url() << " is down: " << status.message();
  }
  changed_.notify_all();
}

namespace {

// The engine's per-token versions as (version, first token) runs over the output tokens, or
// nullopt when they do not tile the output (the first starts at 0, starts increase, versions are
// numbers).
std::optional<std::vector<std::pair<uint64_t, size_t>>> SpansOf(const ReplicaOutput& o) {
  std::vector<std::pair<uint64_t, size_t>> runs;
  for (size_t i = 0; i < o.spans.size(); ++i) {
    const std::optional<uint64_t> v = ParseVersion(o.spans[i].first);
    const uint64_t start = o.spans[i].second;
    if (!v || (i == 0 && start != 0) || (i > 0 && start <= runs.back().second) ||
        start > o.tokens.size()) {
      return std::nullopt;
    }
    runs.emplace_back(*v, static_cast<size_t>(start));
  }
  if (runs.empty()) return std::nullopt;
  return runs;
}

}  // namespace

template <typename T>
Result<HttpEngine::Answer<T>> HttpEngine::OnReplica(
    int attempts, const std::function<Result<T>(ReplicaApi&)>& call) {
  for (int attempt = 1;; ++attempt) {
    Answer<T> answer;
    uint64_t epoch = 0;
    Replica* r = Acquire(Clock::now() + options_.request_timeout, &epoch, &answer.version);
    if (r == nullptr) {
      return Unavailable("no " + options_.api + " replica can take a request (" + Health().detail +
                         ")");
    }
    Result<T> out = call(*r->api);
    {
      MutexLock lock(mutex_);
      answer.pauses = r->epoch - epoch;
    }
    const bool unreachable = !out.ok() && out.status().code() == StatusCode::kUnavailable;
    Release(*r, unreachable, out.status());
    if (!out.ok()) {
      // Another replica (or this one, back) may take it; a refusal is final.
      if (unreachable && attempt < attempts) continue;
      return out.status();
    }
    answer.value = std::move(*out);
    answer.url = r->api->url();
    return answer;
  }
}

Result<Completion> HttpEngine::GenerateOne(const Prompt& prompt, const Sampling& sampling) {
  Completion c;
  Prompt current = prompt;
  Sampling s = sampling;
  std::vector<int> prompt_ids = prompt.tokens;  // known for a text prompt once the engine says
  std::optional<uint64_t> last_version;         // of the last request that produced the sample
  for (int round = 0; round < kMaxRounds; ++round) {
    WEFT_ASSIGN_OR_RETURN(Answer<std::vector<ReplicaOutput>> answer,
                          OnReplica<std::vector<ReplicaOutput>>(
                              4, [&](ReplicaApi& api) { return api.Generate(current, s, 1); }));
    const uint64_t version = answer.version;
    ReplicaOutput& o = answer.value.front();
    if (o.logprobs.size() != o.tokens.size())
      return Internal(answer.url + " returned logprobs for other tokens than it generated");
    if (prompt_ids.empty() && !o.prompt_tokens.empty()) prompt_ids = o.prompt_tokens;
    const std::string version_text = std::to_string(version);
    if (answer.pauses == 0 && !o.aborted) {
      // No pause overlapped it: all of it is the version the replica served.
      Append(c, o.tokens, o.logprobs, 0, o.tokens.size(), version);
      last_version = version;
    } else if (std::optional<std::vector<std::pair<uint64_t, size_t>>> runs = SpansOf(o)) {
      // The engine says which version produced which tokens.
      for (size_t i = 0; i < runs->size(); ++i) {
        const size_t to = i + 1 < runs->size() ? (*runs)[i + 1].second : o.tokens.size();
        Append(c, o.tokens, o.logprobs, (*runs)[i].second, to, (*runs)[i].first);
      }
      last_version = runs->back().first;
    } else if (o.aborted && answer.pauses == 1 &&
               (o.version.empty() || o.version == version_text)) {
      // Cut short by the one pause it overlapped, before that pause's load (the engine's own
      // version at the abort, when it reports one, agrees): every token is the version it started
      // at.
      Append(c, o.tokens, o.logprobs, 0, o.tokens.size(), version);
      last_version = version;
    } else {
      // It ran across a weight switch, and where is unknown: the same request again (what was
      // appended before it stays).
      MutexLock lock(mutex_);
      ++stats_.regenerated;
      continue;
    }
    c.text += o.text;
    const bool stopped = s.stop_token >= 0 && !c.tokens.empty() && c.tokens.back() == s.stop_token;
    const int produced = static_cast<int>(o.tokens.size());
    if (!o.aborted || stopped || produced >= s.max_tokens) {
      if (c.segments.empty()) c.segments.emplace_back(*last_version, 0);  // no tokens at all
      c.version_start = c.version_end = c.segments.front().first;
      for (const auto& seg : c.segments) {
        c.version_start = std::min(c.version_start, seg.first);
        c.version_end = std::max(c.version_end, seg.first);
      }
      return c;
    }
    // Aborted at a pause: go on from the tokens so far, on the new weights.
    MutexLock lock(mutex_);
    if (prompt_ids.empty()) {
      // A text prompt whose token ids the engine did not return: start the sample over.
      c = Completion();
      current = prompt;
      s = sampling;
      ++stats_.regenerated;
      continue;
    }
    current = Prompt{prompt_ids, ""};
    current.tokens.insert(current.tokens.end(), c.tokens.begin(), c.tokens.end());
    s.max_tokens -= produced;
    s.seed = s.seed * 0x9E3779B97F4A7C15ull + c.tokens.size();
    ++stats_.continued;
  }
  // Weights switched under it every time (versions coming faster than a generation ends).
  return Unavailable("no sample could be generated within one weight version in " +
                     std::to_string(kMaxRounds) + " tries");
}

Result<std::vector<Completion>> HttpEngine::GenerateMany(const Prompt& prompt,
                                                         const Sampling& sampling, int n) {
  Result<Answer<std::vector<ReplicaOutput>>> answer = OnReplica<std::vector<ReplicaOutput>>(
      1, [&](ReplicaApi& api) { return api.Generate(prompt, sampling, n); });
  const auto others = [&] {
    const EngineHealth health = Health();
    return health.ready_replicas + health.loading_replicas > 0;
  };
  if (!answer.ok() && answer.status().code() == StatusCode::kUnavailable && others()) {
    // That replica is down: sample by sample, on the others.
    answer = Answer<std::vector<ReplicaOutput>>{std::vector<ReplicaOutput>(static_cast<size_t>(n)),
                                                0, 1, ""};
  }
  if (!answer.ok()) return answer.status();
  std::vector<Completion> completions;
  for (size_t i = 0; i < answer->value.size(); ++i) {
    const ReplicaOutput& o = answer->value[i];
    if (answer->pauses > 0 || o.aborted) {
      // Across a pause: this sample goes through the one-sample path, which tags it exactly.
      Sampling one = sampling;
      one.seed = sampling.seed + i;
      WEFT_ASSIGN_OR_RETURN(Completion c, GenerateOne(prompt, one));
      completions.push_back(std::move(c));
      continue;
    }
    if (o.logprobs.size() != o.tokens.size())
      return Internal(answer->url + " returned logprobs for other tokens than it generated");
    Completion c;
    Append(c, o.tokens, o.logprobs, 0, o.tokens.size(), answer->version);
    if (c.segments.empty()) c.segments.emplace_back(answer->version, 0);
    c.text = o.text;
    c.version_start = c.version_end = answer->version;
    completions.push_back(std::move(c));
  }
  return completions;
}

Result<std::vector<Completion>> HttpEngine::Generate(const std::vector<Prompt>& prompts,
                                                     const Sampling& sampling) {
  if (prompts.empty()) return std::vector<Completion>();
  const bool same = std::all_of(prompts.begin(), prompts.end(), [&](const Prompt& p) {
    return p.tokens == prompts[0].tokens && p.text == prompts[0].text;
  });
  if (options_.n_per_request && same && prompts.size() > 1)
    return GenerateMany(prompts[0], sampling, static_cast<int>(prompts.size()));
  std::vector<Completion> completions(prompts.size());
  WEFT_RETURN_IF_ERROR(
      ForEachConcurrently(prompts.size(), options_.max_parallel_requests, [&](size_t i) -> Status {
        Sampling one = sampling;
        one.seed = sampling.seed + i;
        Result<Completion> c = GenerateOne(prompts[i], one);
        if (!c.ok()) return c.status().WithContext("sample " + std::to_string(i));
        completions[i] = std::move(*c);
        return Status::Ok();
      }));
  return completions;
}

Result<std::pair<uint64_t, std::vector<float>>> HttpEngine::ScoreOne(
    const std::vector<int>& prompt, const std::vector<int>& target) {
  for (int round = 0; round < kMaxRounds; ++round) {
    WEFT_ASSIGN_OR_RETURN(
        Answer<ReplicaOutput> answer,
        OnReplica<ReplicaOutput>(4, [&](ReplicaApi& api) { return api.Score(prompt, target); }));
    const ReplicaOutput& o = answer.value;
    if (answer.pauses == 0 && !o.aborted &&
        (o.version.empty() || o.version == std::to_string(answer.version))) {
      if (o.logprobs.size() != target.size()) {
        return Internal(answer.url + " scored " + std::to_string(o.logprobs.size()) + " of " +
                        std::to_string(target.size()) + " tokens");
      }
      return std::make_pair(answer.version, std::move(answer.value.logprobs));
    }
    // Weights may have changed while the prompt was read: scored again, at one version.
    MutexLock lock(mutex_);
    ++stats_.rescored;
  }
  return Unavailable("no target could be scored within one weight version in " +
                     std::to_string(kMaxRounds) + " tries");
}

Result<Engine::Scores> HttpEngine::Score(const std::vector<int>& prompt,
                                         const std::vector<std::vector<int>>& targets) {
  std::vector<std::pair<uint64_t, std::vector<float>>> scored(targets.size());
  std::vector<size_t> pending(targets.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  for (int round = 0; round < kMaxRounds && !pending.empty(); ++round) {
    WEFT_RETURN_IF_ERROR(ForEachConcurrently(
        pending.size(), options_.max_parallel_requests, [&](size_t k) -> Status {
          const size_t i = pending[k];
          Result<std::pair<uint64_t, std::vector<float>>> one = ScoreOne(prompt, targets[i]);
          if (!one.ok()) return one.status().WithContext("target " + std::to_string(i));
          scored[i] = std::move(*one);
          return Status::Ok();
        }));
    // Every target at the newest version any was scored at: the others again.
    uint64_t newest = 0;
    for (const auto& s : scored) newest = std::max(newest, s.first);
    std::vector<size_t> older;
    for (size_t i = 0; i < scored.size(); ++i) {
      if (scored[i].first != newest) older.push_back(i);
    }
    MutexLock lock(mutex_);
    stats_.scored += pending.size();
    stats_.rescored += older.size();
    pending = std::move(older);
  }
  if (!pending.empty()) {
    return Unavailable("the targets could not all be scored at one weight version in " +
                       std::to_string(kMaxRounds) + " rounds");
  }
  Scores scores;
  if (targets.empty()) {
    const std::optional<uint64_t> current = version();
    if (!current) return Unavailable("the engine has no weights yet");
    scores.version = *current;
  } else {
    scores.version = scored.front().first;
  }
  for (auto& s : scored) scores.logprobs.push_back(std::move(s.second));
  return scores;
}

void HttpEngine::CheckReplica(Replica& r) {
  {
    MutexLock lock(mutex_);
    if (r.state == Replica::State::kPausing) return;  // a reload is under way
  }
  const Status healthy = r.api->Health();
  bool down;
  {
    MutexLock lock(mutex_);
    if (r.state == Replica::State::kPausing) return;
    if (!healthy.ok()) {
      if (r.state == Replica::State::kReady) {
        r.state = Replica::State::kDown;
        ++r.stats.failures;
        WEFT_LOG(kWarning) << "engine replica " << r.api->url()
                           << " fails its health check: " << healthy.message();
        changed_.notify_all();
      }
      down = true;
      r.api->ForgetInfo();  // it may come back as another build
    } else {
      down = r.state == Replica::State::kDown;
    }
  }
  if (!healthy.ok()) {
    // A replica left paused (a pause whose answer was lost) fails its health route while it holds
    // requests: resuming it (harmless otherwise, and quick: a hung replica does not hold up the
    // monitor) lets it answer again. Never while a stage or commit may be pausing it.
    if (!load_mutex_.TryLock()) return;
    MutexLock load(load_mutex_, std::adopt_lock);  // held through the resume
    bool still_down = false;
    {
      MutexLock lock(mutex_);
      still_down = r.state == Replica::State::kDown;
    }
    if (still_down) (void)r.api->Resume(/*quick=*/true);
    return;
  }
  if (!down) return;
  // Back (or up for the first time since a commit): load what the directory holds unless it
  // serves that already. A stage or commit in progress will see to it instead.
  if (!load_mutex_.TryLock()) return;
  MutexLock load(load_mutex_, std::adopt_lock);
  std::optional<uint64_t> version;
  {
    MutexLock lock(mutex_);
    version = committed_;
  }
  // Nothing committed yet, or the directory does not hold the committed version (it is ahead of
  // it, or a write failed half-way).
  if (!version || staged_ || dir_version_ != version) return;
  Result<std::string> serving = r.api->WeightVersion();
  // Serving the version already (it was taken out by a failed request or resume): resumed, in case
  // a load left it paused, it takes requests again.
  if (serving.ok() && *serving == std::to_string(*version) && r.api->Resume().ok()) {
    MutexLock lock(mutex_);
    r.state = Replica::State::kReady;
    r.version = version;
    WEFT_LOG(kInfo) << "engine replica " << r.api->url() << " is back, serving version "
                    << *version;
    changed_.notify_all();
    return;
  }
  // It may have come back as another build: one weft cannot drive stays out, said once.
  Result<ReplicaInfo> info = r.api->Info();
  Status usable = info.status();
  if (info.ok()) usable = Usable(r, *info);
  if (!usable.ok()) {
    if (usable.code() == StatusCode::kInvalidArgument && r.refused != usable.message()) {
      r.refused = usable.message();
      WEFT_LOG(kError) << "engine replica " << r.api->url()
                       << " answers but is not loaded: " << usable.message();
    }
    return;
  }
  r.refused.clear();
  Result<int64_t> pause = Reload(r, *version);
  if (pause.ok()) {
    WEFT_LOG(kInfo) << "engine replica " << r.api->url() << " is back; loaded version " << *version
                    << " (pause " << *pause / 1000.0 << " ms)";
  } else {
    WEFT_LOG(kWarning) << "engine replica " << r.api->url() << " answers but did not load version "
                       << *version << ": " << pause.status().message();
  }
}

void HttpEngine::MonitorLoop() {
  while (true) {
    {
      MutexLock lock(mutex_);
      changed_.wait_for(lock.native(), options_.health_interval,
                        [&]() REQUIRES(mutex_) { return stopping_; });
      if (stopping_) return;
    }
    if (!options_.urls_file.empty()) ReadUrlsFile();
    for (Replica* r : Serving()) {
      {
        MutexLock lock(mutex_);
        if (stopping_) return;
      }
      CheckReplica(*r);
    }
  }
}

Result<HttpEngineOptions> ParseEngineSection(const YAML::Node& engine, const std::string& api,
                                             const std::string& cluster,
                                             const std::vector<std::string>& urls) {
  HttpEngineOptions options;
  options.api = api;
  options.urls = urls;
  if (engine && !engine.IsMap()) return InvalidArgument("engine: must be a map of settings");
  if (engine) {
    WEFT_RETURN_IF_ERROR(
        CheckKeys(engine, "engine",
                  {"urls", "urls_file", "checkpoint_dir", "copy", "flush", "pause", "max_paused",
                   "n_per_request", "max_parallel_requests", "api_key_env", "request_timeout",
                   "control_timeout", "load_timeout", "health_interval"}));
    if (options.urls.empty() && engine["urls"]) {
      const YAML::Node list = engine["urls"];
      if (!list.IsSequence()) return InvalidArgument("engine.urls must be a list of URLs");
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].IsScalar())
          return InvalidArgument("engine.urls[" + std::to_string(i) + "] must be a URL");
        options.urls.push_back(list[i].Scalar());
      }
    }
    WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "checkpoint_dir", &options.checkpoint_dir));
    if (engine["urls"] && engine["urls_file"]) {
      return InvalidArgument(
          "engine.urls and engine.urls_file are both given: the replicas come from one of them");
    }
    // A worker's own URLs replace the file as they replace engine.urls.
    if (urls.empty())
      WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "urls_file", &options.urls_file));
    std::string copy = "file";
    WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "copy", &copy));
    if (copy != "file" && copy != "memory")
      return InvalidArgument("engine.copy: '" + copy + "' is not file or memory");
    options.copy_in_file = copy == "file";
    std::string flush = "auto";
    WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "flush", &flush));
    if (flush == "always" || flush == "never") {
      options.flush_mapped_writes = flush == "always";
    } else if (flush != "auto") {
      return InvalidArgument("engine.flush: '" + flush + "' is not auto, always or never");
    }
    WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "pause", &options.pause_mode));
    uint64_t max_paused = static_cast<uint64_t>(options.max_paused);
    WEFT_RETURN_IF_ERROR(ReadUnsigned(engine, "engine", "max_paused", &max_paused));
    if (max_paused < 1 || max_paused > 1024)
      return InvalidArgument("engine.max_paused must be between 1 and 1024");
    options.max_paused = static_cast<int>(max_paused);
    uint64_t parallel = static_cast<uint64_t>(options.max_parallel_requests);
    WEFT_RETURN_IF_ERROR(ReadUnsigned(engine, "engine", "max_parallel_requests", &parallel));
    if (parallel < 1 || parallel > 4096)
      return InvalidArgument("engine.max_parallel_requests must be between 1 and 4096");
    options.max_parallel_requests = static_cast<int>(parallel);
    if (const YAML::Node n = engine["n_per_request"]) {
      if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "false"))
        return InvalidArgument("engine.n_per_request must be true or false");
      options.n_per_request = n.Scalar() == "true";
    }
    std::string key_env;
    WEFT_RETURN_IF_ERROR(ReadString(engine, "engine", "api_key_env", &key_env));
    if (!key_env.empty()) {
      const char* key = std::getenv(key_env.c_str());
      if (key == nullptr || *key == '\0') {
        return InvalidArgument("engine.api_key_env names " + key_env +
                               ", which is not set in the worker's environment");
      }
      options.api_key = key;
    }
    auto duration = [&](const char* key, std::chrono::milliseconds* out) -> Status {
      std::chrono::microseconds value = *out;
      WEFT_RETURN_IF_ERROR(ReadDuration(engine, "engine", key, &value));
      if (value.count() <= 0)
        return InvalidArgument(std::string("engine.") + key + " must be positive");
      *out = std::chrono::duration_cast<std::chrono::milliseconds>(value);
      return Status::Ok();
    };
    WEFT_RETURN_IF_ERROR(duration("request_timeout", &options.request_timeout));
    WEFT_RETURN_IF_ERROR(duration("control_timeout", &options.control_timeout));
    WEFT_RETURN_IF_ERROR(duration("load_timeout", &options.load_timeout));
    WEFT_RETURN_IF_ERROR(duration("health_interval", &options.health_interval));
  }
  if (options.urls.empty() && options.urls_file.empty()) {
    return InvalidArgument("the " + api +
                           " engine needs its replicas' URLs: engine.urls, engine.urls_file, the "
                           "region's worker_engines, or weft worker --engine-url");
  }
  if (options.checkpoint_dir.empty()) {
    return InvalidArgument(
        "engine.checkpoint_dir is needed: the directory the worker writes each version into and "
        "the engine loads from");
  }
  for (std::string* path : {&options.checkpoint_dir, &options.urls_file}) {
    for (size_t at = path->find("{cluster}"); at != std::string::npos;
         at = path->find("{cluster}", at + cluster.size())) {
      path->replace(at, 9, cluster);
    }
  }
  WEFT_ASSIGN_OR_RETURN(const EngineApi* kind, FindEngineApi(api));
  if (!options.pause_mode.empty())
    WEFT_RETURN_IF_ERROR(kind->CheckPauseModeName(options.pause_mode, "engine.pause"));
  return options;
}

}  // namespace weft::rollout_worker
