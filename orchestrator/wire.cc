#include "orchestrator/wire.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/hex.h"
#include "common/json_fields.h"
#include "common/json_text.h"
#include "common/names.h"

namespace weft::orchestrator::wire {
namespace {

using Json = nlohmann::json;

Json Optional(const std::optional<uint64_t>& value) { return value ? Json(*value) : Json(nullptr); }
Json Optional(const std::optional<double>& value) { return value ? Json(*value) : Json(nullptr); }

// Members of the objects at one depth that are passed on as text: checked by the parser but left
// out of the tree, so that the caller cuts their text out instead (json_text).
struct Skip {
  int depth = -1;                       // -1: none
  std::vector<std::string_view> names;  // ("trajectories": a group's samples; "metadata": a job's)
  bool* seen = nullptr;                 // when given, set when any such member was there
};

// `text` as a JSON object, or kInvalidArgument.
Result<Json> ParseObject(std::string_view text, const std::string& what, const Skip& skip = {}) {
  Json::parser_callback_t callback = nullptr;
  if (skip.depth >= 0) {
    callback = [&skip](int depth, Json::parse_event_t event, Json& parsed) {
      if (event != Json::parse_event_t::key || depth != skip.depth || !parsed.is_string())
        return true;
      const std::string& key = parsed.get_ref<const std::string&>();
      if (std::find(skip.names.begin(), skip.names.end(), key) == skip.names.end()) return true;
      if (skip.seen != nullptr) *skip.seen = true;
      return false;
    };
  }
  WEFT_ASSIGN_OR_RETURN(Json parsed, ParseStrict(text, what, callback));
  if (!parsed.is_object()) return InvalidArgument(what + " is not a JSON object");
  return parsed;
}

Result<Json> ParseRequest(std::string_view body, const Skip& skip = {}) {
  return ParseObject(body, "the request body", skip);
}

Result<Json> ParseAnswer(std::string_view answer, const Skip& skip = {}) {
  return ParseObject(answer, "the answer", skip);
}

// What a score job needs (docs/api.md, jobs): token ids as its prompt, `targets` 1 to 4096 arrays
// of 1 to 65536 token ids, and `samples`, if given, their number. A generate job has no targets.
Status CheckScoreJob(const Json& job, const std::string& where, JobKind kind) {
  auto token_ids = [](const Json& list, size_t most) {
    if (!list.is_array() || list.empty() || list.size() > most) return false;
    return std::all_of(list.begin(), list.end(), [](const Json& t) {
      return t.is_number_unsigned() && t.get<uint64_t>() <= 0x7FFFFFFF;
    });
  };
  if (kind == JobKind::kGenerate) {
    if (job.contains("targets")) return InvalidArgument(where + ".targets is for score jobs only");
    return Status::Ok();
  }
  if (!token_ids(job["prompt"], 1 << 20))
    return InvalidArgument(where + ".prompt of a score job must be token ids (0 to 2^31-1)");
  if (!job.contains("targets") || !job["targets"].is_array() || job["targets"].empty() ||
      job["targets"].size() > 4096)
    return InvalidArgument(where + ".targets must be 1 to 4096 completions to score");
  for (size_t t = 0; t < job["targets"].size(); ++t) {
    if (!token_ids(job["targets"][t], 65536))
      return InvalidArgument(where + ".targets[" + std::to_string(t) +
                             "] is not 1 to 65536 token ids (0 to 2^31-1)");
  }
  if (job.contains("samples") && (!job["samples"].is_number_unsigned() ||
                                  job["samples"].get<uint64_t>() != job["targets"].size()))
    return InvalidArgument(where + ".samples must be the number of targets, " +
                           std::to_string(job["targets"].size()));
  return Status::Ok();
}

// A job's metadata sits three levels down in a jobs body and in a batch answer (inside the top
// object, an array and one of its objects), and those bodies nest at most 64 deep: so may it,
// less those three.
constexpr size_t kMetadataDepth = 64 - 3;

// JSON text may start with a byte order mark, which parsers skip.
std::string_view WithoutBom(std::string_view text) {
  return text.starts_with("\xEF\xBB\xBF") ? text.substr(3) : text;
}

// A required field of an answer.
Result<const Json*> Field(const Json& answer, const char* name) {
  if (!answer.contains(name))
    return InvalidArgument(std::string("the answer lacks '") + name + "'");
  return &answer[name];
}

Result<uint64_t> GetBounded(const Json& object, const std::string& field, const std::string& where,
                            uint64_t low, uint64_t high) {
  WEFT_ASSIGN_OR_RETURN(uint64_t value, GetUnsigned(object, field, where));
  if (value < low || value > high) {
    return InvalidArgument(where + "." + field + " must be " + std::to_string(low) + " to " +
                           std::to_string(high));
  }
  return value;
}

// A long poll's "max" (from `least` to 100000) and "wait_ms" (capped at an hour), when present.
Status ReadPoll(const Json& object, const std::string& where, uint64_t least, uint32_t* max,
                std::chrono::milliseconds* wait) {
  if (object.contains("max")) {
    WEFT_ASSIGN_OR_RETURN(uint64_t value, GetBounded(object, "max", where, least, 100000));
    *max = static_cast<uint32_t>(value);
  }
  if (object.contains("wait_ms")) {
    WEFT_ASSIGN_OR_RETURN(uint64_t value, GetUnsigned(object, "wait_ms", where));
    *wait = std::chrono::milliseconds(std::min<uint64_t>(value, 3'600'000));
  }
  return Status::Ok();
}

// A version or null.
Result<std::optional<uint64_t>> GetOptionalVersion(const Json& object, const std::string& field,
                                                   const std::string& where) {
  if (object[field].is_null()) return std::optional<uint64_t>();
  Result<uint64_t> value = GetUnsigned(object, field, where);
  if (!value.ok() || *value > kMaxVersion) {
    return InvalidArgument(where + "." + field + " is not a version (0 to " +
                           std::to_string(kMaxVersion) + ") or null");
  }
  return std::optional<uint64_t>(*value);
}

// An array of ids; `what` names one ("job id").
Result<std::vector<uint64_t>> GetIds(const Json& object, const std::string& field,
                                     const std::string& where, const std::string& what) {
  const Json& list = object[field];
  if (!list.is_array()) {
    return InvalidArgument(where + "." + field + " is not an array of " + what + "s");
  }
  std::vector<uint64_t> ids;
  ids.reserve(list.size());
  for (const Json& id : list) {
    if (!id.is_number_unsigned()) {
      return InvalidArgument(where + "." + field + " holds something that is not a " + what);
    }
    ids.push_back(id.get<uint64_t>());
  }
  return ids;
}

// `fields` (a dumped object) with members whose values are JSON text (`key`: `text`, in order)
// spliced in before its closing brace.
std::string WithMembers(
    const Json& fields,
    std::initializer_list<std::pair<std::string_view, std::string_view>> members) {
  std::string out = fields.dump();
  out.pop_back();
  bool first = fields.empty();
  for (const auto& [key, text] : members) {
    out += first ? "\"" : ",\"";
    out += key;
    out += "\":";
    out += text;
    first = false;
  }
  out += '}';
  return out;
}

std::string WithTrajectories(const Json& fields, std::string_view text) {
  return WithMembers(fields, {{"trajectories", text}});
}

// The text of member "metadata" of the object at `begin` of `text` (checked JSON): "" when it has
// none or it is null.
std::string MetadataAt(std::string_view text, size_t begin) {
  std::optional<std::string_view> metadata = json_text::Member(text, begin, "metadata");
  return metadata && *metadata != "null" ? std::string(*metadata) : std::string();
}

Status CheckMetadataSize(size_t size, const std::string& where) {
  if (size <= kMaxJobMetadataBytes) return Status::Ok();
  return InvalidArgument(where + " is " + std::to_string(size) + " bytes of JSON text; at most " +
                         std::to_string(kMaxJobMetadataBytes) + " (64 KiB)");
}

const std::set<std::string> kGroupFields = {"job",         "attempt",  "cluster", "version_start",
                                            "version_end", "segments", "tokens"};

}  // namespace

const char* JobKindName(JobKind kind) { return kind == JobKind::kScore ? "score" : "generate"; }

Result<JobKind> ParseJobKind(const std::string& name) {
  if (name == "generate") return JobKind::kGenerate;
  if (name == "score") return JobKind::kScore;
  return InvalidArgument("'" + name + "' is not a job kind (generate or score)");
}

void AppendJobTail(nlohmann::json& fields, const std::string& metadata, const std::string& model,
                   JobKind kind, const std::string& targets) {
  const bool more = !model.empty() || kind != JobKind::kGenerate;
  if (!metadata.empty() || more) fields.push_back(metadata);
  if (!more) return;
  fields.push_back(model);
  fields.push_back(JobKindName(kind));
  fields.push_back(targets);
}

Status CheckModelDigest(const std::string& digest, const std::string& where) {
  if (digest.size() < 16 || digest.size() > 128 || !IsLowerHex(digest))
    return InvalidArgument(where + " is not 16 to 128 lowercase hex digits");
  return Status::Ok();
}

std::string Encode(const Registration& r) {
  Json body{{"cluster", r.cluster}, {"region", r.region}, {"capacity", r.capacity}};
  if (r.model.fixed()) {
    body["model"] = r.model.name;
    body["model_digest"] = r.model.digest;
  }
  return body.dump();
}

Result<Registration> DecodeRegistration(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "cluster";
  WEFT_RETURN_IF_ERROR(
      CheckFields(json, where, {"cluster", "region", "capacity"}, {"model", "model_digest"}));
  Registration r;
  if (json.contains("model") != json.contains("model_digest"))
    return InvalidArgument(where + ": a fixed model needs both 'model' and 'model_digest'");
  if (json.contains("model")) {
    WEFT_ASSIGN_OR_RETURN(r.model.name, GetString(json, "model", where));
    WEFT_ASSIGN_OR_RETURN(r.model.digest, GetString(json, "model_digest", where));
    WEFT_RETURN_IF_ERROR(CheckName(r.model.name, where + ".model"));
    WEFT_RETURN_IF_ERROR(CheckModelDigest(r.model.digest, where + ".model_digest"));
  }
  WEFT_ASSIGN_OR_RETURN(r.cluster, GetString(json, "cluster", where));
  WEFT_ASSIGN_OR_RETURN(r.region, GetString(json, "region", where));
  WEFT_RETURN_IF_ERROR(CheckName(r.cluster, where + ".cluster"));
  WEFT_RETURN_IF_ERROR(CheckName(r.region, where + ".region"));
  WEFT_ASSIGN_OR_RETURN(uint64_t capacity, GetBounded(json, "capacity", where, 1, 1'000'000));
  r.capacity = static_cast<uint32_t>(capacity);
  return r;
}

Json SyncReportJson(const SyncReport& r) {
  Json out{{"bytes_downloaded", r.bytes_downloaded},
           {"pulls", r.pulls},
           {"keyframe_pulls", r.keyframe_pulls},
           {"digest_mismatches", r.digest_mismatches},
           {"commits", r.commits},
           {"engine_replicas", r.engine_replicas},
           {"ready_replicas", r.ready_replicas},
           {"loading_replicas", r.loading_replicas},
           {"max_pause_ms", r.max_pause_ms},
           {"paused_ms_total", r.paused_ms_total},
           {"first_version", Optional(r.first_version)},
           {"newest_version", Optional(r.newest_version)},
           {"digest", r.digest}};
  if (!r.pause_counts.empty()) {
    out["pause_counts"] = r.pause_counts;
    out["pause_sum_ms"] = r.pause_sum_ms;
  }
  if (!r.replicas.empty()) {
    Json& list = out["replicas"] = Json::array();
    for (const ReplicaReport& e : r.replicas) {
      list.push_back(Json{{"url", e.url},
                          {"state", e.state},
                          {"version", Optional(e.version)},
                          {"loads", e.loads},
                          {"failures", e.failures},
                          {"last_pause_ms", e.last_pause_ms},
                          {"paused_ms_total", e.paused_ms_total}});
    }
  }
  return out;
}

namespace {

// A non-negative number at `field` of `json`, when there.
Status ReadMilliseconds(const Json& json, const char* field, const std::string& where,
                        double* out) {
  if (!json.contains(field)) return Status::Ok();
  if (!json[field].is_number() || !(json[field].get<double>() >= 0) ||
      !std::isfinite(json[field].get<double>())) {
    return InvalidArgument(where + "." + field + " is not a non-negative number");
  }
  *out = json[field].get<double>();
  return Status::Ok();
}

constexpr size_t kMaxReplicas = 4096;  // per cluster, in a heartbeat
constexpr size_t kMaxReplicaUrlBytes = 1024;

Result<ReplicaReport> DecodeReplicaReport(const Json& json, const std::string& where) {
  WEFT_RETURN_IF_ERROR(
      CheckFields(json, where, {"url", "state"},
                  {"version", "loads", "failures", "last_pause_ms", "paused_ms_total"}));
  ReplicaReport r;
  WEFT_ASSIGN_OR_RETURN(r.url, GetString(json, "url", where));
  if (r.url.empty() || r.url.size() > kMaxReplicaUrlBytes)
    return InvalidArgument(where + ".url must be 1 to " + std::to_string(kMaxReplicaUrlBytes) +
                           " bytes");
  WEFT_ASSIGN_OR_RETURN(r.state, GetString(json, "state", where));
  if (r.state != "ready" && r.state != "loading" && r.state != "down")
    return InvalidArgument(where + ".state is not ready, loading or down");
  if (json.contains("version")) {
    WEFT_ASSIGN_OR_RETURN(r.version, GetOptionalVersion(json, "version", where));
  }
  for (auto [field, value] : {std::pair{"loads", &r.loads}, std::pair{"failures", &r.failures}}) {
    if (json.contains(field)) {
      WEFT_ASSIGN_OR_RETURN(*value, GetUnsigned(json, field, where));
    }
  }
  WEFT_RETURN_IF_ERROR(ReadMilliseconds(json, "last_pause_ms", where, &r.last_pause_ms));
  WEFT_RETURN_IF_ERROR(ReadMilliseconds(json, "paused_ms_total", where, &r.paused_ms_total));
  return r;
}

}  // namespace

Result<SyncReport> DecodeSyncReport(const Json& json, const std::string& where) {
  SyncReport r;
  WEFT_RETURN_IF_ERROR(CheckFields(
      json, where, {},
      {"bytes_downloaded", "pulls", "keyframe_pulls", "digest_mismatches", "commits",
       "engine_replicas", "ready_replicas", "loading_replicas", "max_pause_ms", "paused_ms_total",
       "first_version", "newest_version", "digest", "replicas", "pause_counts", "pause_sum_ms"}));
  if (json.contains("digest")) {
    Result<std::string> digest = GetString(json, "digest", where);
    if (!digest.ok() || digest->size() > 64 || !IsLowerHex(*digest)) {
      return InvalidArgument(where + ".digest is not a hex digest of at most 64 digits");
    }
    r.digest = *digest;
  }
  for (auto [field, value] : {std::pair{"first_version", &r.first_version},
                              std::pair{"newest_version", &r.newest_version}}) {
    if (json.contains(field)) {
      WEFT_ASSIGN_OR_RETURN(*value, GetOptionalVersion(json, field, where));
    }
  }
  for (auto [field, value] :
       {std::pair{"bytes_downloaded", &r.bytes_downloaded}, std::pair{"pulls", &r.pulls},
        std::pair{"keyframe_pulls", &r.keyframe_pulls},
        std::pair{"digest_mismatches", &r.digest_mismatches}, std::pair{"commits", &r.commits},
        std::pair{"engine_replicas", &r.engine_replicas},
        std::pair{"ready_replicas", &r.ready_replicas},
        std::pair{"loading_replicas", &r.loading_replicas}}) {
    if (json.contains(field)) {
      WEFT_ASSIGN_OR_RETURN(*value, GetUnsigned(json, field, where));
    }
  }
  WEFT_RETURN_IF_ERROR(ReadMilliseconds(json, "max_pause_ms", where, &r.max_pause_ms));
  WEFT_RETURN_IF_ERROR(ReadMilliseconds(json, "paused_ms_total", where, &r.paused_ms_total));
  WEFT_RETURN_IF_ERROR(ReadMilliseconds(json, "pause_sum_ms", where, &r.pause_sum_ms));
  if (json.contains("pause_counts")) {
    const Json& counts = json["pause_counts"];
    const size_t buckets = kPauseBoundsSeconds.size() + 1;
    if (!counts.is_array() || counts.size() != buckets ||
        !std::all_of(counts.begin(), counts.end(),
                     [](const Json& c) { return c.is_number_unsigned(); })) {
      return InvalidArgument(where + ".pause_counts is not a list of " + std::to_string(buckets) +
                             " counts");
    }
    for (const Json& c : counts) r.pause_counts.push_back(c.get<uint64_t>());
  }
  if (json.contains("replicas")) {
    const Json& list = json["replicas"];
    if (!list.is_array() || list.size() > kMaxReplicas) {
      return InvalidArgument(where + ".replicas is not a list of at most " +
                             std::to_string(kMaxReplicas) + " replicas");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      WEFT_ASSIGN_OR_RETURN(
          ReplicaReport replica,
          DecodeReplicaReport(list[i], where + ".replicas[" + std::to_string(i) + "]"));
      r.replicas.push_back(std::move(replica));
    }
  }
  return r;
}

std::string Encode(const Heartbeat& h) {
  Json body = {{"ready_version", Optional(h.ready_version)}};
  if (h.sync) body["sync"] = SyncReportJson(*h.sync);
  return body.dump();
}

Result<Heartbeat> DecodeHeartbeat(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "heartbeat";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, {"ready_version"}, {"sync"}));
  Heartbeat h;
  WEFT_ASSIGN_OR_RETURN(h.ready_version, GetOptionalVersion(json, "ready_version", where));
  if (json.contains("sync")) {
    WEFT_ASSIGN_OR_RETURN(h.sync, DecodeSyncReport(json["sync"], where + ".sync"));
  }
  return h;
}

