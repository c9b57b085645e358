#include "orchestrator/service.h"

#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/json_fields.h"
#include "common/logging.h"

namespace weft::orchestrator {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using http::Request;
using http::Responder;
using http::Response;

enum class Role { kNone, kWorker, kTrainer, kAdmin };

// A long poll waiting for leases or a batch.
struct Waiter {
  bool batch = false;
  std::string cluster;
  uint32_t max = 0;
  uint64_t lease_request = 0;  // a lease request's id (0: none)
  std::chrono::steady_clock::time_point deadline;
  Request request;  // for the answer's HTTP version
  Responder respond;
};

Json LeasesJson(const std::vector<Lease>& leases) {
  Json list = Json::array();
  for (const Lease& l : leases) {
    list.push_back({{"job", l.job},
                    {"attempt", l.attempt},
                    {"deadline_us", l.deadline},
                    {"min_version", l.min_version},
                    {"prompt", l.prompt},
                    {"samples", l.samples}});
  }
  return Json{{"leases", list}};
}

Json BatchJson(const Batch& batch, std::optional<uint64_t> latest) {
  Json list = Json::array();
  for (const Delivered& d : batch.items) {
    const Submission& s = d.submission;
    list.push_back({{"job", s.job},
                    {"attempt", s.attempt},
                    {"cluster", s.cluster},
                    {"version_start", s.version_start},
                    {"version_end", s.version_end},
                    {"segments", s.segments},
                    {"tokens", s.tokens},
                    {"stale", d.stale},
                    {"trajectories", Json::parse(s.payload, nullptr, false)}});
  }
  return Json{{"batch", batch.id},
              {"redelivered", batch.redelivered},
              {"trajectories", list},
              {"latest_version", latest ? Json(*latest) : Json(nullptr)}};
}

// The body as a JSON object, or the 400 to send.
Result<Json> Body(const Request& request) {
  Json body = Json::parse(request.body().begin(), request.body().end(), nullptr, false);
  if (body.is_discarded()) return InvalidArgument("the request body is not valid JSON");
  if (!body.is_object()) return InvalidArgument("the request body is not a JSON object");
  return body;
}

// {"max": n, "wait_ms": n} of a long poll, with defaults, and for leases {"request": id}.
Status PollFields(const Json& body, const std::string& where, uint32_t* max,
                  std::chrono::milliseconds* wait, uint64_t* request = nullptr,
                  uint64_t least = 1) {
  std::set<std::string> optional = {"max", "wait_ms"};
  if (request != nullptr) optional.insert("request");
  WEFT_RETURN_IF_ERROR(CheckFields(body, where, {}, optional));
  if (request != nullptr && body.contains("request")) {
    WEFT_ASSIGN_OR_RETURN(*request, GetUnsigned(body, "request", where));
  }
  if (body.contains("max")) {
    WEFT_ASSIGN_OR_RETURN(uint64_t value, GetUnsigned(body, "max", where));
    if (value < least || value > 100000)
      return InvalidArgument(where + ".max must be " + std::to_string(least) + " to 100000");
    *max = static_cast<uint32_t>(value);
  }
  if (body.contains("wait_ms")) {
    WEFT_ASSIGN_OR_RETURN(uint64_t value, GetUnsigned(body, "wait_ms", where));
    *wait = std::chrono::milliseconds(std::min<uint64_t>(value, 3'600'000));
  }
  return Status::Ok();
}

Result<Submission> ParseSubmission(const Json& body) {
  const std::string where = "submission";
  WEFT_RETURN_IF_ERROR(CheckFields(body, where,
                                   {"job", "attempt", "cluster", "version_start", "version_end",
                                    "segments", "tokens", "trajectories"}));
  Submission s;
  WEFT_ASSIGN_OR_RETURN(s.job, GetUnsigned(body, "job", where));
  WEFT_ASSIGN_OR_RETURN(uint64_t attempt, GetUnsigned(body, "attempt", where));
  if (attempt > 1'000'000) return InvalidArgument(where + ".attempt is out of range");
  s.attempt = static_cast<uint32_t>(attempt);
  WEFT_ASSIGN_OR_RETURN(s.cluster, GetString(body, "cluster", where));
  WEFT_ASSIGN_OR_RETURN(s.version_start, GetUnsigned(body, "version_start", where));
  WEFT_ASSIGN_OR_RETURN(s.version_end, GetUnsigned(body, "version_end", where));
  WEFT_ASSIGN_OR_RETURN(s.tokens, GetUnsigned(body, "tokens", where));
  const Json& segments = body["segments"];
  if (!segments.is_array() || segments.empty() || segments.size() > 100000) {
    return InvalidArgument(where +
                           ".segments must be a non-empty array of [version, first_token] pairs");
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    const Json& pair = segments[i];
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
        !pair[1].is_number_unsigned()) {
      return InvalidArgument(where + ".segments[" + std::to_string(i) +
                             "] is not a [version, first_token] pair");
    }
    s.segments.emplace_back(pair[0].get<uint64_t>(), pair[1].get<uint64_t>());
  }
  s.payload = body["trajectories"].dump();
  return s;
}

}  // namespace

