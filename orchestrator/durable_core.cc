#include "orchestrator/durable_core.h"

#include <nlohmann/json.hpp>

namespace weft::orchestrator {

using Json = nlohmann::json;

struct DurableCore::Outcome {
  std::vector<Lease> leases;
  SubmitResult submit = SubmitResult::kAccepted;
  std::vector<uint64_t> jobs;
  Batch batch;
  bool changed = true;  // for ticks: whether to journal
};

Status DurableCore::ApplyEvent(const std::string& text, Outcome* out) {
  // The event's JSON, then (submissions only) a newline and the trajectories as they came: large
  // payloads are neither escaped nor parsed on the way through.
  const size_t newline = text.find('\n');
  const std::string_view head = newline == std::string::npos ? std::string_view(text) : std::string_view(text).substr(0, newline);
  Json e = Json::parse(head, nullptr, false);
  if (e.is_discarded() || !e.is_object() || !e.contains("e") || !e.contains("t")) return InvalidArgument("malformed journal event");
  try {
    const std::string kind = e["e"].get<std::string>();
    const Micros now = e["t"].get<Micros>();
    if (kind == "register") return core_.Register(now, e["cluster"], e["region"], e["capacity"].get<uint32_t>());
    if (kind == "heartbeat") {
      std::optional<uint64_t> ready;
      if (!e["ready"].is_null()) ready = e["ready"].get<uint64_t>();
      return core_.Heartbeat(now, e["cluster"], ready);
    }
    if (kind == "drain") return core_.Drain(now, e["cluster"], e["jobs"].get<std::vector<uint64_t>>());
    if (kind == "deregister") return core_.Deregister(now, e["cluster"]);
    if (kind == "leases") {
      WEFT_ASSIGN_OR_RETURN(out->leases, core_.RequestLeases(now, e["cluster"], e["max"].get<uint32_t>()));
      out->changed = !out->leases.empty();
      return Status::Ok();
    }
    if (kind == "submit") {
      Submission s;
      s.job = e["job"];
      s.attempt = e["attempt"];
      s.cluster = e["cluster"];
      s.version_start = e["version_start"];
      s.version_end = e["version_end"];
      s.segments = e["segments"].get<std::vector<std::pair<uint64_t, uint64_t>>>();
      s.tokens = e["tokens"];
      if (newline == std::string::npos) return InvalidArgument("submission event without its payload");
      s.payload = text.substr(newline + 1);
      WEFT_ASSIGN_OR_RETURN(out->submit, core_.Submit(now, std::move(s)));
      out->changed = out->submit == SubmitResult::kAccepted;  // a duplicate changes nothing
      return Status::Ok();
    }
    if (kind == "announce") return core_.AnnounceVersion(now, e["version"].get<uint64_t>());
    if (kind == "jobs") {
      out->jobs = core_.AddJobs(now, e["prompts"].get<std::vector<std::pair<std::string, uint32_t>>>());
      return Status::Ok();
    }
    if (kind == "batch") {
      const size_t buffered = core_.buffered();
      std::optional<uint64_t> ack;
      if (e.contains("ack") && !e["ack"].is_null()) ack = e["ack"].get<uint64_t>();
      out->batch = core_.TakeBatch(now, e["max"].get<size_t>(), ack);
      // Journaled when it acknowledged, handed out a new batch or dropped stale trajectories.
      out->changed = out->batch.acknowledged > 0 || (out->batch.id != 0 && !out->batch.redelivered) || core_.buffered() != buffered;
      return Status::Ok();
    }
    if (kind == "tick") {
      out->changed = core_.Tick(now);
      return Status::Ok();
    }
    return InvalidArgument("unknown journal event '" + kind + "'");
  } catch (const Json::exception& error) {
    return InvalidArgument(std::string("malformed journal event: ") + error.what());
  }
}

Result<std::unique_ptr<DurableCore>> DurableCore::Open(const std::string& journal_path, const CoreConfig& config) {
  std::unique_ptr<DurableCore> durable(new DurableCore(config));
  WEFT_ASSIGN_OR_RETURN(durable->journal_, Journal::Open(journal_path, [&](std::string_view record) {
    Outcome ignored;
    ++durable->replayed_;
    // Only accepted events were journaled: one the core refuses now means the journal and this
    // build disagree, and continuing would diverge from what was acknowledged.
    return durable->ApplyEvent(std::string(record), &ignored);
  }));
  return durable;
}

Status DurableCore::Record(const std::string& event, Outcome* outcome, bool wait) {
  uint64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_RETURN_IF_ERROR(ApplyEvent(event, outcome));
    if (outcome->changed) {
      WEFT_ASSIGN_OR_RETURN(sequence, journal_->Enqueue(event));
    } else {
      sequence = journal_->records();  // nothing new, but what it saw (a duplicate's original) must be durable
    }
  }
  return wait ? journal_->Wait(sequence) : Status::Ok();
}