std::string Encode(const LeaseRequest& r) {
  Json body = {{"max", r.max}, {"wait_ms", r.wait.count()}};
  if (r.request != 0) body["request"] = r.request;
  return body.dump();
}

Result<LeaseRequest> DecodeLeaseRequest(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "leases";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, {}, {"max", "wait_ms", "request"}));
  LeaseRequest r;
  WEFT_RETURN_IF_ERROR(ReadPoll(json, where, 1, &r.max, &r.wait));
  if (json.contains("request")) {
    WEFT_ASSIGN_OR_RETURN(r.request, GetUnsigned(json, "request", where));
  }
  return r;
}

std::string EncodeLeases(const LeaseAnswer& answer) {
  Json list = Json::array();
  for (const Lease& l : answer.leases) {
    list.push_back({{"job", l.job},
                    {"attempt", l.attempt},
                    {"deadline_us", l.deadline},
                    {"min_version", l.min_version},
                    {"prompt", l.prompt},
                    {"samples", l.samples}});
    if (!l.metadata.empty()) list.back()["metadata"] = Json::parse(l.metadata);
    if (!l.model.empty()) list.back()["model"] = l.model;
    if (l.kind != JobKind::kGenerate) list.back()["kind"] = JobKindName(l.kind);
    if (!l.targets.empty()) list.back()["targets"] = Json::parse(l.targets);
  }
  Json body = {{"leases", list}};
  if (answer.latest_version) body["latest_version"] = *answer.latest_version;
  return body.dump();
}