Json SyncReportJson(const SyncReport& r) {
  return Json{{"bytes_downloaded", r.bytes_downloaded},
              {"pulls", r.pulls},
              {"keyframe_pulls", r.keyframe_pulls},
              {"digest_mismatches", r.digest_mismatches},
              {"commits", r.commits},
              {"max_pause_ms", r.max_pause_ms},
              {"first_version", r.first_version ? Json(*r.first_version) : Json(nullptr)},
              {"newest_version", r.newest_version ? Json(*r.newest_version) : Json(nullptr)},
              {"digest", r.digest}};
}

Result<SyncReport> ParseSyncReport(const Json& json) {
  SyncReport r;
  const std::string where = "heartbeat.sync";
  WEFT_RETURN_IF_ERROR(
      CheckFields(json, where, {},
                  {"bytes_downloaded", "pulls", "keyframe_pulls", "digest_mismatches", "commits",
                   "max_pause_ms", "first_version", "newest_version", "digest"}));
  if (json.contains("digest")) {
    Result<std::string> digest = GetString(json, "digest", where);
    if (!digest.ok() || digest->size() > 64 ||
        digest->find_first_not_of("0123456789abcdef") != std::string::npos) {
      return InvalidArgument(where + ".digest is not a hex digest of at most 64 digits");
    }
    r.digest = *digest;
  }
  for (auto [field, value] : {std::pair{"first_version", &r.first_version},
                              std::pair{"newest_version", &r.newest_version}}) {
    if (json.contains(field) && !json[field].is_null()) {
      WEFT_ASSIGN_OR_RETURN(uint64_t version, GetUnsigned(json, field, where));
      *value = version;
    }
  }
  for (auto [field, value] :
       {std::pair{"bytes_downloaded", &r.bytes_downloaded}, std::pair{"pulls", &r.pulls},
        std::pair{"keyframe_pulls", &r.keyframe_pulls},
        std::pair{"digest_mismatches", &r.digest_mismatches}, std::pair{"commits", &r.commits}}) {
    if (json.contains(field)) {
      WEFT_ASSIGN_OR_RETURN(*value, GetUnsigned(json, field, where));
    }
  }
  if (json.contains("max_pause_ms")) {
    if (!json["max_pause_ms"].is_number() || json["max_pause_ms"].get<double>() < 0) {
      return InvalidArgument(where + ".max_pause_ms is not a non-negative number");
    }
    r.max_pause_ms = json["max_pause_ms"].get<double>();
  }
  return r;
}

