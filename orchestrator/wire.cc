#include "orchestrator/wire.h"

#include <algorithm>

#include "common/json_fields.h"
#include "common/json_text.h"
#include "common/names.h"

namespace weft::orchestrator::wire {
namespace {

using Json = nlohmann::json;

Json Optional(const std::optional<uint64_t>& value) { return value ? Json(*value) : Json(nullptr); }

// `text` as a JSON object, or kInvalidArgument. Members named "trajectories" at `skip_depth` (the
// samples of a group) are checked by the parser but left out of the tree: the caller cuts their
// text out instead (json_text).
Result<Json> ParseObject(std::string_view text, const std::string& what, int skip_depth = -1) {
  Json::parser_callback_t skip = nullptr;
  if (skip_depth >= 0) {
    skip = [skip_depth](int depth, Json::parse_event_t event, Json& parsed) {
      return !(event == Json::parse_event_t::key && depth == skip_depth && parsed.is_string() &&
               parsed.get_ref<const std::string&>() == "trajectories");
    };
  }
  WEFT_ASSIGN_OR_RETURN(Json parsed, ParseStrict(text, what, skip));
  if (!parsed.is_object()) return InvalidArgument(what + " is not a JSON object");
  return parsed;
}

Result<Json> ParseRequest(std::string_view body, int skip_depth = -1) {
  return ParseObject(body, "the request body", skip_depth);
}

Result<Json> ParseAnswer(std::string_view answer, int skip_depth = -1) {
  return ParseObject(answer, "the answer", skip_depth);
}

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

// `fields` (a dumped object) with the member "trajectories": `text` spliced in before its closing
// brace.
std::string WithTrajectories(const Json& fields, std::string_view text) {
  std::string out = fields.dump();
  out.pop_back();
  out += fields.empty() ? "\"trajectories\":" : ",\"trajectories\":";
  out += text;
  out += '}';
  return out;
}

const std::set<std::string> kGroupFields = {"job",         "attempt",  "cluster", "version_start",
                                            "version_end", "segments", "tokens"};

}  // namespace

std::string Encode(const Registration& r) {
  return Json{{"cluster", r.cluster}, {"region", r.region}, {"capacity", r.capacity}}.dump();
}

Result<Registration> DecodeRegistration(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "cluster";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, {"cluster", "region", "capacity"}));
  Registration r;
  WEFT_ASSIGN_OR_RETURN(r.cluster, GetString(json, "cluster", where));
  WEFT_ASSIGN_OR_RETURN(r.region, GetString(json, "region", where));
  WEFT_RETURN_IF_ERROR(CheckName(r.cluster, where + ".cluster"));
  WEFT_RETURN_IF_ERROR(CheckName(r.region, where + ".region"));
  WEFT_ASSIGN_OR_RETURN(uint64_t capacity, GetBounded(json, "capacity", where, 1, 1'000'000));
  r.capacity = static_cast<uint32_t>(capacity);
  return r;
}

Json SyncReportJson(const SyncReport& r) {
  return Json{{"bytes_downloaded", r.bytes_downloaded},
              {"pulls", r.pulls},
              {"keyframe_pulls", r.keyframe_pulls},
              {"digest_mismatches", r.digest_mismatches},
              {"commits", r.commits},
              {"max_pause_ms", r.max_pause_ms},
              {"first_version", Optional(r.first_version)},
              {"newest_version", Optional(r.newest_version)},
              {"digest", r.digest}};
}