void DurableCore::SubmitAsync(Micros now, Submission s, std::function<void(Result<SubmitResult>)> done) {
  const std::string event = SubmitEvent(now, s);
  Outcome out;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status = ApplyEvent(event, &out);
    if (status.ok()) {
      auto answer = [done, result = out.submit](Status durable) {
        if (durable.ok()) {
          done(result);
        } else {
          done(durable);
        }
      };
      status = out.changed ? journal_->EnqueueThen(event, answer) : journal_->WhenDurable(answer);
      if (status.ok()) return;
    }
  }
  done(status);
}

std::string DurableCore::SubmitEvent(Micros now, const Submission& s) {
  Json e = {{"e", "submit"}, {"t", now}};
  e["job"] = s.job;
  e["attempt"] = s.attempt;
  e["cluster"] = s.cluster;
  e["version_start"] = s.version_start;
  e["version_end"] = s.version_end;
  e["segments"] = s.segments;
  e["tokens"] = s.tokens;
  return e.dump() + "\n" + s.payload;
}

namespace {

Json Event(const char* kind, Micros now) { return Json{{"e", kind}, {"t", now}}; }

}  // namespace

Status DurableCore::Register(Micros now, const std::string& cluster, const std::string& region, uint32_t capacity) {
  Json e = Event("register", now);
  e["cluster"] = cluster;
  e["region"] = region;
  e["capacity"] = capacity;
  Outcome out;
  return Record(e.dump(), &out);
}

Status DurableCore::Heartbeat(Micros now, const std::string& cluster, std::optional<uint64_t> ready_version) {
  Json e = Event("heartbeat", now);
  e["cluster"] = cluster;
  e["ready"] = ready_version ? Json(*ready_version) : Json(nullptr);
  Outcome out;
  return Record(e.dump(), &out, false);
}

Status DurableCore::Drain(Micros now, const std::string& cluster, const std::vector<uint64_t>& jobs) {
  Json e = Event("drain", now);
  e["cluster"] = cluster;
  e["jobs"] = jobs;
  Outcome out;
  return Record(e.dump(), &out);
}

Status DurableCore::Deregister(Micros now, const std::string& cluster) {
  Json e = Event("deregister", now);
  e["cluster"] = cluster;
  Outcome out;
  return Record(e.dump(), &out);
}

Result<std::vector<Lease>> DurableCore::RequestLeases(Micros now, const std::string& cluster, uint32_t max) {
  Json e = Event("leases", now);
  e["cluster"] = cluster;
  e["max"] = max;
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record(e.dump(), &out, false));
  return std::move(out.leases);
}

Result<SubmitResult> DurableCore::Submit(Micros now, Submission s) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record(SubmitEvent(now, s), &out));
  return out.submit;
}

Status DurableCore::AnnounceVersion(Micros now, uint64_t version) {
  Json e = Event("announce", now);
  e["version"] = version;
  Outcome out;
  return Record(e.dump(), &out);
}

Result<std::vector<uint64_t>> DurableCore::AddJobs(Micros now, const std::vector<std::pair<std::string, uint32_t>>& prompts) {
  Json e = Event("jobs", now);
  e["prompts"] = prompts;
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record(e.dump(), &out));
  return std::move(out.jobs);
}

Result<Batch> DurableCore::TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack) {
  Json e = Event("batch", now);
  e["max"] = max;
  e["ack"] = ack ? Json(*ack) : Json(nullptr);
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record(e.dump(), &out));
  return std::move(out.batch);
}

Status DurableCore::Tick(Micros now) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record(Event("tick", now).dump(), &out));
  // Lease grants and heartbeats not yet on disk get there now, even when nothing else is written.
  return journal_->Wait(journal_->records());
}

}  // namespace weft::orchestrator