Micros WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct OrchestratorService::Impl {
  Impl(DurableCore& core, ServiceOptions options) : core(core), options(std::move(options)) {}

  Role RoleOf(const Request& request) const {
    if (http::BearerMatches(request, options.admin_token)) return Role::kAdmin;
    if (http::BearerMatches(request, options.worker_token)) return Role::kWorker;
    if (http::BearerMatches(request, options.trainer_token)) return Role::kTrainer;
    return Role::kNone;
  }

  void Handle(Request request, Responder respond);
  Response Route(const Request& request, Role role, Responder* respond);
  Json StatusJson() const;
  std::string Metrics() const;
  void Park(Waiter waiter) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      waiters.push_back(std::move(waiter));
    }
    Wake();
  }
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      woken = true;
    }
    changed.notify_one();
  }
  // Ticks the core and retries the parked long polls, until stopped.
  void Poll();
  // One try at a waiter: true when it was answered.
  bool Try(Waiter& waiter, bool expired);

  DurableCore& core;
  ServiceOptions options;
  std::unique_ptr<http::HttpServer> server;
  std::mutex mutex;
  std::condition_variable changed;
  bool woken = false;
  bool stopping = false;
  std::list<Waiter> waiters;
  std::thread poller;
  // Compaction runs beside the poller (it writes a snapshot file) and never twice at once.
  std::thread compactor;
  std::atomic<bool> compacting{false};
  // What each cluster last reported of its weight sync (cumulative counters sent with heartbeats;
  // kept in memory only: the workers send them again after a restart).
  mutable std::mutex sync_mutex;
  std::map<std::string, SyncReport> sync_reports;
};

bool OrchestratorService::Impl::Try(Waiter& waiter, bool expired) {
  const Micros now = WallMicros();
  if (waiter.batch) {
    Result<Batch> batch = core.TakeBatch(now, waiter.max);
    if (!batch.ok()) {
      waiter.respond(http::ErrorResponse(waiter.request, batch.status()));
      return true;
    }
    if (batch->items.empty() && !expired) return false;
    const auto latest = core.Inspect([](const OrchestratorCore& c) { return c.latest_version(); });
    waiter.respond(
        http::JsonResponse(waiter.request, bhttp::status::ok, BatchJson(*batch, latest)));
    return true;
  }
  Result<std::vector<Lease>> leases =
      core.RequestLeases(now, waiter.cluster, waiter.max, waiter.lease_request);
  if (!leases.ok()) {
    waiter.respond(http::ErrorResponse(waiter.request, leases.status()));
    return true;
  }
  if (leases->empty() && !expired) return false;
  waiter.respond(http::JsonResponse(waiter.request, bhttp::status::ok, LeasesJson(*leases)));
  return true;
}