Result<LeaseAnswer> DecodeLeases(std::string_view text) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(text));
  WEFT_ASSIGN_OR_RETURN(const Json* list, Field(json, "leases"));
  if (!list->is_array()) return InvalidArgument("'leases' is not an array");
  LeaseAnswer answer;
  if (json.contains("latest_version")) {
    WEFT_ASSIGN_OR_RETURN(answer.latest_version,
                          GetOptionalVersion(json, "latest_version", "leases answer"));
  }
  std::vector<Lease>& leases = answer.leases;
  try {
    for (const Json& l : *list) {
      leases.push_back({l.at("job").get<uint64_t>(), l.at("attempt").get<uint32_t>(),
                        l.at("deadline_us").get<Micros>(), l.at("min_version").get<uint64_t>(),
                        l.at("prompt").get<std::string>(), l.at("samples").get<uint32_t>(),
                        l.contains("metadata") && !l["metadata"].is_null() ? l["metadata"].dump()
                                                                           : std::string()});
      Lease& lease = leases.back();
      if (l.contains("model")) lease.model = l["model"].get<std::string>();
      if (l.contains("kind")) {
        WEFT_ASSIGN_OR_RETURN(lease.kind, ParseJobKind(l["kind"].get<std::string>()));
      }
      if (l.contains("targets")) lease.targets = l["targets"].dump();
    }
  } catch (const Json::exception& error) {
    return InvalidArgument(std::string("malformed lease: ") + error.what());
  }
  return answer;
}

std::string EncodeDrain(const std::vector<uint64_t>& jobs) { return Json{{"jobs", jobs}}.dump(); }

Result<std::vector<uint64_t>> DecodeDrain(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "drain", {}, {"jobs"}));
  if (!json.contains("jobs")) return std::vector<uint64_t>();
  return GetIds(json, "jobs", "drain", "job id");
}

Json GroupFields(const TrajectoryGroup& g) {
  return Json{{"job", g.job},
              {"attempt", g.attempt},
              {"cluster", g.cluster},
              {"version_start", g.version_start},
              {"version_end", g.version_end},
              {"segments", g.segments},
              {"tokens", g.tokens}};
}

Status ReadGroupFields(const Json& object, const std::string& where, TrajectoryGroup* g) {
  for (const std::string& field : kGroupFields) {
    if (!object.contains(field)) return InvalidArgument(where + " lacks the field '" + field + "'");
  }
  WEFT_ASSIGN_OR_RETURN(g->job, GetUnsigned(object, "job", where));
  WEFT_ASSIGN_OR_RETURN(uint64_t attempt, GetUnsigned(object, "attempt", where));
  if (attempt > 1'000'000) return InvalidArgument(where + ".attempt is out of range");
  g->attempt = static_cast<uint32_t>(attempt);
  WEFT_ASSIGN_OR_RETURN(g->cluster, GetString(object, "cluster", where));
  WEFT_RETURN_IF_ERROR(CheckName(g->cluster, where + ".cluster"));
  WEFT_ASSIGN_OR_RETURN(g->version_start,
                        GetBounded(object, "version_start", where, 0, kMaxVersion));
  WEFT_ASSIGN_OR_RETURN(g->version_end, GetBounded(object, "version_end", where, 0, kMaxVersion));
  WEFT_ASSIGN_OR_RETURN(g->tokens, GetUnsigned(object, "tokens", where));
  const Json& segments = object["segments"];
  if (!segments.is_array() || segments.empty() || segments.size() > 100000) {
    return InvalidArgument(where +
                           ".segments must be a non-empty array of [version, first_token] pairs");
  }
  g->segments.clear();
  g->segments.reserve(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const Json& pair = segments[i];
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
        !pair[1].is_number_unsigned()) {
      return InvalidArgument(where + ".segments[" + std::to_string(i) +
                             "] is not a [version, first_token] pair");
    }
    g->segments.emplace_back(pair[0].get<uint64_t>(), pair[1].get<uint64_t>());
  }
  return Status::Ok();
}

std::string EncodeSubmission(const TrajectoryGroup& group) {
  return WithTrajectories(GroupFields(group), group.trajectories);
}

