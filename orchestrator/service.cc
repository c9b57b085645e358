#include "orchestrator/service.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/hex.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/names.h"
#include "common/prometheus.h"
#include "orchestrator/dashboard.h"
#include "orchestrator/measurements.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using http::Request;
using http::Responder;
using http::Response;

enum class Role { kNone, kViewer, kWorker, kTrainer, kAdmin };

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

// The answer to a request whose event the core applied at once and the journal makes durable
// later (group commit): sent once both the answer and the journal's word are in, the answer, or
// the error that kept the event off the disk. An answer never given (a long poll that goes on
// waiting) is never sent.
class DurableAnswer : public std::enable_shared_from_this<DurableAnswer> {
 public:
  explicit DurableAnswer(const http::RequestHeader& request) : request_(request) {}
  // What the journal calls once the event is on disk.
  DurableCore::Durable OnDurable() {
    return [self = shared_from_this()](weft::Status durable) {
      self->Settle(nullptr, std::nullopt, std::move(durable));
    };
  }
  // The answer and where it goes.
  void Answer(Responder respond, Response answer) {
    Settle(std::move(respond), std::move(answer), std::nullopt);
  }

 private:
  void Settle(Responder respond, std::optional<Response> answer,
              std::optional<weft::Status> durable) EXCLUDES(mutex_) {
    Responder send;
    Response response;
    {
      MutexLock lock(mutex_);
      if (respond) {
        respond_ = std::move(respond);
        answer_ = std::move(answer);
      }
      if (durable) durable_ = std::move(durable);
      if (!respond_ || !durable_ || sent_) return;
      sent_ = true;
      send = std::move(respond_);
      response = durable_->ok() ? std::move(*answer_) : http::ErrorResponse(request_, *durable_);
    }
    send(std::move(response));
  }

  const http::RequestHeader request_;
  Mutex mutex_;
  Responder respond_ GUARDED_BY(mutex_);
  std::optional<Response> answer_ GUARDED_BY(mutex_);
  std::optional<weft::Status> durable_ GUARDED_BY(mutex_);
  bool sent_ GUARDED_BY(mutex_) = false;
};

// What the orchestrator keeps of a cluster's token: its SHA-256, in hex.
std::string CredentialOf(std::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return HexEncode(digest);
}

// A fresh cluster token: 32 random bytes, in hex.
Result<std::string> NewClusterToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return Internal("no randomness for a cluster token");
  return HexEncode(bytes);
}

// What a request's target names, decided from its header alone, and the methods it takes
// (`allow`, as an Allow header lists them; null for an unknown cluster action).
struct Endpoint {
  enum Kind { kProbe, kStatus, kRegister, kCluster, kSubmissions, kTrainer, kUnknown };
  Kind kind = kUnknown;
  std::string cluster;  // kCluster: the cluster in the path
  std::string action;   // kCluster: "" (the cluster itself), heartbeat, leases, ...
  const char* allow = nullptr;
};

Endpoint Classify(std::string_view target) {
  static constexpr std::string_view kClusters = "/v1/clusters";
  if (target == "/livez" || target == "/readyz" || target == "/metrics" || target == "/ui")
    return {Endpoint::kProbe, "", "", "GET, HEAD"};
  if (target == "/v1/status") return {Endpoint::kStatus, "", "", "GET, HEAD"};
  if (target == kClusters) return {Endpoint::kRegister, "", "", "POST"};
  if (target.starts_with(kClusters) && target.size() > kClusters.size() &&
      target[kClusters.size()] == '/') {
    const std::string_view rest = target.substr(kClusters.size() + 1);
    const size_t slash = rest.find('/');
    Endpoint e{Endpoint::kCluster, std::string(rest.substr(0, slash)),
               slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1)), nullptr};
    if (e.action.empty()) {
      e.allow = "DELETE";
    } else if (e.action == "heartbeat" || e.action == "leases" || e.action == "drain" ||
               e.action == "release" || e.action == "submissions") {
      e.allow = "POST";
    }
    return e;
  }
  if (target == "/v1/submissions") return {Endpoint::kSubmissions, "", "", "POST"};
  if (target == "/v1/versions" || target == "/v1/jobs" || target == "/v1/batches")
    return {Endpoint::kTrainer, "", "", "POST"};
  return {};
}

// The request's body as the text the wire layer decodes.
std::string_view BodyText(const Request& request) {
  return {reinterpret_cast<const char*>(request.body().data()), request.body().size()};
}

}  // namespace