void OrchestratorService::Impl::Poll() {
  auto next_tick = std::chrono::steady_clock::now();
  while (true) {
    std::list<Waiter> batch;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait_until(lock, next_tick, [&] { return woken || stopping; });
      if (stopping) break;
      woken = false;
      batch.swap(waiters);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_tick) {
      weft::Status ticked = core.Tick(WallMicros());
      if (!ticked.ok()) {
        WEFT_LOG(kError) << "orchestrator tick failed: " << ticked.message();
      }
      next_tick = now + options.tick_interval;
      if (!compacting.load() && core.NeedsCompaction()) {
        if (compactor.joinable()) compactor.join();
        compacting = true;
        compactor = std::thread([this] {
          weft::Status compacted = core.Compact();
          if (!compacted.ok()) {
            WEFT_LOG(kError) << "orchestrator journal compaction failed: " << compacted.message();
          }
          compacting = false;
        });
      }
    }
    // Only waiters that could get something now (or whose wait is over) are tried: a try costs a
    // journaled core event, and a thousand parked workers must not cost a thousand per wake.
    const auto [queued, deliverable] = core.Inspect([](const OrchestratorCore& c) {
      return std::make_pair(c.queued_jobs() > 0, c.buffered() > 0 || c.outstanding() > 0);
    });
    for (auto it = batch.begin(); it != batch.end();) {
      const bool expired = now >= it->deadline;
      if (!expired && !(it->batch ? deliverable : queued)) {
        ++it;
        continue;
      }
      if (Try(*it, expired)) {
        it = batch.erase(it);
      } else {
        ++it;
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    waiters.splice(waiters.begin(), batch);  // the older waiters first
  }
  // Stopping: answer whoever still waits, with nothing.
  std::lock_guard<std::mutex> lock(mutex);
  for (Waiter& waiter : waiters)
    waiter.respond(
        http::ErrorResponse(waiter.request, Unavailable("the orchestrator is stopping")));
  waiters.clear();
}

void OrchestratorService::Impl::Handle(Request request, Responder respond) {
  const Role role = RoleOf(request);
  Response response = Route(request, role, &respond);
  if (respond) respond(std::move(response));  // empty when a long poll took it
}

Response OrchestratorService::Impl::Route(const Request& request, Role role, Responder* respond) {
  const std::string target(request.target());
  const auto method = request.method();
  auto error = [&](const weft::Status& status) { return http::ErrorResponse(request, status); };
  auto ok = [&](const Json& body) { return http::JsonResponse(request, bhttp::status::ok, body); };
  if (target.find_first_of("?%#") != std::string::npos)
    return error(InvalidArgument("query strings and escapes are not supported"));
  if (target == "/livez") return ok(Json{{"ok", true}});
  if (target == "/readyz")
    return ok(Json{{"ready", true}, {"events_replayed", core.events_replayed()}});
  if (target == "/metrics") {
    Response response(bhttp::status::ok, request.version());
    response.set(bhttp::field::content_type, "text/plain; version=0.0.4");
    const std::string text = Metrics();
    response.body().assign(text.begin(), text.end());
    response.prepare_payload();
    return response;
  }
  if (role == Role::kNone) {
    return http::ErrorResponse(
        request, bhttp::status::unauthorized,
        "this endpoint needs a worker, trainer or admin token (Authorization: Bearer ...)");
  }
  auto needs = [&](Role wanted) -> std::optional<Response> {
    if (role == wanted || role == Role::kAdmin) return std::nullopt;
    return http::ErrorResponse(request, bhttp::status::forbidden,
                               std::string("this endpoint needs the ") +
                                   (wanted == Role::kWorker ? "worker" : "trainer") +
                                   " or admin token");
  };
  if (target == "/v1/status") {
    if (method != bhttp::verb::get)
      return http::ErrorResponse(request, bhttp::status::method_not_allowed, "status takes GET");
    return ok(StatusJson());
  }
  const Micros now = WallMicros();
  const std::string clusters = "/v1/clusters";
  if (target == clusters && method == bhttp::verb::post) {
    if (auto refused = needs(Role::kWorker)) return *refused;
    Result<Json> body = Body(request);
    if (!body.ok()) return error(body.status());
    weft::Status valid = CheckFields(*body, "cluster", {"cluster", "region", "capacity"});
    if (!valid.ok()) return error(valid);
    Result<std::string> id = GetString(*body, "cluster", "cluster");
    Result<std::string> region = GetString(*body, "region", "cluster");
    Result<uint64_t> capacity = GetUnsigned(*body, "capacity", "cluster");
    for (const weft::Status& s : {id.status(), region.status(), capacity.status()}) {
      if (!s.ok()) return error(s);
    }
    if (*capacity > 1'000'000)
      return error(InvalidArgument("cluster.capacity must be 1 to 1000000"));
    weft::Status done = core.Register(now, *id, *region, static_cast<uint32_t>(*capacity));
    if (!done.ok()) return error(done);
    Wake();
    return ok(Json{{"cluster", *id}, {"registered", true}});
  }
  if (target.rfind(clusters + "/", 0) == 0) {
    if (auto refused = needs(Role::kWorker)) return *refused;
    std::string rest = target.substr(clusters.size() + 1);
    const size_t slash = rest.find('/');
    const std::string id = rest.substr(0, slash);
    const std::string action = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (id.empty()) return error(InvalidArgument("no cluster id in the path"));
    if (action.empty() && method == bhttp::verb::delete_) {
      weft::Status done = core.Deregister(now, id);
      if (!done.ok()) return error(done);
      Wake();
      return ok(Json{{"cluster", id}, {"deregistered", true}});
    }
    if (method != bhttp::verb::post)
      return http::ErrorResponse(request, bhttp::status::method_not_allowed,
                                 "cluster actions take POST (or DELETE to leave)");
    Result<Json> body = Body(request);
    if (!body.ok()) return error(body.status());
    if (action == "heartbeat") {
      weft::Status valid = CheckFields(*body, "heartbeat", {"ready_version"}, {"sync"});
      if (!valid.ok()) return error(valid);
      std::optional<SyncReport> reported;
      if (body->contains("sync")) {
        Result<SyncReport> parsed = ParseSyncReport((*body)["sync"]);
        if (!parsed.ok()) return error(parsed.status());
        reported = *parsed;
      }
      std::optional<uint64_t> ready;
      if (!(*body)["ready_version"].is_null()) {
        Result<uint64_t> version = GetUnsigned(*body, "ready_version", "heartbeat");
        if (!version.ok())
          return error(
              InvalidArgument("heartbeat.ready_version is not a non-negative integer or null"));
        ready = *version;
      }
      weft::Status done = core.Heartbeat(now, id, ready);
      if (!done.ok()) return error(done);
      if (reported) {
        std::lock_guard<std::mutex> lock(sync_mutex);
        sync_reports[id] = *reported;
      }
      Wake();
      return ok(Json{{"cluster", id}, {"ok", true}});
    }
    if (action == "leases") {
      uint32_t max = 1;
      uint64_t lease_request = 0;
      std::chrono::milliseconds wait(0);
      weft::Status valid = PollFields(*body, "leases", &max, &wait, &lease_request);
      if (!valid.ok()) return error(valid);
      Result<std::vector<Lease>> leases = core.RequestLeases(now, id, max, lease_request);
      if (!leases.ok()) return error(leases.status());
      if (!leases->empty() || wait.count() == 0) return ok(LeasesJson(*leases));
      Park({false, id, max, lease_request,
            std::chrono::steady_clock::now() + std::min(wait, options.max_wait), request,
            std::move(*respond)});
      *respond = nullptr;
      return Response();
    }
    if (action == "drain") {
      weft::Status valid = CheckFields(*body, "drain", {}, {"jobs"});
      if (!valid.ok()) return error(valid);
      std::vector<uint64_t> jobs;
      if (body->contains("jobs")) {
        if (!(*body)["jobs"].is_array())
          return error(InvalidArgument("drain.jobs is not an array of job ids"));
        for (const Json& job : (*body)["jobs"]) {
          if (!job.is_number_unsigned())
            return error(InvalidArgument("drain.jobs holds something that is not a job id"));
          jobs.push_back(job.get<uint64_t>());
        }
      }
      weft::Status done = core.Drain(now, id, jobs);
      if (!done.ok()) return error(done);
      Wake();
      return ok(Json{{"cluster", id}, {"draining", true}});
    }
    return http::ErrorResponse(request, bhttp::status::not_found,
                               "no such cluster action: " + action);
  }
  if (target == "/v1/submissions") {
    if (auto refused = needs(Role::kWorker)) return *refused;
    if (method != bhttp::verb::post)
      return http::ErrorResponse(request, bhttp::status::method_not_allowed,
                                 "submissions take POST");
    Result<Json> body = Body(request);
    if (!body.ok()) return error(body.status());
    Result<Submission> submission = ParseSubmission(*body);
    if (!submission.ok()) return error(submission.status());
    // Answered from the journal's thread once durable: no server thread waits on the disk.
    // (A job done moves from leased to buffered: no admission room opens, no poll to wake.)
    core.SubmitAsync(
        now, std::move(*submission),
        [request, answer = std::move(*respond)](Result<SubmitResult> result) {
          if (!result.ok()) return answer(http::ErrorResponse(request, result.status()));
          answer(http::JsonResponse(
              request, bhttp::status::ok,
              Json{{"result", *result == SubmitResult::kAccepted ? "accepted" : "duplicate"}}));
        });
    *respond = nullptr;
    return Response();
  }
  if (target == "/v1/versions" || target == "/v1/jobs" || target == "/v1/batches") {
    if (auto refused = needs(Role::kTrainer)) return *refused;
    if (method != bhttp::verb::post)
      return http::ErrorResponse(request, bhttp::status::method_not_allowed,
                                 target + " takes POST");
    Result<Json> body = Body(request);
    if (!body.ok()) return error(body.status());
    if (target == "/v1/versions") {
      weft::Status valid = CheckFields(*body, "version", {"version"});
      if (!valid.ok()) return error(valid);
      Result<uint64_t> version = GetUnsigned(*body, "version", "version");
      if (!version.ok()) return error(version.status());
      weft::Status done = core.AnnounceVersion(now, *version);
      if (!done.ok()) return error(done);
      Wake();
      return ok(Json{{"version", *version}});
    }
    if (target == "/v1/jobs") {
      weft::Status valid = CheckFields(*body, "jobs", {"prompts"});
      if (!valid.ok()) return error(valid);
      const Json& prompts = (*body)["prompts"];
      if (!prompts.is_array() || prompts.size() > 100000)
        return error(InvalidArgument("jobs.prompts must be an array of at most 100000 prompts"));
      std::vector<std::pair<std::string, uint32_t>> list;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const std::string where = "jobs.prompts[" + std::to_string(i) + "]";
        weft::Status fields = CheckFields(prompts[i], where, {"prompt"}, {"samples"});
        if (!fields.ok()) return error(fields);
        uint64_t samples = 1;
        if (prompts[i].contains("samples")) {
          Result<uint64_t> n = GetUnsigned(prompts[i], "samples", where);
          if (!n.ok() || *n == 0 || *n > 4096)
            return error(InvalidArgument(where + ".samples must be 1 to 4096"));
          samples = *n;
        }
        // A prompt is token ids or text, kept as the JSON the trainer sent.
        list.emplace_back(prompts[i]["prompt"].dump(), static_cast<uint32_t>(samples));
      }
      Result<std::vector<uint64_t>> ids = core.AddJobs(now, list);
      if (!ids.ok()) return error(ids.status());
      Wake();
      return ok(Json{{"jobs", *ids}});
    }
    uint32_t max = 64;
    std::chrono::milliseconds wait(0);
    std::optional<uint64_t> ack;
    if (body->contains("ack")) {
      if (!(*body)["ack"].is_null()) {
        Result<uint64_t> id = GetUnsigned(*body, "ack", "batches");
        if (!id.ok()) return error(InvalidArgument("batches.ack is not a batch id or null"));
        ack = *id;
      }
      body->erase("ack");
    }
    weft::Status valid = PollFields(*body, "batches", &max, &wait, nullptr, 0);
    if (!valid.ok()) return error(valid);
    if (max == 0) wait = std::chrono::milliseconds(0);  // an acknowledgement only
    Result<Batch> batch =
        core.TakeBatch(now, max, ack);  // the ack takes effect even if the poll then waits
    if (!batch.ok()) return error(batch.status());
    if (!batch->items.empty() || wait.count() == 0) {
      Wake();  // admission room freed
      return ok(BatchJson(
          *batch, core.Inspect([](const OrchestratorCore& c) { return c.latest_version(); })));
    }
    Park({true, "", max, 0, std::chrono::steady_clock::now() + std::min(wait, options.max_wait),
          request, std::move(*respond)});
    *respond = nullptr;
    return Response();
  }
  return http::ErrorResponse(request, bhttp::status::not_found, "no such endpoint: " + target);
}