Result<TrajectoryGroup> DecodeSubmission(std::string_view body) {
  // The samples are checked in the same pass that finds them, and never parsed into a tree.
  std::optional<std::string_view> samples;
  WEFT_ASSIGN_OR_RETURN(Json json,
                        ParseStrictObject(body, "the request body", "trajectories", &samples));
  const std::string where = "submission";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, kGroupFields));
  if (!samples) return InvalidArgument(where + " lacks the field 'trajectories'");
  TrajectoryGroup group;
  WEFT_RETURN_IF_ERROR(ReadGroupFields(json, where, &group));
  group.trajectories = std::string(*samples);
  return group;
}

std::string Encode(SubmitResult result) {
  return Json{{"result", result == SubmitResult::kAccepted ? "accepted" : "duplicate"}}.dump();
}

Result<SubmitResult> DecodeSubmitResult(std::string_view answer) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer));
  WEFT_ASSIGN_OR_RETURN(const Json* result, Field(json, "result"));
  if (*result == "accepted") return SubmitResult::kAccepted;
  if (*result == "duplicate") return SubmitResult::kDuplicate;
  return InvalidArgument("unexpected result " + result->dump());
}

namespace {

// A non-negative number of seconds at `field`, when there and not null.
Result<std::optional<double>> GetOptionalSeconds(const Json& json, const char* field,
                                                 const std::string& where) {
  if (!json.contains(field) || json[field].is_null()) return std::optional<double>();
  const Json& value = json[field];
  if (!value.is_number() || !(value.get<double>() >= 0) || !std::isfinite(value.get<double>()))
    return InvalidArgument(where + "." + field + " is not a non-negative number of seconds");
  return std::optional<double>(value.get<double>());
}

}  // namespace

std::string EncodeAnnouncement(uint64_t version, std::optional<double> publish_seconds) {
  Json json{{"version", version}};
  if (publish_seconds) json["publish_seconds"] = *publish_seconds;
  return json.dump();
}

Result<uint64_t> DecodeAnnouncement(std::string_view body, std::optional<double>* publish_seconds) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "version", {"version"}, {"publish_seconds"}));
  WEFT_ASSIGN_OR_RETURN(std::optional<double> seconds,
                        GetOptionalSeconds(json, "publish_seconds", "announcement"));
  if (publish_seconds != nullptr) *publish_seconds = seconds;
  return GetBounded(json, "version", "version", 0, kMaxVersion);
}

std::string EncodeJobs(const std::vector<JobSpec>& jobs) {
  std::string body = "{\"prompts\":[";
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i > 0) body += ',';
    body += "{\"prompt\":" + jobs[i].prompt + ",\"samples\":" + std::to_string(jobs[i].samples);
    if (!jobs[i].metadata.empty()) body += ",\"metadata\":" + jobs[i].metadata;
    if (!jobs[i].model.empty()) body += ",\"model\":" + Json(jobs[i].model).dump();
    if (jobs[i].kind != JobKind::kGenerate)
      body += ",\"kind\":\"" + std::string(JobKindName(jobs[i].kind)) + "\"";
    if (!jobs[i].targets.empty()) body += ",\"targets\":" + jobs[i].targets;
    body += '}';
  }
  return body + "]}";
}

Result<std::vector<JobSpec>> DecodeJobs(std::string_view body) {
  // Each job's metadata (a member at depth 3) is checked with the body and cut out of it as text;
  // only when some job has metadata are the jobs' positions in the text looked up.
  bool metadata = false;
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body, Skip{3, {"metadata"}, &metadata}));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "jobs", {"prompts"}));
  const Json& prompts = json["prompts"];
  if (!prompts.is_array() || prompts.size() > 100000) {
    return InvalidArgument("jobs.prompts must be an array of at most 100000 prompts");
  }
  std::optional<std::string_view> prompts_text;
  std::vector<size_t> starts;
  if (metadata) {
    prompts_text = json_text::Member(WithoutBom(body), 0, "prompts");
    if (prompts_text) starts = json_text::Elements(*prompts_text, 0);
    if (starts.size() != prompts.size()) return InvalidArgument("jobs.prompts could not be read");
  }
  std::vector<JobSpec> jobs;
  jobs.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string where = "jobs.prompts[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(
        CheckFields(prompts[i], where, {"prompt"}, {"samples", "model", "kind", "targets"}));
    JobSpec job;
    if (prompts[i].contains("model")) {
      WEFT_ASSIGN_OR_RETURN(job.model, GetString(prompts[i], "model", where));
      WEFT_RETURN_IF_ERROR(CheckName(job.model, where + ".model"));
    }
    if (prompts[i].contains("kind")) {
      WEFT_ASSIGN_OR_RETURN(std::string kind, GetString(prompts[i], "kind", where));
      Result<JobKind> parsed = ParseJobKind(kind);
      if (!parsed.ok()) return InvalidArgument(where + ".kind: " + parsed.status().message());
      job.kind = *parsed;
    }
    WEFT_RETURN_IF_ERROR(CheckScoreJob(prompts[i], where, job.kind));
    if (prompts[i].contains("samples")) {
      Result<uint64_t> samples = GetBounded(prompts[i], "samples", where, 1, 4096);
      if (!samples.ok()) return InvalidArgument(where + ".samples must be 1 to 4096");
      job.samples = static_cast<uint32_t>(*samples);
    }
    // A prompt is token ids or text, kept as the JSON the trainer sent.
    job.prompt = prompts[i]["prompt"].dump();
    if (job.kind == JobKind::kScore) {
      job.targets = prompts[i]["targets"].dump();
      job.samples = static_cast<uint32_t>(prompts[i]["targets"].size());
    }
    if (metadata) {
      job.metadata = MetadataAt(*prompts_text, starts[i]);
      WEFT_RETURN_IF_ERROR(CheckMetadataSize(job.metadata.size(), where + ".metadata"));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Status CheckTargets(std::string_view targets, JobKind kind, const std::string& where) {
  if (kind == JobKind::kGenerate) {
    if (!targets.empty()) return InvalidArgument(where + ": a generate job has no targets");
    return Status::Ok();
  }
  const Json parsed = Json::parse(targets, nullptr, false);
  if (parsed.is_discarded()) return InvalidArgument(where + ": the targets are not JSON");
  // As the jobs route checks them (a prompt of one token id stands in for the job's own).
  return CheckScoreJob(Json{{"prompt", Json::array({uint64_t{0}})}, {"targets", parsed}}, where,
                       kind);
}

Status CheckMetadata(std::string_view text, const std::string& where) {
  WEFT_RETURN_IF_ERROR(CheckMetadataSize(text.size(), where));
  // It is spliced into answers as it is: a byte order mark would be one inside a JSON text.
  if (text.starts_with("\xEF\xBB\xBF"))
    return InvalidArgument(where + " starts with a byte order mark");
  const std::string fault = json_text::Validate(text, kMetadataDepth);
  if (!fault.empty()) return InvalidArgument(where + " is not valid JSON: " + fault);
  return Status::Ok();
}

std::string EncodeJobIds(const std::vector<uint64_t>& ids) { return Json{{"jobs", ids}}.dump(); }

Result<std::vector<uint64_t>> DecodeJobIds(std::string_view answer) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer));
  WEFT_RETURN_IF_ERROR(Field(json, "jobs").status());
  return GetIds(json, "jobs", "the answer", "job id");
}

std::string Encode(const BatchRequest& r) {
  Json json{{"max", r.max}, {"wait_ms", r.wait.count()}, {"ack", Optional(r.ack)}};
  if (r.waited_seconds) json["waited_seconds"] = *r.waited_seconds;
  return json.dump();
}