Micros WallMicros() { return Env::Default().WallMicros(); }

struct OrchestratorService::Impl {
  Impl(DurableCore& core, ServiceOptions options)
      : core(core),
        options(std::move(options)),
        admin_token(this->options.admin_token),
        worker_token(this->options.worker_token),
        trainer_token(this->options.trainer_token),
        viewer_token(this->options.viewer_token),
        env(this->options.env ? *this->options.env : Env::Default()) {
    core.SetObserver(&measurements);
  }
  ~Impl() { core.SetObserver(nullptr); }
  // The core's time: the Env's wall clock.
  Micros Now() const { return env.WallMicros(); }

  // The role of the request's bearer token (one SHA-256 of it, compared with each role's).
  Role RoleOf(const http::RequestHeader& request) const {
    const http::TokenDigest given(http::BearerToken(request));
    if (admin_token.Matches(given)) return Role::kAdmin;
    if (worker_token.Matches(given)) return Role::kWorker;
    if (trainer_token.Matches(given)) return Role::kTrainer;
    if (!options.viewer_token.empty() && viewer_token.Matches(given)) return Role::kViewer;
    return Role::kNone;
  }

  void Handle(Request request, Responder respond);
  // What is decided from a request's header, before its body is read: the endpoint (404), the
  // method (405, with Allow), every token (401, 403: a role's, or a cluster's own for calls under
  // /v1/clusters/<cluster>/), the body limit (small but for submissions and jobs). Route relies on
  // it having let the request through.
  std::optional<Response> Admit(const http::RequestHeader& header, uint64_t* body_limit) const;
  // Whether the request may act for `cluster` (nullopt) or the refusal: the admin token may, the
  // token the cluster's registration handed out may, and so may the worker token for a cluster
  // registered without one (by an older orchestrator) or not registered at all (the core then
  // answers 404).
  std::optional<Response> MayActFor(const http::RequestHeader& request, Role role,
                                    const std::string& cluster) const;
  Response Route(const Request& request, Role role, Responder* respond);
  wire::StatusPage StatusPage() const;
  std::string Metrics() const;
  void Park(Waiter waiter) EXCLUDES(mutex) {
    {
      MutexLock lock(mutex);
      waiters.push_back(std::move(waiter));
    }
    Wake();
  }
  void Wake() EXCLUDES(mutex) {
    {
      MutexLock lock(mutex);
      woken = true;
    }
    changed.notify_one();
  }
  // Ticks the core and retries the parked long polls, until stopped.
  void Poll() EXCLUDES(mutex);
  // One try at a waiter: true when it was answered.
  bool Try(Waiter& waiter, bool expired);

  DurableCore& core;
  ServiceOptions options;
  // The options' tokens, hashed once.
  const http::TokenDigest admin_token, worker_token, trainer_token, viewer_token;
  Measurements measurements;
  Env& env;
  std::unique_ptr<http::HttpServer> server;
  std::atomic<const http::HttpServer*> started{nullptr};  // `server`, for /metrics once set
  Mutex mutex;
  std::condition_variable changed;
  bool woken GUARDED_BY(mutex) = false;
  bool stopping GUARDED_BY(mutex) = false;
  std::list<Waiter> waiters GUARDED_BY(mutex);
  std::thread poller;
  // Compaction runs beside the poller (it writes a snapshot file) and never twice at once.
  std::thread compactor;
  std::atomic<bool> compacting{false};
  // What each cluster last reported of its weight sync (cumulative counters sent with heartbeats;
  // kept in memory only: the workers send them again after a restart).
  mutable Mutex sync_mutex;
  std::map<std::string, SyncReport> sync_reports GUARDED_BY(sync_mutex);
};

bool OrchestratorService::Impl::Try(Waiter& waiter, bool expired) {
  const Micros now = Now();
  if (waiter.batch) {
    // Answered once durable, from the journal's thread: this thread serves the other polls.
    auto pending = std::make_shared<DurableAnswer>(waiter.request);
    Result<Batch> batch = core.TakeBatch(now, waiter.max, std::nullopt, pending->OnDurable());
    if (!batch.ok()) {
      waiter.respond(http::ErrorResponse(waiter.request, batch.status()));
      return true;
    }
    if (batch->items.empty() && !expired) return false;
    pending->Answer(
        std::move(waiter.respond),
        http::JsonTextResponse(waiter.request, bhttp::status::ok, wire::Encode(*batch)));
    return true;
  }
  Result<LeaseAnswer> leases =
      core.AnswerLeaseRequest(now, waiter.cluster, waiter.max, waiter.lease_request);
  if (!leases.ok()) {
    waiter.respond(http::ErrorResponse(waiter.request, leases.status()));
    return true;
  }
  if (leases->leases.empty() && !expired) return false;
  waiter.respond(
      http::JsonTextResponse(waiter.request, bhttp::status::ok, wire::EncodeLeases(*leases)));
  return true;
}