Json OrchestratorService::Impl::StatusJson() const {
  const Micros now = WallMicros();
  std::map<std::string, SyncReport> reports;
  {
    std::lock_guard<std::mutex> lock(sync_mutex);
    reports = sync_reports;
  }
  return core.Inspect([&](const OrchestratorCore& c) {
    const Counters& n = c.counters();
    Json clusters = Json::array();
    Json regions = Json::object();
    std::map<std::string, SyncReport> region_sync;  // the regions' sums
    std::map<uint64_t, std::map<std::string, std::string>>
        digests;  // version -> digest -> a cluster
    for (const ClusterView& v : c.clusters()) {
      clusters.push_back(
          {{"id", v.id},
           {"region", v.region},
           {"capacity", v.capacity},
           {"ready_version", v.ready_version ? Json(*v.ready_version) : Json(nullptr)},
           {"state", v.gone            ? "gone"
                     : v.draining      ? "draining"
                     : v.ready_version ? "ready"
                                       : "syncing"},
           {"leases", v.leases},
           {"completed", v.completed},
           {"throughput_per_s", v.throughput},
           {"seconds_since_heartbeat", static_cast<double>(now - v.last_heartbeat) / 1e6}});
      Json& region = regions[v.region];
      if (region.is_null())
        region = {{"clusters", 0}, {"ready", 0}, {"leases", 0}, {"newest_ready_version", nullptr}};
      SyncReport& sum = region_sync[v.region];
      if (auto found = reports.find(v.id); found != reports.end()) {
        const SyncReport& r = found->second;
        clusters.back()["sync"] = SyncReportJson(r);
        sum.bytes_downloaded += r.bytes_downloaded;
        sum.pulls += r.pulls;
        sum.keyframe_pulls += r.keyframe_pulls;
        sum.digest_mismatches += r.digest_mismatches;
        sum.commits += r.commits;
        sum.max_pause_ms = std::max(sum.max_pause_ms, r.max_pause_ms);
        if (!v.gone && v.ready_version && !r.digest.empty() &&
            r.newest_version == v.ready_version) {
          digests[*v.ready_version].emplace(r.digest, v.id);
        }
      }
      region["clusters"] = region["clusters"].get<int>() + 1;
      region["leases"] = region["leases"].get<uint64_t>() + v.leases;
      if (!v.gone && v.ready_version) {
        region["ready"] = region["ready"].get<int>() + 1;
        if (region["newest_ready_version"].is_null() ||
            region["newest_ready_version"].get<uint64_t>() < *v.ready_version) {
          region["newest_ready_version"] = *v.ready_version;
        }
      }
    }
    for (const auto& [name, sum] : region_sync) regions[name]["sync"] = SyncReportJson(sum);
    // Clusters ready at the same version must serve the same state: say so loudly if not.
    std::vector<std::string> alerts = c.Alerts(now);
    for (const auto& [version, seen] : digests) {
      if (seen.size() < 2) continue;
      std::string text =
          "clusters ready at version " + std::to_string(version) + " serve different states:";
      for (const auto& [digest, cluster] : seen) text += " " + cluster + " " + digest;
      alerts.push_back(text);
    }
    Json histogram = Json::object();
    for (const auto& [version, count] : c.buffered_versions())
      histogram[std::to_string(version)] = count;
    return Json{{"run", options.run_id},
                {"latest_version", c.latest_version() ? Json(*c.latest_version()) : Json(nullptr)},
                {"admissible_version", c.admissible_version()},
                {"max_staleness", options.max_staleness},
                {"jobs",
                 {{"queued", c.queued_jobs()},
                  {"leased", c.leased_jobs()},
                  {"added", n.jobs_added},
                  {"done", n.jobs_done},
                  {"given_up", n.jobs_given_up}}},
                {"leases",
                 {{"granted", n.leases_granted},
                  {"expired", n.leases_expired},
                  {"handed_back", n.leases_handed_back},
                  {"cancelled", n.leases_cancelled}}},
                {"clusters_lost", n.clusters_lost},
                {"trajectories",
                 {{"buffered", c.buffered()},
                  {"outstanding", c.outstanding()},
                  {"accepted", n.submissions_accepted},
                  {"duplicate", n.submissions_duplicate},
                  {"rejected", n.submissions_rejected},
                  {"delivered_fresh", n.delivered_fresh},
                  {"delivered_stale", n.delivered_stale},
                  {"dropped_stale", n.dropped_stale}}},
                {"batches", {{"delivered", n.batches}, {"redelivered", n.batches_redelivered}}},
                {"buffered_by_version_start", histogram},
                {"clusters", clusters},
                {"regions", regions},
                {"alerts", alerts},
                {"journal",
                 {{"records", core.journal().records()},
                  {"syncs", core.journal().syncs()},
                  {"bytes", core.journal().size()},
                  {"generation", core.generation()},
                  {"compactions", core.compactions()},
                  {"remembered_done", c.remembered_done()}}}};
  });
}