Result<BatchRequest> DecodeBatchRequest(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "batches";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, {}, {"max", "wait_ms", "ack", "waited_seconds"}));
  BatchRequest r;
  WEFT_ASSIGN_OR_RETURN(r.waited_seconds, GetOptionalSeconds(json, "waited_seconds", where));
  WEFT_RETURN_IF_ERROR(ReadPoll(json, where, 0, &r.max, &r.wait));
  if (json.contains("ack")) {
    Result<std::optional<uint64_t>> ack = GetOptionalVersion(json, "ack", where);
    if (!ack.ok()) return InvalidArgument(where + ".ack is not a batch id or null");
    r.ack = *ack;
  }
  if (r.max == 0) r.wait = std::chrono::milliseconds(0);  // an acknowledgement only
  return r;
}

std::string Encode(const Batch& batch) {
  std::string items = "[";
  for (const Delivered& d : batch.items) {
    Json fields = GroupFields(d.group);
    fields["stale"] = d.stale;
    if (!d.model.empty()) fields["model"] = d.model;
    if (d.kind != JobKind::kGenerate) fields["kind"] = JobKindName(d.kind);
    if (items.size() > 1) items += ',';
    if (d.metadata.empty()) {
      items += WithTrajectories(fields, d.group.trajectories);
    } else {
      items +=
          WithMembers(fields, {{"metadata", d.metadata}, {"trajectories", d.group.trajectories}});
    }
  }
  items += ']';
  Json head = {{"batch", batch.id},
               {"redelivered", batch.redelivered},
               {"latest_version", Optional(batch.latest_version)}};
  std::string out = head.dump();
  out.pop_back();
  return out + ",\"trajectories\":" + items + "}";
}

Result<Batch> DecodeBatch(std::string_view answer) {
  // Items are at depth 2 of the answer; their samples and metadata are members at depth 3.
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer, Skip{3, {"trajectories", "metadata"}}));
  WEFT_ASSIGN_OR_RETURN(const Json* id, Field(json, "batch"));
  WEFT_ASSIGN_OR_RETURN(const Json* list, Field(json, "trajectories"));
  if (!id->is_number_unsigned()) return InvalidArgument("'batch' is not an id");
  if (!list->is_array()) return InvalidArgument("'trajectories' is not an array");
  Batch batch;
  batch.id = id->get<uint64_t>();
  if (json.contains("redelivered") && json["redelivered"].is_boolean()) {
    batch.redelivered = json["redelivered"].get<bool>();
  }
  if (json.contains("latest_version")) {
    WEFT_ASSIGN_OR_RETURN(batch.latest_version,
                          GetOptionalVersion(json, "latest_version", "the answer"));
  }
  // The items' positions in the text, to cut their samples out.
  std::optional<std::string_view> items_text =
      json_text::Member(WithoutBom(answer), 0, "trajectories");
  const std::vector<size_t> starts =
      items_text ? json_text::Elements(*items_text, 0) : std::vector<size_t>();
  if (starts.size() != list->size()) return InvalidArgument("'trajectories' could not be read");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = "trajectories[" + std::to_string(i) + "]";
    const Json& item = (*list)[i];
    if (!item.is_object()) return InvalidArgument(where + " is not an object");
    Delivered d;
    WEFT_RETURN_IF_ERROR(ReadGroupFields(item, where, &d.group));
    if (!item.contains("stale") || !item["stale"].is_boolean()) {
      return InvalidArgument(where + ".stale is not true or false");
    }
    d.stale = item["stale"].get<bool>();
    if (item.contains("model")) {
      if (!item["model"].is_string()) return InvalidArgument(where + ".model is not a string");
      d.model = item["model"].get<std::string>();
    }
    if (item.contains("kind")) {
      if (!item["kind"].is_string()) return InvalidArgument(where + ".kind is not a string");
      WEFT_ASSIGN_OR_RETURN(d.kind, ParseJobKind(item["kind"].get<std::string>()));
    }
    std::optional<std::string_view> samples =
        json_text::Member(*items_text, starts[i], "trajectories");
    if (!samples) return InvalidArgument(where + " lacks the field 'trajectories'");
    d.group.trajectories = std::string(*samples);
    d.metadata = MetadataAt(*items_text, starts[i]);
    batch.items.push_back(std::move(d));
  }
  return batch;
}

namespace {

const char* EventKey(ClusterEvent event) {
  switch (event) {
    case ClusterEvent::kRegistered:
      return "registered";
    case ClusterEvent::kDraining:
      return "draining";
    case ClusterEvent::kReleased:
      return "released";
    case ClusterEvent::kDeregistered:
      return "deregistered";
    case ClusterEvent::kHeartbeat:
      break;
  }
  return "ok";
}

}  // namespace

std::string Encode(const ClusterAnswer& answer) {
  Json json = {{"cluster", answer.cluster}, {EventKey(answer.event), true}};
  if (answer.event == ClusterEvent::kRegistered) json["cluster_token"] = answer.cluster_token;
  return json.dump();
}

Result<ClusterAnswer> DecodeClusterAnswer(std::string_view answer, ClusterEvent event) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer));
  ClusterAnswer out;
  out.event = event;
  WEFT_ASSIGN_OR_RETURN(const Json* cluster, Field(json, "cluster"));
  if (!cluster->is_string()) return InvalidArgument("the answer's 'cluster' is not a string");
  out.cluster = cluster->get<std::string>();
  WEFT_ASSIGN_OR_RETURN(const Json* flag, Field(json, EventKey(event)));
  if (*flag != true)
    return InvalidArgument(std::string("the answer's '") + EventKey(event) + "' is not true");
  if (event == ClusterEvent::kRegistered && json.contains("cluster_token")) {
    if (!json["cluster_token"].is_string())
      return InvalidArgument("the answer's 'cluster_token' is not a string");
    out.cluster_token = json["cluster_token"].get<std::string>();
  }
  return out;
}