void OrchestratorService::Impl::Poll() {
  auto next_tick = std::chrono::steady_clock::now();
  while (true) {
    std::list<Waiter> batch;
    {
      MutexLock lock(mutex);
      changed.wait_until(lock.native(), next_tick,
                         [&]() REQUIRES(mutex) { return woken || stopping; });
      if (stopping) break;
      woken = false;
      batch.swap(waiters);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_tick) {
      const Micros tick_time = Now();
      // (Without waiting for the disk: the journal's thread syncs what the tick queued.)
      weft::Status ticked = core.Tick(tick_time, false);
      if (!ticked.ok()) {
        WEFT_LOG(kError) << "orchestrator tick failed: " << ticked.message();
      }
      measurements.Sample(tick_time,
                          core.Inspect([](const OrchestratorCore& c) { return c.counters(); }));
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
    MutexLock lock(mutex);
    waiters.splice(waiters.begin(), batch);  // the older waiters first
  }
  // Stopping: answer whoever still waits, with nothing.
  MutexLock lock(mutex);
  for (Waiter& waiter : waiters)
    waiter.respond(
        http::ErrorResponse(waiter.request, Unavailable("the orchestrator is stopping")));
  waiters.clear();
}

std::optional<Response> OrchestratorService::Impl::Admit(const http::RequestHeader& header,
                                                         uint64_t* body_limit) const {
  const std::string_view target(header.target().data(), header.target().size());
  if (target.find_first_of("?%#") != std::string_view::npos) {
    return http::ErrorResponse(header, bhttp::status::bad_request,
                               "query strings and escapes are not supported");
  }
  const Endpoint endpoint = Classify(target);
  if (endpoint.kind == Endpoint::kUnknown) {
    return http::ErrorResponse(header, bhttp::status::not_found,
                               "no such endpoint: " + std::string(target));
  }
  if (endpoint.kind == Endpoint::kCluster) {
    if (weft::Status named = CheckName(endpoint.cluster, "the cluster id in the path"); !named.ok())
      return http::ErrorResponse(header, named);
    if (endpoint.allow == nullptr) {
      return http::ErrorResponse(header, bhttp::status::not_found,
                                 "no such cluster action: " + endpoint.action);
    }
  }
  if (!http::MethodAllowed(endpoint.allow, header.method())) {
    return http::MethodNotAllowed(header, endpoint.allow,
                                  std::string(target) + " takes " + std::string(endpoint.allow) +
                                      ", not " + std::string(header.method_string()));
  }
  // Every token is checked here, from the header: no body is read for a request that may not
  // be made.
  const Role role = RoleOf(header);
  auto needs = [&](Role wanted, const char* what) -> std::optional<Response> {
    if (role == wanted || role == Role::kAdmin) return std::nullopt;
    if (role == Role::kNone) {
      return http::ErrorResponse(header, bhttp::status::unauthorized,
                                 std::string("this endpoint needs the ") + what +
                                     " or admin token (Authorization: Bearer ...)");
    }
    return http::ErrorResponse(header, bhttp::status::forbidden,
                               std::string("this endpoint needs the ") + what + " or admin token");
  };
  switch (endpoint.kind) {
    case Endpoint::kProbe:
      return std::nullopt;
    case Endpoint::kStatus:
      if (role == Role::kNone) {
        return http::ErrorResponse(
            header, bhttp::status::unauthorized,
            "this endpoint needs a viewer, worker, trainer or admin token (Authorization: Bearer "
            "...)");
      }
      break;
    case Endpoint::kRegister:
      if (auto refused = needs(Role::kWorker, "worker")) return refused;
      break;
    case Endpoint::kCluster:
      if (auto refused = MayActFor(header, role, endpoint.cluster)) return refused;
      break;
    case Endpoint::kSubmissions:
      if (role == Role::kNone && !http::BearerToken(header).empty()) {
        return http::ErrorResponse(
            header, bhttp::status::unauthorized,
            "POST /v1/submissions takes the worker or admin token; a cluster submits with its own "
            "token to /v1/clusters/<cluster>/submissions");
      }
      if (auto refused = needs(Role::kWorker, "worker")) return refused;
      break;
    case Endpoint::kTrainer:
      if (auto refused = needs(Role::kTrainer, "trainer")) return refused;
      break;
    case Endpoint::kUnknown:
      break;
  }
  // Only submissions and jobs may be large; the rest are small by nature, and a large body would
  // only cost memory to parse.
  const bool large = endpoint.kind == Endpoint::kSubmissions || target == "/v1/jobs" ||
                     (endpoint.kind == Endpoint::kCluster && endpoint.action == "submissions");
  if (!large) *body_limit = std::min(*body_limit, kSmallRequestBytes);
  return std::nullopt;
}

void OrchestratorService::Impl::Handle(Request request, Responder respond) {
  const Role role = RoleOf(request);
  Response response = Route(request, role, &respond);
  if (respond) respond(std::move(response));  // empty when a long poll took it
}

std::optional<Response> OrchestratorService::Impl::MayActFor(const http::RequestHeader& request,
                                                             Role role,
                                                             const std::string& cluster) const {
  if (role == Role::kAdmin) return std::nullopt;
  const std::optional<std::string> credential =
      core.Inspect([&](const OrchestratorCore& c) { return c.credential(cluster); });
  if (!credential || credential->empty()) {
    if (role == Role::kWorker) return std::nullopt;
  } else {
    const std::string given = CredentialOf(http::BearerToken(request));
    if (CRYPTO_memcmp(given.data(), credential->data(), given.size()) == 0) return std::nullopt;
    if (role == Role::kWorker) {
      return http::ErrorResponse(
          request, bhttp::status::forbidden,
          "calls for cluster " + cluster + " need the cluster_token its registration returned");
    }
  }
  return http::ErrorResponse(
      request, bhttp::status::unauthorized,
      "this endpoint needs the cluster's token or the admin token (Authorization: Bearer ...)");
}

Response OrchestratorService::Impl::Route(const Request& request, Role role, Responder* respond) {
  const std::string target(request.target());
  auto error = [&](const weft::Status& status) { return http::ErrorResponse(request, status); };
  auto ok = [&](const Json& body) { return http::JsonResponse(request, bhttp::status::ok, body); };
  if (target == "/livez") return ok(Json{{"ok", true}});
  if (target == "/ui") {
    Response response(bhttp::status::ok, request.version());
    response.set(bhttp::field::content_type, "text/html; charset=utf-8");
    response.set(bhttp::field::cache_control, "no-store");
    const std::string_view page = DashboardPage();
    response.body().assign(page.begin(), page.end());
    response.prepare_payload();
    return response;
  }
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
  auto answer = [&](const std::string& text) {
    return http::JsonTextResponse(request, bhttp::status::ok, text);
  };
  if (target == "/v1/status") return answer(wire::Encode(StatusPage()));
  const Micros now = Now();
  const std::string_view body = BodyText(request);
  // A submission, once the caller may act for its cluster (`path_cluster`: the one the path
  // named, which the submission must be for).
  auto submit = [&](const std::optional<std::string>& path_cluster) -> Response {
    Result<TrajectoryGroup> group = wire::DecodeSubmission(body);
    if (!group.ok()) return error(group.status());
    if (path_cluster && group->cluster != *path_cluster) {
      return error(InvalidArgument("submission.cluster is " + group->cluster +
                                   ", but the path is " + "for cluster " + *path_cluster));
    }
    if (!path_cluster) {
      if (auto refused = MayActFor(request, role, group->cluster)) return *refused;
    }
    // Answered once durable, from the journal's thread. (A job done moves from leased to
    // buffered: no admission room opens, no poll to wake.)
    core.SubmitAsync(
        now, std::move(*group),
        [request, reply = std::move(*respond)](Result<SubmitResult> result) {
          if (!result.ok()) return reply(http::ErrorResponse(request, result.status()));
          reply(http::JsonTextResponse(request, bhttp::status::ok, wire::Encode(*result)));
        });
    *respond = nullptr;
    return Response();
  };
  // Every event is answered once durable, from the journal's thread (group commit): no server
  // thread waits on the disk. `pending` was given to the core with the event.
  auto once_durable = [&](const std::shared_ptr<DurableAnswer>& pending, Response answer) {
    pending->Answer(std::move(*respond), std::move(answer));
    *respond = nullptr;
    return Response();
  };
  const Endpoint endpoint = Classify(target);
  switch (endpoint.kind) {
    case Endpoint::kRegister: {
      Result<wire::Registration> r = wire::DecodeRegistration(body);
      if (!r.ok()) return error(r.status());
      Result<std::string> token = NewClusterToken();
      if (!token.ok()) return error(token.status());
      auto pending = std::make_shared<DurableAnswer>(request);
      weft::Status done = core.Register(now, r->cluster, r->region, r->capacity,
                                        CredentialOf(*token), pending->OnDurable(), r->model);
      if (!done.ok()) return error(done);
      Wake();
      return once_durable(pending, answer(wire::Encode(wire::ClusterAnswer{
                                       r->cluster, wire::ClusterEvent::kRegistered, *token})));
    }
    case Endpoint::kCluster: {
      const std::string& id = endpoint.cluster;
      const std::string& action = endpoint.action;
      if (action.empty()) {
        auto pending = std::make_shared<DurableAnswer>(request);
        weft::Status done = core.Deregister(now, id, pending->OnDurable());
        if (!done.ok()) return error(done);
        Wake();
        return once_durable(
            pending,
            answer(wire::Encode(wire::ClusterAnswer{id, wire::ClusterEvent::kDeregistered, ""})));
      }
      if (action == "heartbeat") {
        Result<wire::Heartbeat> h = wire::DecodeHeartbeat(body);
        if (!h.ok()) return error(h.status());
        weft::Status done = core.Heartbeat(now, id, h->ready_version);
        if (!done.ok()) return error(done);
        if (h->sync) {
          const std::optional<ClusterView> view =
              core.Inspect([&](const OrchestratorCore& c) { return c.cluster(id); });
          if (view) measurements.Synced(id, view->region, *h->sync);
          MutexLock lock(sync_mutex);
          sync_reports[id] = std::move(*h->sync);
        }
        Wake();
        return answer(wire::Encode(wire::ClusterAnswer{id, wire::ClusterEvent::kHeartbeat, ""}));
      }
      if (action == "leases") {
        Result<wire::LeaseRequest> r = wire::DecodeLeaseRequest(body);
        if (!r.ok()) return error(r.status());
        Result<LeaseAnswer> leases = core.AnswerLeaseRequest(now, id, r->max, r->request);
        if (!leases.ok()) return error(leases.status());
        if (!leases->leases.empty() || r->wait.count() == 0)
          return answer(wire::EncodeLeases(*leases));
        Park({false, id, r->max, r->request,
              std::chrono::steady_clock::now() + std::min(r->wait, options.max_wait), request,
              std::move(*respond)});
        *respond = nullptr;
        return Response();
      }
      if (action == "submissions") return submit(id);
      // drain or release
      Result<std::vector<uint64_t>> jobs = wire::DecodeDrain(body);
      if (!jobs.ok()) return error(jobs.status());
      const bool drain = action == "drain";
      auto pending = std::make_shared<DurableAnswer>(request);
      weft::Status done = core.Drain(now, id, *jobs, drain, pending->OnDurable());
      if (!done.ok()) return error(done);
      Wake();
      return once_durable(
          pending,
          answer(wire::Encode(wire::ClusterAnswer{
              id, drain ? wire::ClusterEvent::kDraining : wire::ClusterEvent::kReleased, ""})));
    }
    case Endpoint::kSubmissions:
      return submit(std::nullopt);
    case Endpoint::kTrainer:
      break;
    default:
      return http::ErrorResponse(request, bhttp::status::not_found, "no such endpoint: " + target);
  }
  if (target == "/v1/versions") {
    std::optional<double> publish_seconds;
    Result<uint64_t> version = wire::DecodeAnnouncement(body, &publish_seconds);
    if (!version.ok()) return error(version.status());
    auto pending = std::make_shared<DurableAnswer>(request);
    weft::Status done = core.AnnounceVersion(now, *version, pending->OnDurable());
    if (!done.ok()) return error(done);
    if (publish_seconds) measurements.Published(*version, *publish_seconds);
    Wake();
    return once_durable(pending, answer(wire::EncodeAnnouncement(*version)));
  }
  if (target == "/v1/jobs") {
    Result<std::vector<JobSpec>> jobs = wire::DecodeJobs(body);
    if (!jobs.ok()) return error(jobs.status());
    auto pending = std::make_shared<DurableAnswer>(request);
    Result<std::vector<uint64_t>> ids = core.AddJobs(now, *jobs, pending->OnDurable());
    if (!ids.ok()) return error(ids.status());
    Wake();
    return once_durable(pending, answer(wire::EncodeJobIds(*ids)));
  }
  Result<wire::BatchRequest> r = wire::DecodeBatchRequest(body);
  if (!r.ok()) return error(r.status());
  if (r->waited_seconds) measurements.TrainerWaited(*r->waited_seconds);
  // The acknowledgement takes effect even if the poll then waits.
  auto pending = std::make_shared<DurableAnswer>(request);
  Result<Batch> batch = core.TakeBatch(now, r->max, r->ack, pending->OnDurable());
  if (!batch.ok()) return error(batch.status());
  if (!batch->items.empty() || r->wait.count() == 0) {
    Wake();  // admission room freed
    return once_durable(pending, answer(wire::Encode(*batch)));
  }
  Park({true, "", r->max, 0, std::chrono::steady_clock::now() + std::min(r->wait, options.max_wait),
        request, std::move(*respond)});
  *respond = nullptr;
  return Response();
}

wire::StatusPage OrchestratorService::Impl::StatusPage() const {
  const Micros now = Now();
  std::map<std::string, SyncReport> reports;
  {
    MutexLock lock(sync_mutex);
    reports = sync_reports;
  }
  return core.Inspect([&](const OrchestratorCore& c) {
    const Counters& n = c.counters();
    wire::StatusPage page;
    // (model, version) -> digest -> a cluster
    std::map<std::pair<std::string, uint64_t>, std::map<std::string, std::string>> digests;
    std::map<std::string, std::string> fixed_digests;  // a fixed model's name -> its digest
    for (const ModelView& m : c.models()) {
      if (!m.name.empty()) fixed_digests[m.name] = m.digest;
      page.models.push_back({m.name, m.digest, m.queued, m.leased, m.clusters, m.ready});
    }
    const std::vector<ClusterView> views = c.clusters();
    for (const ClusterView& v : views) {
      wire::StatusPage::Cluster& cluster = page.clusters.emplace_back();
      cluster.id = v.id;
      cluster.region = v.region;
      cluster.model = v.model;
      cluster.capacity = v.capacity;
      cluster.ready_version = v.ready_version;
      cluster.state = v.gone            ? "gone"
                      : v.draining      ? "draining"
                      : v.ready_version ? "ready"
                                        : "syncing";
      cluster.leases = v.leases;
      cluster.completed = v.completed;
      cluster.throughput_per_s = v.throughput;
      cluster.seconds_since_heartbeat = static_cast<double>(now - v.last_heartbeat) / 1e6;
      wire::StatusPage::Region& region = page.regions[v.region];
      if (auto found = reports.find(v.id); found != reports.end()) {
        const SyncReport& r = found->second;
        cluster.sync = r;
        region.sync.Add(r);
        if (!v.gone && v.ready_version && !r.digest.empty() &&
            r.newest_version == v.ready_version) {
          digests[{v.model, *v.ready_version}].emplace(r.digest, v.id);
        }
      }
      ++region.clusters;
      region.leases += v.leases;
      if (!v.gone && v.ready_version) {
        ++region.ready;
        if (!region.newest_ready_version || *region.newest_ready_version < *v.ready_version)
          region.newest_ready_version = v.ready_version;
      }
    }
    // Clusters ready at the same version must serve the same state: say so loudly if not.
    page.alerts = c.Alerts(now);
    for (const auto& [at, seen] : digests) {
      const auto& [model, version] = at;
      if (!model.empty()) {
        // A fixed model's clusters must serve the weights it was registered with.
        for (const auto& [digest, cluster] : seen) {
          if (digest != fixed_digests[model])
            page.alerts.push_back("cluster " + cluster + " serves " + digest + " as model " +
                                  model + ", registered with digest " + fixed_digests[model]);
        }
        continue;
      }
      if (seen.size() < 2) continue;
      std::string text =
          "clusters ready at version " + std::to_string(version) + " serve different states:";
      for (const auto& [digest, cluster] : seen) text += " " + cluster + " " + digest;
      page.alerts.push_back(text);
    }
    page.run = options.run_id;
    page.latest_version = c.latest_version();
    page.admissible_version = c.admissible_version();
    page.max_staleness = options.max_staleness;
    page.jobs = {c.queued_jobs(), c.leased_jobs(), n.jobs_added, n.jobs_done, n.jobs_given_up};
    page.leases = {n.leases_granted, n.leases_expired, n.leases_handed_back, n.leases_cancelled};
    page.clusters_lost = n.clusters_lost;
    page.trajectories = {
        c.buffered(),           c.outstanding(),   n.submissions_accepted, n.submissions_duplicate,
        n.submissions_rejected, n.delivered_fresh, n.delivered_stale,      n.dropped_stale};
    page.batches = {n.batches, n.batches_redelivered};
    page.buffered_by_version_start = c.buffered_versions();
    page.journal = {core.journal().records(), core.journal().syncs(), core.journal().size(),
                    core.generation(),        core.compactions(),     c.remembered_done()};
    for (const auto& [name, slots] : SlotsByRegion(views)) {
      wire::StatusPage::Region& region = page.regions[name];
      region.capacity = slots.capacity;
      region.busy = slots.busy;
      region.utilisation = slots.utilisation();
      region.accepted = slots.accepted;
    }
    measurements.Fill(&page);
    return page;
  });
}

std::string OrchestratorService::Impl::Metrics() const {
  std::ostringstream out;
  out.precision(15);  // counters past a million as integers, not 1.23457e+06
  std::set<std::string> shown;
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
    // Per-cluster series for the first metrics_cluster_limit clusters (by id) that are not gone.
    uint64_t omitted = 0;
    for (const ClusterView& v : c.clusters()) {
      if (v.gone) continue;
      if (shown.size() < options.metrics_cluster_limit) {
        shown.insert(v.id);
      } else {
        ++omitted;
      }
    }
    metric("cluster_series_omitted", "gauge",
           "Clusters past orchestrator.metrics_cluster_limit, left out of the per-cluster series "
           "(the per-region series count them).",
           static_cast<double>(omitted));
    out << "# HELP weft_orchestrator_cluster_ready_version The version each cluster proved it "
           "serves (-1: none).\n"
        << "# TYPE weft_orchestrator_cluster_ready_version gauge\n";
    for (const ClusterView& v : c.clusters()) {
      if (!shown.count(v.id)) continue;
      out << "weft_orchestrator_cluster_ready_version{cluster=\"" << prometheus::LabelValue(v.id)
          << "\",region=\"" << prometheus::LabelValue(v.region) << "\"} "
          << (v.ready_version && !v.gone ? static_cast<double>(*v.ready_version) : -1) << "\n";
    }
    std::string measured;
    measurements.Metrics(measured, c);
    out << measured;
    return 0;
  });
  MutexLock lock(sync_mutex);
  for (auto [name, help, field] :
       {std::tuple{"cluster_sync_bytes_total",
                   "Weight bytes each cluster downloaded (as it last reported).",
                   &SyncReport::bytes_downloaded},
        std::tuple{"cluster_digest_mismatches_total",
                   "Times a cluster's served state did not match a manifest.",
                   &SyncReport::digest_mismatches},
        std::tuple{"cluster_engine_replicas", "Engine replicas each cluster drives.",
                   &SyncReport::engine_replicas},
        std::tuple{"cluster_ready_replicas",
                   "Engine replicas of each cluster that can serve (as it last reported).",
                   &SyncReport::ready_replicas},
        std::tuple{"cluster_loading_replicas",
                   "Engine replicas of each cluster paused for a weight load now.",
                   &SyncReport::loading_replicas}}) {
    const bool counter = std::string_view(name).ends_with("_total");
    out << "# HELP weft_orchestrator_" << name << " " << help << "\n# TYPE weft_orchestrator_"
        << name << (counter ? " counter\n" : " gauge\n");
    for (const auto& [cluster, report] : sync_reports) {
      if (!shown.count(cluster)) continue;
      out << "weft_orchestrator_" << name << "{cluster=\"" << prometheus::LabelValue(cluster)
          << "\"} " << report.*field << "\n";
    }
  }
  // Milliseconds each shown cluster reported, in seconds.
  for (auto [name, type, help, field] :
       {std::tuple{"cluster_paused_seconds_total", "counter",
                   "Time the engine replicas of each cluster spent paused for weight loads, "
                   "summed over its replicas.",
                   &SyncReport::paused_ms_total},
        std::tuple{"cluster_max_pause_seconds", "gauge",
                   "The longest pause for a weight load each cluster's engine took (as it last "
                   "reported).",
                   &SyncReport::max_pause_ms}}) {
    out << "# HELP weft_orchestrator_" << name << " " << help << "\n# TYPE weft_orchestrator_"
        << name << " " << type << "\n";
    for (const auto& [cluster, report] : sync_reports) {
      if (!shown.count(cluster)) continue;
      out << "weft_orchestrator_" << name << "{cluster=\"" << prometheus::LabelValue(cluster)
          << "\"} " << report.*field / 1000.0 << "\n";
    }
  }
  // Each replica, as its cluster last reported it.
  auto replica_metric = [&](const char* name, const char* type, const char* help,
                            auto value) REQUIRES(sync_mutex) {
    out << "# HELP weft_orchestrator_" << name << " " << help << "\n# TYPE weft_orchestrator_"
        << name << " " << type << "\n";
    for (const auto& [cluster, report] : sync_reports) {
      if (!shown.count(cluster)) continue;
      for (const ReplicaReport& r : report.replicas) {
        out << "weft_orchestrator_" << name << "{cluster=\"" << prometheus::LabelValue(cluster)
            << "\",replica=\"" << prometheus::LabelValue(r.url) << "\"} " << value(r) << "\n";
      }
    }
  };
  replica_metric("replica_ready", "gauge", "1 when the engine replica can serve, else 0.",
                 [](const ReplicaReport& r) { return r.state == "ready" ? 1 : 0; });
  replica_metric("replica_loading", "gauge",
                 "1 while the engine replica is paused for a weight load, else 0.",
                 [](const ReplicaReport& r) { return r.state == "loading" ? 1 : 0; });
  replica_metric("replica_version", "gauge", "The version the engine replica serves (-1: none).",
                 [](const ReplicaReport& r) {
                   return r.version ? static_cast<int64_t>(*r.version) : int64_t{-1};
                 });
  replica_metric("replica_loads_total", "counter", "Weight loads the engine replica completed.",
                 [](const ReplicaReport& r) { return r.loads; });
  replica_metric("replica_failures_total", "counter",
                 "Failed loads of the engine replica, and times it was found down.",
                 [](const ReplicaReport& r) { return r.failures; });
  replica_metric("replica_paused_seconds_total", "counter",
                 "Time the engine replica spent paused for weight loads, failed ones included.",
                 [](const ReplicaReport& r) { return r.paused_ms_total / 1000.0; });
  if (const http::HttpServer* running = started.load())
    out << http::ConnectionMetrics("weft_orchestrator", running->connection_stats());
  return out.str();
}