Result<SyncReport> DecodeSyncReport(const Json& json, const std::string& where) {
  SyncReport r;
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
    if (json.contains(field)) {
      WEFT_ASSIGN_OR_RETURN(*value, GetOptionalVersion(json, field, where));
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

std::string EncodeLeases(const std::vector<Lease>& leases) {
  Json list = Json::array();
  for (const Lease& l : leases) {
    list.push_back({{"job", l.job},
                    {"attempt", l.attempt},
                    {"deadline_us", l.deadline},
                    {"min_version", l.min_version},
                    {"prompt", l.prompt},
                    {"samples", l.samples}});
  }
  return Json{{"leases", list}}.dump();
}

Result<std::vector<Lease>> DecodeLeases(std::string_view answer) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer));
  WEFT_ASSIGN_OR_RETURN(const Json* list, Field(json, "leases"));
  if (!list->is_array()) return InvalidArgument("'leases' is not an array");
  std::vector<Lease> leases;
  try {
    for (const Json& l : *list) {
      leases.push_back({l.at("job").get<uint64_t>(), l.at("attempt").get<uint32_t>(),
                        l.at("deadline_us").get<Micros>(), l.at("min_version").get<uint64_t>(),
                        l.at("prompt").get<std::string>(), l.at("samples").get<uint32_t>()});
    }
  } catch (const Json::exception& error) {
    return InvalidArgument(std::string("malformed lease: ") + error.what());
  }
  return leases;
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

std::string EncodeAnnouncement(uint64_t version) { return Json{{"version", version}}.dump(); }

Result<uint64_t> DecodeAnnouncement(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "version", {"version"}));
  return GetBounded(json, "version", "version", 0, kMaxVersion);
}

std::string EncodeJobs(const std::vector<JobSpec>& jobs) {
  std::string body = "{\"prompts\":[";
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i > 0) body += ',';
    body +=
        "{\"prompt\":" + jobs[i].prompt + ",\"samples\":" + std::to_string(jobs[i].samples) + "}";
  }
  return body + "]}";
}

Result<std::vector<JobSpec>> DecodeJobs(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "jobs", {"prompts"}));
  const Json& prompts = json["prompts"];
  if (!prompts.is_array() || prompts.size() > 100000) {
    return InvalidArgument("jobs.prompts must be an array of at most 100000 prompts");
  }
  std::vector<JobSpec> jobs;
  jobs.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string where = "jobs.prompts[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(CheckFields(prompts[i], where, {"prompt"}, {"samples"}));
    JobSpec job;
    if (prompts[i].contains("samples")) {
      Result<uint64_t> samples = GetBounded(prompts[i], "samples", where, 1, 4096);
      if (!samples.ok()) return InvalidArgument(where + ".samples must be 1 to 4096");
      job.samples = static_cast<uint32_t>(*samples);
    }
    // A prompt is token ids or text, kept as the JSON the trainer sent.
    job.prompt = prompts[i]["prompt"].dump();
    jobs.push_back(std::move(job));
  }
  return jobs;
}

std::string EncodeJobIds(const std::vector<uint64_t>& ids) { return Json{{"jobs", ids}}.dump(); }

Result<std::vector<uint64_t>> DecodeJobIds(std::string_view answer) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer));
  WEFT_RETURN_IF_ERROR(Field(json, "jobs").status());
  return GetIds(json, "jobs", "the answer", "job id");
}

std::string Encode(const BatchRequest& r) {
  return Json{{"max", r.max}, {"wait_ms", r.wait.count()}, {"ack", Optional(r.ack)}}.dump();
}

Result<BatchRequest> DecodeBatchRequest(std::string_view body) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseRequest(body));
  const std::string where = "batches";
  WEFT_RETURN_IF_ERROR(CheckFields(json, where, {}, {"max", "wait_ms", "ack"}));
  BatchRequest r;
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
    if (items.size() > 1) items += ',';
    items += WithTrajectories(fields, d.group.trajectories);
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
  // Items are at depth 2 of the answer; their samples are members at depth 3.
  WEFT_ASSIGN_OR_RETURN(Json json, ParseAnswer(answer, 3));
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
    std::optional<std::string_view> samples =
        json_text::Member(*items_text, starts[i], "trajectories");
    if (!samples) return InvalidArgument(where + " lacks the field 'trajectories'");
    d.group.trajectories = std::string(*samples);
    batch.items.push_back(std::move(d));
  }
  return batch;
}

}  // namespace weft::orchestrator::wire