std::string Encode(const StatusPage& page) {
  Json clusters = Json::array();
  for (const StatusPage::Cluster& c : page.clusters) {
    Json cluster = {{"id", c.id},
                    {"region", c.region},
                    {"capacity", c.capacity},
                    {"ready_version", Optional(c.ready_version)},
                    {"state", c.state},
                    {"leases", c.leases},
                    {"completed", c.completed},
                    {"throughput_per_s", c.throughput_per_s},
                    {"seconds_since_heartbeat", c.seconds_since_heartbeat}};
    if (c.sync) cluster["sync"] = SyncReportJson(*c.sync);
    if (!c.model.empty()) cluster["model"] = c.model;
    clusters.push_back(std::move(cluster));
  }
  Json models = Json::array();  // (left out when empty, as older orchestrators do)
  for (const StatusPage::Model& m : page.models) {
    models.push_back({{"name", m.name},
                      {"digest", m.digest},
                      {"queued", m.queued},
                      {"leased", m.leased},
                      {"clusters", m.clusters},
                      {"ready", m.ready}});
  }
  Json regions = Json::object();
  for (const auto& [name, r] : page.regions) {
    regions[name] = {{"clusters", r.clusters},
                     {"ready", r.ready},
                     {"leases", r.leases},
                     {"newest_ready_version", Optional(r.newest_ready_version)},
                     {"sync", SyncReportJson(r.sync)},
                     {"capacity", r.capacity},
                     {"busy", r.busy},
                     {"utilisation", r.utilisation},
                     {"accepted", r.accepted},
                     {"delivered", r.delivered},
                     {"dropped_stale", r.dropped_stale}};
  }
  auto histogram_json = [](const std::map<uint64_t, uint64_t>& histogram) {
    Json json = Json::object();
    for (const auto& [key, count] : histogram) json[std::to_string(key)] = count;
    return json;
  };
  Json versions = Json::array();
  for (const StatusPage::Version& v : page.versions) {
    Json readiness = Json::object();
    for (const auto& [name, r] : v.regions) {
      readiness[name] = {{"population", r.population},
                         {"ready", r.ready},
                         {"ready_50_seconds", Optional(r.ready_50_seconds)},
                         {"ready_90_seconds", Optional(r.ready_90_seconds)},
                         {"ready_100_seconds", Optional(r.ready_100_seconds)},
                         {"missed", Optional(r.missed)},
                         {"sync_bytes", r.sync_bytes}};
    }
    versions.push_back({{"version", v.version},
                        {"announced_at", v.announced_at},
                        {"publish_seconds", Optional(v.publish_seconds)},
                        {"regions", std::move(readiness)}});
  }
  const StatusPage::Trainer& trainer = page.trainer;
  const StatusPage::Rates& rates = page.rates;
  const StatusPage::JobCounts& j = page.jobs;
  const StatusPage::LeaseCounts& l = page.leases;
  const StatusPage::TrajectoryCounts& t = page.trajectories;
  const StatusPage::Journal& journal = page.journal;
  Json body = {{"run", page.run},
               {"latest_version", Optional(page.latest_version)},
               {"admissible_version", page.admissible_version},
               {"max_staleness", page.max_staleness},
               {"jobs",
                {{"queued", j.queued},
                 {"leased", j.leased},
                 {"added", j.added},
                 {"done", j.done},
                 {"given_up", j.given_up}}},
               {"leases",
                {{"granted", l.granted},
                 {"expired", l.expired},
                 {"handed_back", l.handed_back},
                 {"cancelled", l.cancelled}}},
               {"clusters_lost", page.clusters_lost},
               {"trajectories",
                {{"buffered", t.buffered},
                 {"outstanding", t.outstanding},
                 {"accepted", t.accepted},
                 {"duplicate", t.duplicate},
                 {"rejected", t.rejected},
                 {"delivered_fresh", t.delivered_fresh},
                 {"delivered_stale", t.delivered_stale},
                 {"dropped_stale", t.dropped_stale}}},
               {"batches",
                {{"delivered", page.batches.delivered}, {"redelivered", page.batches.redelivered}}},
               {"buffered_by_version_start", histogram_json(page.buffered_by_version_start)},
               {"clusters", std::move(clusters)},
               {"regions", std::move(regions)},
               {"alerts", page.alerts},
               {"journal",
                {{"records", journal.records},
                 {"syncs", journal.syncs},
                 {"bytes", journal.bytes},
                 {"generation", journal.generation},
                 {"compactions", journal.compactions},
                 {"remembered_done", journal.remembered_done}}},
               {"versions", std::move(versions)},
               {"trainer",
                {{"steps_reported", trainer.steps_reported},
                 {"wait_seconds_total", trainer.wait_seconds_total},
                 {"recent_wait_seconds", trainer.recent_wait_seconds},
                 {"publishes_reported", trainer.publishes_reported},
                 {"publish_seconds_total", trainer.publish_seconds_total}}},
               {"rates",
                {{"window_seconds", rates.window_seconds},
                 {"accepted_per_s", rates.accepted_per_s},
                 {"delivered_per_s", rates.delivered_per_s},
                 {"leases_per_s", rates.leases_per_s}}},
               {"staleness", histogram_json(page.staleness)}};
  if (!models.empty()) body["models"] = std::move(models);
  // As any answer of the service: a byte that is not UTF-8 is replaced, never thrown over.
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// The members of `object` named in `fields`, every one of them a count, and no other member.
Status ReadCounts(const Json& object, const std::string& where,
                  std::initializer_list<std::pair<const char*, uint64_t*>> fields) {
  std::set<std::string> names;
  for (const auto& [name, value] : fields) names.insert(name);
  WEFT_RETURN_IF_ERROR(CheckFields(object, where, names));
  for (const auto& [name, value] : fields) {
    WEFT_ASSIGN_OR_RETURN(*value, GetUnsigned(object, name, where));
  }
  return Status::Ok();
}

Result<uint32_t> GetCount32(const Json& object, const std::string& field,
                            const std::string& where) {
  WEFT_ASSIGN_OR_RETURN(uint64_t value,
                        GetBounded(object, field, where, 0, std::numeric_limits<uint32_t>::max()));
  return static_cast<uint32_t>(value);
}

Result<double> GetNumber(const Json& object, const std::string& field, const std::string& where) {
  const Json& value = object.at(field);
  if (!value.is_number()) return InvalidArgument(where + "." + field + " is not a number");
  return value.get<double>();
}

// The members of `object` named in `fields`, every one of them a number, and no other member.
Status ReadNumbers(const Json& object, const std::string& where,
                   std::initializer_list<std::pair<const char*, double*>> fields) {
  std::set<std::string> names;
  for (const auto& [name, value] : fields) names.insert(name);
  WEFT_RETURN_IF_ERROR(CheckFields(object, where, names));
  for (const auto& [name, value] : fields) {
    WEFT_ASSIGN_OR_RETURN(*value, GetNumber(object, name, where));
  }
  return Status::Ok();
}

Result<std::optional<double>> GetOptionalNumber(const Json& object, const std::string& field,
                                                const std::string& where) {
  if (object.at(field).is_null()) return std::optional<double>();
  WEFT_ASSIGN_OR_RETURN(double value, GetNumber(object, field, where));
  return std::optional<double>(value);
}

Result<std::optional<uint64_t>> GetOptionalCount(const Json& object, const std::string& field,
                                                 const std::string& where) {
  if (object.at(field).is_null()) return std::optional<uint64_t>();
  WEFT_ASSIGN_OR_RETURN(uint64_t value, GetUnsigned(object, field, where));
  return std::optional<uint64_t>(value);
}

// An object of counts keyed by version numbers (or lags), into `out`.
Status ReadVersionHistogram(const Json& histogram, const std::string& where,
                            std::map<uint64_t, uint64_t>* out) {
  if (!histogram.is_object()) return InvalidArgument(where + " is not an object");
  for (const auto& [key, count] : histogram.items()) {
    const bool version = !key.empty() && key.size() <= 16 &&
                         key.find_first_not_of("0123456789") == std::string::npos &&
                         (key == "0" || key[0] != '0') && std::stoull(key) <= kMaxVersion;
    if (!version) return InvalidArgument(where + " has a key that is not a version");
    WEFT_ASSIGN_OR_RETURN((*out)[std::stoull(key)], GetUnsigned(histogram, key, where));
  }
  return Status::Ok();
}

Result<StatusPage::Version> DecodeStatusVersion(const Json& json, const std::string& where) {
  if (!json.is_object()) return InvalidArgument(where + " is not an object");
  WEFT_RETURN_IF_ERROR(
      CheckFields(json, where, {"version", "announced_at", "publish_seconds", "regions"}));
  StatusPage::Version v;
  WEFT_ASSIGN_OR_RETURN(v.version, GetBounded(json, "version", where, 0, kMaxVersion));
  WEFT_ASSIGN_OR_RETURN(v.announced_at, GetNumber(json, "announced_at", where));
  WEFT_ASSIGN_OR_RETURN(v.publish_seconds, GetOptionalNumber(json, "publish_seconds", where));
  const Json& regions = json["regions"];
  if (!regions.is_object()) return InvalidArgument(where + ".regions is not an object");
  for (const auto& [name, region] : regions.items()) {
    const std::string at = where + ".regions." + name;
    if (!region.is_object()) return InvalidArgument(at + " is not an object");
    WEFT_RETURN_IF_ERROR(CheckFields(region, at,
                                     {"population", "ready", "ready_50_seconds", "ready_90_seconds",
                                      "ready_100_seconds", "missed", "sync_bytes"}));
    StatusPage::Readiness& r = v.regions[name];
    WEFT_ASSIGN_OR_RETURN(r.population, GetUnsigned(region, "population", at));
    WEFT_ASSIGN_OR_RETURN(r.ready, GetUnsigned(region, "ready", at));
    WEFT_ASSIGN_OR_RETURN(r.ready_50_seconds, GetOptionalNumber(region, "ready_50_seconds", at));
    WEFT_ASSIGN_OR_RETURN(r.ready_90_seconds, GetOptionalNumber(region, "ready_90_seconds", at));
    WEFT_ASSIGN_OR_RETURN(r.ready_100_seconds, GetOptionalNumber(region, "ready_100_seconds", at));
    WEFT_ASSIGN_OR_RETURN(r.missed, GetOptionalCount(region, "missed", at));
    WEFT_ASSIGN_OR_RETURN(r.sync_bytes, GetUnsigned(region, "sync_bytes", at));
  }
  return v;
}

Result<StatusPage::Cluster> DecodeStatusCluster(const Json& json, const std::string& where) {
  WEFT_RETURN_IF_ERROR(CheckFields(json, where,
                                   {"id", "region", "capacity", "ready_version", "state", "leases",
                                    "completed", "throughput_per_s", "seconds_since_heartbeat"},
                                   {"sync", "model"}));
  StatusPage::Cluster c;
  WEFT_ASSIGN_OR_RETURN(c.id, GetString(json, "id", where));
  WEFT_ASSIGN_OR_RETURN(c.region, GetString(json, "region", where));
  if (json.contains("model")) {
    WEFT_ASSIGN_OR_RETURN(c.model, GetString(json, "model", where));
  }
  WEFT_ASSIGN_OR_RETURN(c.capacity, GetCount32(json, "capacity", where));
  WEFT_ASSIGN_OR_RETURN(c.ready_version, GetOptionalVersion(json, "ready_version", where));
  WEFT_ASSIGN_OR_RETURN(c.state, GetString(json, "state", where));
  if (c.state != "syncing" && c.state != "ready" && c.state != "draining" && c.state != "gone")
    return InvalidArgument(where + ".state is not syncing, ready, draining or gone");
  WEFT_ASSIGN_OR_RETURN(c.leases, GetCount32(json, "leases", where));
  WEFT_ASSIGN_OR_RETURN(c.completed, GetUnsigned(json, "completed", where));
  WEFT_ASSIGN_OR_RETURN(c.throughput_per_s, GetNumber(json, "throughput_per_s", where));
  WEFT_ASSIGN_OR_RETURN(c.seconds_since_heartbeat,
                        GetNumber(json, "seconds_since_heartbeat", where));
  if (json.contains("sync")) {
    WEFT_ASSIGN_OR_RETURN(c.sync, DecodeSyncReport(json["sync"], where + ".sync"));
  }
  return c;
}

Result<StatusPage::Region> DecodeStatusRegion(const Json& json, const std::string& where) {
  WEFT_RETURN_IF_ERROR(
      CheckFields(json, where,
                  {"clusters", "ready", "leases", "newest_ready_version", "sync", "capacity",
                   "busy", "utilisation", "accepted", "delivered", "dropped_stale"}));
  StatusPage::Region r;
  WEFT_ASSIGN_OR_RETURN(r.capacity, GetUnsigned(json, "capacity", where));
  WEFT_ASSIGN_OR_RETURN(r.busy, GetUnsigned(json, "busy", where));
  WEFT_ASSIGN_OR_RETURN(r.utilisation, GetNumber(json, "utilisation", where));
  WEFT_ASSIGN_OR_RETURN(r.accepted, GetUnsigned(json, "accepted", where));
  WEFT_ASSIGN_OR_RETURN(r.delivered, GetUnsigned(json, "delivered", where));
  WEFT_ASSIGN_OR_RETURN(r.dropped_stale, GetUnsigned(json, "dropped_stale", where));
  WEFT_ASSIGN_OR_RETURN(r.clusters, GetUnsigned(json, "clusters", where));
  WEFT_ASSIGN_OR_RETURN(r.ready, GetUnsigned(json, "ready", where));
  WEFT_ASSIGN_OR_RETURN(r.leases, GetUnsigned(json, "leases", where));
  WEFT_ASSIGN_OR_RETURN(r.newest_ready_version,
                        GetOptionalVersion(json, "newest_ready_version", where));
  WEFT_ASSIGN_OR_RETURN(r.sync, DecodeSyncReport(json["sync"], where + ".sync"));
  return r;
}

}  // namespace

