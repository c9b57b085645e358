#include "orchestrator/client.h"

#include <random>

namespace weft::orchestrator {
namespace {

using Json = nlohmann::json;

// A required field of an answer, or kDataLoss naming it (the orchestrator answered something else).
Result<const Json*> Field(const Json& answer, const char* name, const std::string& what) {
  if (!answer.is_object() || !answer.contains(name))
    return DataLoss(what + ": the answer lacks '" + name + "'");
  return &answer[name];
}

}  // namespace

OrchestratorClient::OrchestratorClient(std::string url, std::string token,
                                       HttpClientOptions options)
    : token_(std::move(token)), client_(std::move(url), std::move(options)) {}

Result<Json> OrchestratorClient::Call(const std::string& method, const std::string& path,
                                      const Json& body, bool idempotent,
                                      std::chrono::milliseconds extra_wait) {
  const std::string text = body.is_null() ? "" : body.dump();
  std::vector<std::string> headers = {"Authorization: Bearer " + token_,
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
  WEFT_ASSIGN_OR_RETURN(
      HttpReply reply,
      client->Request(method, path, {reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                      headers, idempotent));
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, what));
  Json answer = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
  if (answer.is_discarded()) return DataLoss(what + ": the answer is not JSON");
  return answer;
}

Status OrchestratorClient::Register(const std::string& cluster, const std::string& region,
                                    uint32_t capacity) {
  return Call("POST", "/v1/clusters",
              {{"cluster", cluster}, {"region", region}, {"capacity", capacity}}, true)
      .status();
}

Status OrchestratorClient::Heartbeat(const std::string& cluster,
                                     std::optional<uint64_t> ready_version,
                                     const SyncReport* sync) {
  Json body = {{"ready_version", ready_version ? Json(*ready_version) : Json(nullptr)}};
  if (sync != nullptr) body["sync"] = SyncReportJson(*sync);
  return Call("POST", "/v1/clusters/" + cluster + "/heartbeat", body, true).status();
}

Result<std::vector<Lease>> OrchestratorClient::RequestLeases(const std::string& cluster,
                                                             uint32_t max,
                                                             std::chrono::milliseconds wait) {
  const std::string what = "leases for " + cluster;
  // One id for every try of this call: a retry after a lost answer gets the same leases back.
  thread_local std::mt19937_64 ids(std::random_device{}());
  const uint64_t request = (ids() >> 1) | 1;
  WEFT_ASSIGN_OR_RETURN(
      Json answer,
      Call("POST", "/v1/clusters/" + cluster + "/leases",
           {{"max", max}, {"wait_ms", wait.count()}, {"request", request}}, true, wait));
  WEFT_ASSIGN_OR_RETURN(const Json* list, Field(answer, "leases", what));
  std::vector<Lease> leases;
  try {
    for (const Json& l : *list) {
      leases.push_back({l.at("job").get<uint64_t>(), l.at("attempt").get<uint32_t>(),
                        l.at("deadline_us").get<Micros>(), l.at("min_version").get<uint64_t>(),
                        l.at("prompt").get<std::string>(), l.at("samples").get<uint32_t>()});
    }
  } catch (const Json::exception& error) {
    return DataLoss(what + ": malformed lease: " + error.what());
  }
  return leases;
}

Result<SubmitResult> OrchestratorClient::Submit(const Submission& s, const Json& trajectories) {
  Json body = {{"job", s.job},
               {"attempt", s.attempt},
               {"cluster", s.cluster},
               {"version_start", s.version_start},
               {"version_end", s.version_end},
               {"segments", s.segments},
               {"tokens", s.tokens},
               {"trajectories", trajectories}};
  const std::string what = "submission of job " + std::to_string(s.job);
  WEFT_ASSIGN_OR_RETURN(Json answer, Call("POST", "/v1/submissions", body, true));
  WEFT_ASSIGN_OR_RETURN(const Json* result, Field(answer, "result", what));
  if (*result == "accepted") return SubmitResult::kAccepted;
  if (*result == "duplicate") return SubmitResult::kDuplicate;
  return DataLoss(what + ": unexpected result " + result->dump());
}

Status OrchestratorClient::Drain(const std::string& cluster, const std::vector<uint64_t>& jobs) {
  return Call("POST", "/v1/clusters/" + cluster + "/drain", {{"jobs", jobs}}, true).status();
}

Status OrchestratorClient::Deregister(const std::string& cluster) {
  return Call("DELETE", "/v1/clusters/" + cluster, nullptr, true).status();
}

Status OrchestratorClient::AnnounceVersion(uint64_t version) {
  return Call("POST", "/v1/versions", {{"version", version}}, true).status();
}

Result<std::vector<uint64_t>> OrchestratorClient::AddJobs(
    const std::vector<std::pair<Json, uint32_t>>& prompts) {
  Json list = Json::array();
  for (const auto& [prompt, samples] : prompts)
    list.push_back({{"prompt", prompt}, {"samples", samples}});
  WEFT_ASSIGN_OR_RETURN(Json answer, Call("POST", "/v1/jobs", {{"prompts", list}}, false));
  WEFT_ASSIGN_OR_RETURN(const Json* ids, Field(answer, "jobs", "adding jobs"));
  if (!ids->is_array()) return DataLoss("adding jobs: 'jobs' is not a list");
  return ids->get<std::vector<uint64_t>>();
}

Status OrchestratorClient::AcknowledgeBatches() {
  std::lock_guard<std::mutex> lock(batch_mutex_);
  if (last_batch_ == 0) return Status::Ok();
  return Call("POST", "/v1/batches", {{"max", 0}, {"ack", last_batch_}}, true).status();
}

Result<std::vector<ReceivedTrajectory>> OrchestratorClient::TakeBatch(
    uint32_t max, std::chrono::milliseconds wait) {
  // One batch at a time per client: the acknowledgement is the last one received. Repeating the
  // request is safe (an unacknowledged batch is simply handed out again).
  std::lock_guard<std::mutex> lock(batch_mutex_);
  Json request = {{"max", max},
                  {"wait_ms", wait.count()},
                  {"ack", last_batch_ ? Json(last_batch_) : Json(nullptr)}};
  WEFT_ASSIGN_OR_RETURN(Json answer, Call("POST", "/v1/batches", request, true, wait));
  WEFT_ASSIGN_OR_RETURN(const Json* list, Field(answer, "trajectories", "taking a batch"));
  WEFT_ASSIGN_OR_RETURN(const Json* id, Field(answer, "batch", "taking a batch"));
  if (!id->is_number_unsigned()) return DataLoss("taking a batch: 'batch' is not an id");
  std::vector<ReceivedTrajectory> batch;
  if (id->get<uint64_t>() == 0 || id->get<uint64_t>() <= last_batch_) return batch;  // nothing new
  last_batch_ = id->get<uint64_t>();
  try {
    for (const Json& t : *list) {
      ReceivedTrajectory r;
      r.submission.job = t.at("job").get<uint64_t>();
      r.submission.attempt = t.at("attempt").get<uint32_t>();
      r.submission.cluster = t.at("cluster").get<std::string>();
      r.submission.version_start = t.at("version_start").get<uint64_t>();
      r.submission.version_end = t.at("version_end").get<uint64_t>();
      r.submission.segments = t.at("segments").get<std::vector<std::pair<uint64_t, uint64_t>>>();
      r.submission.tokens = t.at("tokens").get<uint64_t>();
      r.submission.payload = t.at("trajectories").dump();
      r.stale = t.at("stale").get<bool>();
      batch.push_back(std::move(r));
    }
  } catch (const Json::exception& error) {
    return DataLoss(std::string("taking a batch: malformed trajectory: ") + error.what());
  }
  return batch;
}

Result<Json> OrchestratorClient::GetStatus() { return Call("GET", "/v1/status", nullptr, true); }

}  // namespace weft::orchestrator
