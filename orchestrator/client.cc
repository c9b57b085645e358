#include "orchestrator/client.h"

#include <random>

#include "common/byte_io.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {
namespace {

using Json = nlohmann::json;

// An answer the wire layer could not read: the orchestrator answered something else.
template <typename T>
Result<T> Answer(Result<T> decoded, const std::string& what) {
  if (!decoded.ok()) return DataLoss(what + ": " + decoded.status().message());
  return decoded;
}

// An answer that only acknowledges: any JSON object.
Status Acknowledged(const Result<std::string>& answer, const std::string& what) {
  if (!answer.ok()) return answer.status();
  const Json json = Json::parse(*answer, nullptr, false);
  if (!json.is_object()) return DataLoss(what + ": the answer is not a JSON object");
  return Status::Ok();
}

// A cluster route's answer, checked to be the `event` asked for (kDataLoss otherwise).
Result<wire::ClusterAnswer> ClusterAnswered(const Result<std::string>& answer,
                                            wire::ClusterEvent event, const std::string& what) {
  if (!answer.ok()) return answer.status();
  return Answer(wire::DecodeClusterAnswer(*answer, event), what);
}

}  // namespace

OrchestratorClient::OrchestratorClient(std::string url, std::string token,
                                       HttpClientOptions options)
    : token_(std::move(token)), client_(std::move(url), std::move(options)) {}

Result<std::string> OrchestratorClient::Call(const std::string& method, const std::string& path,
                                             const std::string& body, bool idempotent,
                                             std::chrono::milliseconds extra_wait,
                                             const std::string* token) {
  std::vector<std::string> headers = {"Authorization: Bearer " + (token ? *token : token_),
                                      "Content-Type: application/json"};
  HttpClient* client = &client_;
  std::optional<HttpClient> longer;
  if (extra_wait.count() > 0) {
    // A long poll may legitimately take its wait on top of the usual deadline, and must not be
    // cut off as stalled while it waits.
    HttpClientOptions options = client_.options();
    options.deadline += extra_wait;
    options.stall_timeout =
        std::max(options.stall_timeout, extra_wait + std::chrono::milliseconds(5000));
    longer.emplace(client_.base_url(), options);
    client = &*longer;
  }
  const std::string what = method + " " + client_.base_url() + path;
  WEFT_ASSIGN_OR_RETURN(HttpReply reply,
                        client->Request(method, path, TextBytes(body), headers, idempotent));
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, what));
  return std::string(reply.body.begin(), reply.body.end());
}

std::string OrchestratorClient::TokenFor(const std::string& cluster) {
  MutexLock lock(tokens_mutex_);
  auto found = cluster_tokens_.find(cluster);
  return found == cluster_tokens_.end() ? token_ : found->second;
}

Status OrchestratorClient::Register(const std::string& cluster, const std::string& region,
                                    uint32_t capacity, const ModelRef& model) {
  // One registration at a time: each hands out a new token, and the token kept must be the one
  // the orchestrator saw last (two threads registering at once could otherwise keep the other's).
  MutexLock registering(register_mutex_);
  Result<std::string> answer =
      Call("POST", "/v1/clusters",
           wire::Encode(wire::Registration{cluster, region, capacity, model}), true);
  WEFT_ASSIGN_OR_RETURN(
      wire::ClusterAnswer registered,
      ClusterAnswered(answer, wire::ClusterEvent::kRegistered, "registering " + cluster));
  if (!registered.cluster_token.empty()) {
    MutexLock lock(tokens_mutex_);
    cluster_tokens_[cluster] = std::move(registered.cluster_token);
  }
  return Status::Ok();
}

Status OrchestratorClient::Heartbeat(const std::string& cluster,
                                     std::optional<uint64_t> ready_version,
                                     const SyncReport* sync) {
  wire::Heartbeat heartbeat{ready_version, std::nullopt};
  if (sync != nullptr) heartbeat.sync = *sync;
  const std::string token = TokenFor(cluster);
  return ClusterAnswered(Call("POST", "/v1/clusters/" + cluster + "/heartbeat",
                              wire::Encode(heartbeat), true, {}, &token),
                         wire::ClusterEvent::kHeartbeat, "heartbeat of " + cluster)
      .status();
}

Result<LeaseAnswer> OrchestratorClient::RequestLeases(const std::string& cluster, uint32_t max,
                                                      std::chrono::milliseconds wait) {
  // One id for every try of this call: a retry after a lost answer gets the same leases back.
  thread_local std::mt19937_64 ids(std::random_device{}());
  const wire::LeaseRequest request{max, wait, (ids() >> 1) | 1};
  const std::string token = TokenFor(cluster);
  WEFT_ASSIGN_OR_RETURN(std::string answer, Call("POST", "/v1/clusters/" + cluster + "/leases",
                                                 wire::Encode(request), true, wait, &token));
  return Answer(wire::DecodeLeases(answer), "leases for " + cluster);
}

Result<SubmitResult> OrchestratorClient::Submit(const TrajectoryGroup& group) {
  const std::string token = TokenFor(group.cluster);
  WEFT_ASSIGN_OR_RETURN(std::string answer,
                        Call("POST", "/v1/clusters/" + group.cluster + "/submissions",
                             wire::EncodeSubmission(group), true, {}, &token));
  return Answer(wire::DecodeSubmitResult(answer), "submission of job " + std::to_string(group.job));
}