Result<StatusPage> DecodeStatusPage(std::string_view answer, const std::string& where) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseObject(answer, where));
  WEFT_RETURN_IF_ERROR(CheckFields(
      json, where,
      {"run", "latest_version", "admissible_version", "max_staleness", "jobs", "leases",
       "clusters_lost", "trajectories", "batches", "buffered_by_version_start", "clusters",
       "regions", "alerts", "journal", "versions", "trainer", "rates", "staleness"},
      {"models"}));
  StatusPage page;
  WEFT_ASSIGN_OR_RETURN(page.run, GetString(json, "run", where));
  WEFT_ASSIGN_OR_RETURN(page.latest_version, GetOptionalVersion(json, "latest_version", where));
  WEFT_ASSIGN_OR_RETURN(page.admissible_version, GetUnsigned(json, "admissible_version", where));
  WEFT_ASSIGN_OR_RETURN(page.max_staleness, GetUnsigned(json, "max_staleness", where));
  StatusPage::JobCounts& j = page.jobs;
  WEFT_RETURN_IF_ERROR(ReadCounts(json["jobs"], where + ".jobs",
                                  {{"queued", &j.queued},
                                   {"leased", &j.leased},
                                   {"added", &j.added},
                                   {"done", &j.done},
                                   {"given_up", &j.given_up}}));
  StatusPage::LeaseCounts& l = page.leases;
  WEFT_RETURN_IF_ERROR(ReadCounts(json["leases"], where + ".leases",
                                  {{"granted", &l.granted},
                                   {"expired", &l.expired},
                                   {"handed_back", &l.handed_back},
                                   {"cancelled", &l.cancelled}}));
  WEFT_ASSIGN_OR_RETURN(page.clusters_lost, GetUnsigned(json, "clusters_lost", where));
  StatusPage::TrajectoryCounts& t = page.trajectories;
  WEFT_RETURN_IF_ERROR(ReadCounts(json["trajectories"], where + ".trajectories",
                                  {{"buffered", &t.buffered},
                                   {"outstanding", &t.outstanding},
                                   {"accepted", &t.accepted},
                                   {"duplicate", &t.duplicate},
                                   {"rejected", &t.rejected},
                                   {"delivered_fresh", &t.delivered_fresh},
                                   {"delivered_stale", &t.delivered_stale},
                                   {"dropped_stale", &t.dropped_stale}}));
  WEFT_RETURN_IF_ERROR(ReadCounts(
      json["batches"], where + ".batches",
      {{"delivered", &page.batches.delivered}, {"redelivered", &page.batches.redelivered}}));
  WEFT_RETURN_IF_ERROR(ReadVersionHistogram(json["buffered_by_version_start"],
                                            where + ".buffered_by_version_start",
                                            &page.buffered_by_version_start));
  WEFT_RETURN_IF_ERROR(
      ReadVersionHistogram(json["staleness"], where + ".staleness", &page.staleness));
  const Json& versions = json["versions"];
  if (!versions.is_array()) return InvalidArgument(where + ".versions is not an array");
  for (size_t i = 0; i < versions.size(); ++i) {
    WEFT_ASSIGN_OR_RETURN(
        StatusPage::Version version,
        DecodeStatusVersion(versions[i], where + ".versions[" + std::to_string(i) + "]"));
    page.versions.push_back(std::move(version));
  }
  const Json& trainer = json["trainer"];
  const std::string trainer_where = where + ".trainer";
  if (!trainer.is_object()) return InvalidArgument(trainer_where + " is not an object");
  WEFT_RETURN_IF_ERROR(CheckFields(trainer, trainer_where,
                                   {"steps_reported", "wait_seconds_total", "recent_wait_seconds",
                                    "publishes_reported", "publish_seconds_total"}));
  WEFT_ASSIGN_OR_RETURN(page.trainer.steps_reported,
                        GetUnsigned(trainer, "steps_reported", trainer_where));
  WEFT_ASSIGN_OR_RETURN(page.trainer.wait_seconds_total,
                        GetNumber(trainer, "wait_seconds_total", trainer_where));
  WEFT_ASSIGN_OR_RETURN(page.trainer.publishes_reported,
                        GetUnsigned(trainer, "publishes_reported", trainer_where));
  WEFT_ASSIGN_OR_RETURN(page.trainer.publish_seconds_total,
                        GetNumber(trainer, "publish_seconds_total", trainer_where));
  const Json& waits = trainer["recent_wait_seconds"];
  if (!waits.is_array() ||
      !std::all_of(waits.begin(), waits.end(), [](const Json& w) { return w.is_number(); }))
    return InvalidArgument(trainer_where + ".recent_wait_seconds is not an array of numbers");
  for (const Json& w : waits) page.trainer.recent_wait_seconds.push_back(w.get<double>());
  if (!json["rates"].is_object()) return InvalidArgument(where + ".rates is not an object");
  StatusPage::Rates& rates = page.rates;
  WEFT_RETURN_IF_ERROR(ReadNumbers(json["rates"], where + ".rates",
                                   {{"window_seconds", &rates.window_seconds},
                                    {"accepted_per_s", &rates.accepted_per_s},
                                    {"delivered_per_s", &rates.delivered_per_s},
                                    {"leases_per_s", &rates.leases_per_s}}));
  const Json& clusters = json["clusters"];
  if (!clusters.is_array()) return InvalidArgument(where + ".clusters is not an array");
  for (size_t i = 0; i < clusters.size(); ++i) {
    WEFT_ASSIGN_OR_RETURN(
        StatusPage::Cluster cluster,
        DecodeStatusCluster(clusters[i], where + ".clusters[" + std::to_string(i) + "]"));
    page.clusters.push_back(std::move(cluster));
  }
  const Json& regions = json["regions"];
  if (!regions.is_object()) return InvalidArgument(where + ".regions is not an object");
  for (const auto& [name, region] : regions.items()) {
    WEFT_ASSIGN_OR_RETURN(page.regions[name],
                          DecodeStatusRegion(region, where + ".regions." + name));
  }
  if (json.contains("models")) {
    const Json& models = json["models"];
    if (!models.is_array()) return InvalidArgument(where + ".models is not an array");
    for (size_t i = 0; i < models.size(); ++i) {
      const std::string at = where + ".models[" + std::to_string(i) + "]";
      WEFT_RETURN_IF_ERROR(
          CheckFields(models[i], at, {"name", "digest", "queued", "leased", "clusters", "ready"}));
      StatusPage::Model m;
      WEFT_ASSIGN_OR_RETURN(m.name, GetString(models[i], "name", at));
      WEFT_ASSIGN_OR_RETURN(m.digest, GetString(models[i], "digest", at));
      WEFT_ASSIGN_OR_RETURN(m.queued, GetUnsigned(models[i], "queued", at));
      WEFT_ASSIGN_OR_RETURN(m.leased, GetUnsigned(models[i], "leased", at));
      WEFT_ASSIGN_OR_RETURN(m.clusters, GetUnsigned(models[i], "clusters", at));
      WEFT_ASSIGN_OR_RETURN(m.ready, GetUnsigned(models[i], "ready", at));
      page.models.push_back(std::move(m));
    }
  }
  const Json& alerts = json["alerts"];
  if (!alerts.is_array() ||
      !std::all_of(alerts.begin(), alerts.end(), [](const Json& a) { return a.is_string(); }))
    return InvalidArgument(where + ".alerts is not an array of strings");
  for (const Json& alert : alerts) page.alerts.push_back(alert.get<std::string>());
  StatusPage::Journal& journal = page.journal;
  WEFT_RETURN_IF_ERROR(ReadCounts(json["journal"], where + ".journal",
                                  {{"records", &journal.records},
                                   {"syncs", &journal.syncs},
                                   {"bytes", &journal.bytes},
                                   {"generation", &journal.generation},
                                   {"compactions", &journal.compactions},
                                   {"remembered_done", &journal.remembered_done}}));
  return page;
}