Status CheckTokens(const ServiceOptions& options) {
  if (options.worker_token.empty() || options.trainer_token.empty() ||
      options.admin_token.empty()) {
    return InvalidArgument("the worker, trainer and admin tokens are all needed");
  }
  if (options.worker_token == options.admin_token || options.trainer_token == options.admin_token ||
      options.worker_token == options.trainer_token) {
    return InvalidArgument(
        "the worker, trainer and admin tokens must all be different (a role whose token is "
        "another's would have that role's rights)");
  }
  if (!options.viewer_token.empty() && (options.viewer_token == options.worker_token ||
                                        options.viewer_token == options.trainer_token ||
                                        options.viewer_token == options.admin_token)) {
    return InvalidArgument(
        "the viewer token must differ from the worker, trainer and admin tokens (a viewer would "
        "have that role's rights)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<OrchestratorService>> OrchestratorService::Start(DurableCore& core,
                                                                        ServiceOptions options) {
  WEFT_RETURN_IF_ERROR(CheckTokens(options));
  if (options.server.max_body_bytes == 0 || options.server.max_body_bytes > kMaxRequestBytes) {
    return InvalidArgument("the orchestrator's request body limit must be 1 byte to " +
                           std::to_string(kMaxRequestBytes) + " bytes");
  }
  auto impl = std::make_unique<Impl>(core, std::move(options));
  Impl* raw = impl.get();
  WEFT_ASSIGN_OR_RETURN(impl->server,
                        http::HttpServer::Start(
                            impl->options.server,
                            [raw](Request request, Responder respond) {
                              raw->Handle(std::move(request), std::move(respond));
                            },
                            [raw](const http::RequestHeader& header, uint64_t* body_limit) {
                              return raw->Admit(header, body_limit);
                            }));
  impl->started = impl->server.get();
  impl->poller = std::thread([raw] { raw->Poll(); });
  return std::unique_ptr<OrchestratorService>(new OrchestratorService(std::move(impl)));
}

OrchestratorService::OrchestratorService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OrchestratorService::~OrchestratorService() { Stop(); }

uint16_t OrchestratorService::port() const { return impl_->server->port(); }

void OrchestratorService::Stop() {
  if (!impl_ || !impl_->poller.joinable()) return;
  {
    MutexLock lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->poller.join();
  if (impl_->compactor.joinable()) impl_->compactor.join();
  impl_->server->Stop();
}

}  // namespace weft::orchestrator