Status OrchestratorClient::Drain(const std::string& cluster, const std::vector<uint64_t>& jobs) {
  const std::string token = TokenFor(cluster);
  return ClusterAnswered(Call("POST", "/v1/clusters/" + cluster + "/drain", wire::EncodeDrain(jobs),
                              true, {}, &token),
                         wire::ClusterEvent::kDraining, "draining " + cluster)
      .status();
}

Status OrchestratorClient::Release(const std::string& cluster, const std::vector<uint64_t>& jobs) {
  const std::string token = TokenFor(cluster);
  return ClusterAnswered(Call("POST", "/v1/clusters/" + cluster + "/release",
                              wire::EncodeDrain(jobs), true, {}, &token),
                         wire::ClusterEvent::kReleased, "handing back leases of " + cluster)
      .status();
}

Status OrchestratorClient::Deregister(const std::string& cluster) {
  const std::string token = TokenFor(cluster);
  return ClusterAnswered(Call("DELETE", "/v1/clusters/" + cluster, "", true, {}, &token),
                         wire::ClusterEvent::kDeregistered, "deregistering " + cluster)
      .status();
}

Status OrchestratorClient::AnnounceVersion(uint64_t version,
                                           std::optional<double> publish_seconds) {
  return Acknowledged(
      Call("POST", "/v1/versions", wire::EncodeAnnouncement(version, publish_seconds), true),
      "announcing version " + std::to_string(version));
}

Result<std::vector<uint64_t>> OrchestratorClient::AddJobs(
    const std::vector<std::pair<Json, uint32_t>>& prompts) {
  std::vector<JobSpec> jobs;
  jobs.reserve(prompts.size());
  for (const auto& [prompt, samples] : prompts) jobs.push_back({prompt.dump(), samples});
  return SendJobs(jobs);
}

Result<std::vector<uint64_t>> OrchestratorClient::AddJobs(std::span<const NewJob> jobs) {
  std::vector<JobSpec> specs;
  specs.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobSpec spec{"", jobs[i].samples};
    try {  // (printing a string that is not UTF-8 throws)
      spec.prompt = jobs[i].prompt.dump();
      if (!jobs[i].metadata.is_null()) spec.metadata = jobs[i].metadata.dump();
      spec.model = jobs[i].model;
      spec.kind = jobs[i].kind;
      if (!jobs[i].targets.is_null()) spec.targets = jobs[i].targets.dump();
    } catch (const Json::exception& error) {
      return InvalidArgument("adding jobs: job " + std::to_string(i) + ": " + error.what());
    }
    specs.push_back(std::move(spec));
  }
  return SendJobs(specs);
}

Result<std::vector<uint64_t>> OrchestratorClient::SendJobs(const std::vector<JobSpec>& jobs) {
  WEFT_ASSIGN_OR_RETURN(std::string answer,
                        Call("POST", "/v1/jobs", wire::EncodeJobs(jobs), false));
  return Answer(wire::DecodeJobIds(answer), "adding jobs");
}

Status OrchestratorClient::AcknowledgeBatches() {
  MutexLock lock(batch_mutex_);
  if (last_batch_ == 0) return Status::Ok();
  const wire::BatchRequest request{0, std::chrono::milliseconds(0), last_batch_, waited_};
  Status acknowledged = Acknowledged(Call("POST", "/v1/batches", wire::Encode(request), true),
                                     "acknowledging batch " + std::to_string(last_batch_));
  if (acknowledged.ok()) waited_.reset();
  return acknowledged;
}

void OrchestratorClient::ReportWait(double seconds) {
  MutexLock lock(batch_mutex_);
  waited_ = seconds;
}

Result<std::vector<Delivered>> OrchestratorClient::TakeBatch(uint32_t max,
                                                             std::chrono::milliseconds wait) {
  // One batch at a time per client: the acknowledgement is the last one received. Repeating the
  // request is safe (an unacknowledged batch is simply handed out again).
  MutexLock lock(batch_mutex_);
  wire::BatchRequest request{max, wait, std::nullopt, waited_};
  if (last_batch_ != 0) request.ack = last_batch_;
  WEFT_ASSIGN_OR_RETURN(std::string answer,
                        Call("POST", "/v1/batches", wire::Encode(request), true, wait));
  waited_.reset();  // (a repeat of the request after a lost answer may report it twice)
  WEFT_ASSIGN_OR_RETURN(Batch batch, Answer(wire::DecodeBatch(answer), "taking a batch"));
  if (batch.id == 0 || batch.id <= last_batch_) return std::vector<Delivered>();  // nothing new
  last_batch_ = batch.id;
  return std::move(batch.items);
}

Result<wire::StatusPage> OrchestratorClient::GetStatus() {
  WEFT_ASSIGN_OR_RETURN(std::string answer, Call("GET", "/v1/status", "", true));
  return Answer(wire::DecodeStatusPage(answer, "status"), "GET /v1/status");
}

}  // namespace weft::orchestrator