std::string OrchestratorService::Impl::Metrics() const {
  std::ostringstream out;
  core.Inspect([&](const OrchestratorCore& c) {
    const Counters& n = c.counters();
    auto metric = [&](const char* name, const char* type, const char* help, double value) {
      out << "# HELP weft_orchestrator_" << name << " " << help << "\n# TYPE weft_orchestrator_"
          << name << " " << type << "\n"
          << "weft_orchestrator_" << name << " " << value << "\n";
    };
    metric("latest_version", "gauge", "The latest announced policy version.",
           c.latest_version() ? static_cast<double>(*c.latest_version()) : -1);
    metric("jobs_queued", "gauge", "Jobs waiting for a lease.",
           static_cast<double>(c.queued_jobs()));
    metric("jobs_leased", "gauge", "Jobs leased to clusters.",
           static_cast<double>(c.leased_jobs()));
    metric("trajectories_buffered", "gauge", "Accepted submissions waiting for the trainer.",
           static_cast<double>(c.buffered()));
    metric("jobs_added_total", "counter", "Jobs added.", static_cast<double>(n.jobs_added));
    metric("jobs_done_total", "counter", "Jobs completed.", static_cast<double>(n.jobs_done));
    metric("jobs_given_up_total", "counter", "Jobs given up after too many failed leases.",
           static_cast<double>(n.jobs_given_up));
    metric("leases_granted_total", "counter", "Leases granted.",
           static_cast<double>(n.leases_granted));
    metric("leases_expired_total", "counter", "Leases that expired or whose cluster was lost.",
           static_cast<double>(n.leases_expired));
    metric("submissions_accepted_total", "counter", "Submissions accepted.",
           static_cast<double>(n.submissions_accepted));
    metric("submissions_duplicate_total", "counter",
           "Repeated submissions acknowledged without counting.",
           static_cast<double>(n.submissions_duplicate));
    metric("submissions_rejected_total", "counter", "Submissions refused.",
           static_cast<double>(n.submissions_rejected));
    metric("trajectories_dropped_stale_total", "counter",
           "Submissions dropped as older than the staleness bound.",
           static_cast<double>(n.dropped_stale));
    metric("trajectories_delivered_total", "counter", "Submissions delivered to the trainer.",
           static_cast<double>(n.delivered_fresh + n.delivered_stale));
    metric("clusters_lost_total", "counter", "Clusters declared lost for missing heartbeats.",
           static_cast<double>(n.clusters_lost));
    out << "# HELP weft_orchestrator_cluster_ready_version The version each cluster proved it "
           "serves (-1: none).\n"
        << "# TYPE weft_orchestrator_cluster_ready_version gauge\n";
    for (const ClusterView& v : c.clusters()) {
      out << "weft_orchestrator_cluster_ready_version{cluster=\"" << v.id << "\",region=\""
          << v.region << "\"} "
          << (v.ready_version && !v.gone ? static_cast<double>(*v.ready_version) : -1) << "\n";
    }
    return 0;
  });
  std::lock_guard<std::mutex> lock(sync_mutex);
  for (auto [name, help, field] :
       {std::tuple{"cluster_sync_bytes_total",
                   "Weight bytes each cluster downloaded (as it last reported).",
                   &SyncReport::bytes_downloaded},
        std::tuple{"cluster_digest_mismatches_total",
                   "Times a cluster's served state did not match a manifest.",
                   &SyncReport::digest_mismatches}}) {
    out << "# HELP weft_orchestrator_" << name << " " << help << "\n# TYPE weft_orchestrator_"
        << name << " counter\n";
    for (const auto& [cluster, report] : sync_reports) {
      out << "weft_orchestrator_" << name << "{cluster=\"" << cluster << "\"} " << report.*field
          << "\n";
    }
  }
  return out.str();
}

Result<std::unique_ptr<OrchestratorService>> OrchestratorService::Start(DurableCore& core,
                                                                        ServiceOptions options) {
  auto impl = std::make_unique<Impl>(core, std::move(options));
  Impl* raw = impl.get();
  WEFT_ASSIGN_OR_RETURN(
      impl->server,
      http::HttpServer::Start(impl->options.server, [raw](Request request, Responder respond) {
        raw->Handle(std::move(request), std::move(respond));
      }));
  impl->poller = std::thread([raw] { raw->Poll(); });
  return std::unique_ptr<OrchestratorService>(new OrchestratorService(std::move(impl)));
}

OrchestratorService::OrchestratorService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OrchestratorService::~OrchestratorService() { Stop(); }

uint16_t OrchestratorService::port() const { return impl_->server->port(); }

void OrchestratorService::Stop() {
  if (!impl_ || !impl_->poller.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->poller.join();
  if (impl_->compactor.joinable()) impl_->compactor.join();
  impl_->server->Stop();
}

}  // namespace weft::orchestrator