std::string Encode(const Trajectories& trajectories) {
  Json samples = Json::array();
  for (const TrajectorySample& s : trajectories.samples) {
    Json sample = s.extra.is_object() ? s.extra : Json::object();
    sample["tokens"] = s.tokens;
    sample["logprobs"] = s.logprobs;
    if (s.reward) sample["reward"] = *s.reward;
    if (s.text) sample["text"] = *s.text;
    if (!s.segments.empty()) sample["segments"] = s.segments;
    samples.push_back(std::move(sample));
  }
  return Json{{"prompt", trajectories.prompt}, {"samples", std::move(samples)}}.dump();
}

namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;

Result<TrajectorySample> DecodeTrajectorySample(const Json& s, const std::string& at) {
  if (!s.is_object()) return InvalidArgument(at + ": not an object");
  TrajectorySample sample;
  const Json* tokens = s.contains("tokens") ? &s["tokens"] : nullptr;
  if (tokens == nullptr || !tokens->is_array() || tokens->empty())
    return InvalidArgument(at + ": tokens must be an array of at least one token id");
  for (const Json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxTokenId)
      return InvalidArgument(at + ": tokens must be integers from 0 to 2^31-1, not " + t.dump());
    sample.tokens.push_back(static_cast<int>(t.get<int64_t>()));
  }
  const Json* logprobs = s.contains("logprobs") ? &s["logprobs"] : nullptr;
  if (logprobs == nullptr || !logprobs->is_array() || logprobs->size() != tokens->size() ||
      !std::all_of(logprobs->begin(), logprobs->end(),
                   [](const Json& p) { return p.is_number(); })) {
    return InvalidArgument(at + ": " + std::to_string(tokens->size()) +
                           " tokens need as many numeric logprobs");
  }
  for (const Json& p : *logprobs) sample.logprobs.push_back(p.get<float>());
  if (s.contains("reward") && !s["reward"].is_null()) {
    if (!s["reward"].is_number() || !std::isfinite(s["reward"].get<double>()))
      return InvalidArgument(at +
                             ": reward must be a finite number, or absent (the trainer "
                             "computes it)");
    sample.reward = s["reward"].get<double>();
  }
  if (s.contains("text") && !s["text"].is_null()) {
    if (!s["text"].is_string()) return InvalidArgument(at + ": text must be a string");
    sample.text = s["text"].get<std::string>();
  }
  if (s.contains("segments") && !s["segments"].is_null()) {
    const Json& segments = s["segments"];
    const std::string bad = at + ": segments must be [version, first token] pairs within its " +
                            std::to_string(tokens->size()) + " tokens, the first at 0, in order";
    if (!segments.is_array()) return InvalidArgument(bad);
    for (const Json& pair : segments) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
          !pair[1].is_number_unsigned())
        return InvalidArgument(bad);
      const uint64_t first = pair[1].get<uint64_t>();
      if ((sample.segments.empty() ? first != 0 : first < sample.segments.back().second) ||
          first >= tokens->size())
        return InvalidArgument(bad);
      sample.segments.emplace_back(pair[0].get<uint64_t>(), first);
    }
  }
  for (const auto& [key, value] : s.items()) {
    if (key != "tokens" && key != "logprobs" && key != "reward" && key != "text" &&
        key != "segments")
      sample.extra[key] = value;
  }
  return sample;
}

}  // namespace

Result<Trajectories> DecodeTrajectories(std::string_view text, const std::string& where) {
  Result<Json> parsed = ParseStrict(text, where + ": the trajectories text");
  if (!parsed.ok()) return parsed.status();
  const Json& body = *parsed;
  if (!body.is_object() || !body.contains("prompt") || !body.contains("samples") ||
      !body["samples"].is_array()) {
    return InvalidArgument(where + ": the trajectories need a \"prompt\" and a \"samples\" array");
  }
  Trajectories out;
  out.prompt = body["prompt"];
  for (size_t i = 0; i < body["samples"].size(); ++i) {
    WEFT_ASSIGN_OR_RETURN(
        TrajectorySample sample,
        DecodeTrajectorySample(body["samples"][i], where + " sample " + std::to_string(i)));
    out.samples.push_back(std::move(sample));
  }
  return out;
}

}  // namespace weft::orchestrator::wire
