#include "orchestrator/durable_core.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <variant>

#include "common/byte_io.h"
#include "common/json_fields.h"
#include "common/logging.h"
#include "common/names.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {

using Json = nlohmann::json;

struct DurableCore::Outcome {
  std::vector<Lease> leases;
  SubmitResult submit = SubmitResult::kAccepted;
  std::vector<uint64_t> jobs;
  Batch batch;
  bool changed = true;  // whether the event changed the core (only then is it journaled)
};

// The core's events (docs/formats.md section 7), as applied and as journaled.
namespace events {

struct Register {
  std::string cluster, region;
  uint32_t capacity = 0;
  std::string credential;
  ModelRef model;
};
struct Heartbeat {
  std::string cluster;
  std::optional<uint64_t> ready;
};
struct Drain {
  std::string cluster;
  std::vector<uint64_t> jobs;
  bool stop_leasing = true;  // false: a release (journaled as "stop": false; absent: true)
};
struct Deregister {
  std::string cluster;
};
struct Leases {
  std::string cluster;
  uint32_t max = 0;
  uint64_t request = 0;
};
struct Submit {
  TrajectoryGroup group;
};
struct Announce {
  uint64_t version = 0;
};
struct Jobs {
  std::vector<JobSpec> jobs;
};
struct TakeBatch {
  size_t max = 0;
  std::optional<uint64_t> ack;
};
struct Tick {};

}  // namespace events

struct DurableCore::Event {
  Micros now = 0;
  std::variant<events::Register, events::Heartbeat, events::Drain, events::Deregister,
               events::Leases, events::Submit, events::Announce, events::Jobs, events::TakeBatch,
               events::Tick>
      what;
};

namespace {

Json Optional(const std::optional<uint64_t>& value) { return value ? Json(*value) : Json(nullptr); }

template <typename... Fns>
struct Overloaded : Fns... {
  using Fns::operator()...;
};
template <typename... Fns>
Overloaded(Fns...) -> Overloaded<Fns...>;

}  // namespace

// One line of JSON with the event's kind `e` and time `t`; a submission's samples follow the line
// as they came, neither escaped nor parsed on the way through.
std::string DurableCore::EventText(const Event& event) {
  Json e;
  const std::string* samples = nullptr;
  std::visit(Overloaded{
                 [&](const events::Register& r) {
                   e = {{"e", "register"},
                        {"cluster", r.cluster},
                        {"region", r.region},
                        {"capacity", r.capacity}};
                   if (!r.credential.empty()) e["credential"] = r.credential;
                   if (r.model.fixed()) {
                     e["model"] = r.model.name;
                     e["model_digest"] = r.model.digest;
                   }
                 },
                 [&](const events::Heartbeat& h) {
                   e = {{"e", "heartbeat"}, {"cluster", h.cluster}, {"ready", Optional(h.ready)}};
                 },
                 [&](const events::Drain& d) {
                   e = {{"e", "drain"}, {"cluster", d.cluster}, {"jobs", d.jobs}};
                   if (!d.stop_leasing) e["stop"] = false;
                 },
                 [&](const events::Deregister& d) {
                   e = {{"e", "deregister"}, {"cluster", d.cluster}};
                 },
                 [&](const events::Leases& l) {
                   e = {{"e", "leases"}, {"cluster", l.cluster}, {"max", l.max}};
                   if (l.request != 0) e["request"] = l.request;
                 },
                 [&](const events::Submit& s) {
                   e = wire::GroupFields(s.group);
                   e["e"] = "submit";
                   samples = &s.group.trajectories;
                 },
                 [&](const events::Announce& a) {
                   e = {{"e", "announce"}, {"version", a.version}};
                 },
                 [&](const events::Jobs& j) {
                   Json prompts = Json::array();
                   for (const JobSpec& job : j.jobs) {
                     Json entry = {job.prompt, job.samples};
                     wire::AppendJobTail(entry, job.metadata, job.model, job.kind, job.targets);
                     prompts.push_back(std::move(entry));
                   }
                   e = {{"e", "jobs"}, {"prompts", std::move(prompts)}};
                 },
                 [&](const events::TakeBatch& b) {
                   e = {{"e", "batch"}, {"max", b.max}, {"ack", Optional(b.ack)}};
                 },
                 [&](const events::Tick&) {
                   e = {{"e", "tick"}};
                 },
             },
             event.what);
  e["t"] = event.now;
  // (Names are checked before they get here; a byte that is not UTF-8 is replaced all the same.)
  std::string text = e.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (samples != nullptr) {
    text.reserve(text.size() + 1 + samples->size());
    text += '\n';
    text += *samples;
  }
  return text;
}

Result<DurableCore::Event> DurableCore::ParseEvent(std::string_view text) {
  const size_t newline = text.find('\n');
  const std::string_view head = text.substr(0, newline);
  Json e = Json::parse(head, nullptr, false);
  if (e.is_discarded() || !e.is_object() || !e.contains("e") || !e.contains("t") ||
      !AllIntegers(e)) {
    return InvalidArgument("malformed journal event");
  }
  Event event;
  try {
    const std::string kind = e["e"].get<std::string>();
    event.now = e["t"].get<Micros>();
    if (event.now < 0 || event.now > kMaxMicros)
      return InvalidArgument("journal event at time " + std::to_string(event.now) +
                             ", out of range");
    if (kind == "register") {
      events::Register r{e["cluster"], e["region"], e["capacity"].get<uint32_t>(),
                         e.value("credential", std::string()), ModelRef{}};
      if (e.contains("model")) {  // older journals: the policy only
        r.model = {e["model"].get<std::string>(), e["model_digest"].get<std::string>()};
      }
      event.what = std::move(r);
    } else if (kind == "heartbeat") {
      std::optional<uint64_t> ready;
      if (!e["ready"].is_null()) ready = e["ready"].get<uint64_t>();
      event.what = events::Heartbeat{e["cluster"], ready};
    } else if (kind == "drain") {
      event.what = events::Drain{e["cluster"], e["jobs"].get<std::vector<uint64_t>>(),
                                 !e.contains("stop") || e["stop"].get<bool>()};
    } else if (kind == "deregister") {
      event.what = events::Deregister{e["cluster"]};
    } else if (kind == "leases") {
      const uint64_t request = e.contains("request") ? e["request"].get<uint64_t>() : 0;
      event.what = events::Leases{e["cluster"], e["max"].get<uint32_t>(), request};
    } else if (kind == "submit") {
      if (newline == std::string_view::npos) {
        return InvalidArgument("submission event without its payload");
      }
      events::Submit submit;
      WEFT_RETURN_IF_ERROR(wire::ReadGroupFields(e, "submission event", &submit.group));
      submit.group.trajectories = std::string(text.substr(newline + 1));
      event.what = std::move(submit);
    } else if (kind == "announce") {
      event.what = events::Announce{e["version"].get<uint64_t>()};
    } else if (kind == "jobs") {
      events::Jobs jobs;
      if (!e.at("prompts").is_array())
        return InvalidArgument("journal event 'jobs': prompts is not an array");
      for (const Json& entry : e.at("prompts")) {
        // [prompt, samples], the job's metadata when it has some (none in older journals), and
        // its model, kind and targets when not the policy's generate job (older: never).
        if (!entry.is_array() || (entry.size() != 2 && entry.size() != 3 && entry.size() != 6))
          return InvalidArgument(
              "journal event 'jobs': a job is not [prompt, samples, metadata, model, kind, "
              "targets]");
        JobSpec job{entry[0].get<std::string>(), entry[1].get<uint32_t>()};
        if (entry.size() >= 3 && !entry[2].get<std::string>().empty()) {
          job.metadata = entry[2].get<std::string>();
          WEFT_RETURN_IF_ERROR(wire::CheckMetadata(job.metadata, "journal event 'jobs': metadata"));
        }
        if (entry.size() == 6) {
          job.model = entry[3].get<std::string>();
          if (!job.model.empty())
            WEFT_RETURN_IF_ERROR(CheckName(job.model, "journal event 'jobs': model"));
          WEFT_ASSIGN_OR_RETURN(job.kind, wire::ParseJobKind(entry[4].get<std::string>()));
          job.targets = entry[5].get<std::string>();
          WEFT_RETURN_IF_ERROR(
              wire::CheckTargets(job.targets, job.kind, "journal event 'jobs': targets"));
        }
        jobs.jobs.push_back(std::move(job));
      }
      event.what = std::move(jobs);
    } else if (kind == "batch") {
      std::optional<uint64_t> ack;
      if (e.contains("ack") && !e["ack"].is_null()) ack = e["ack"].get<uint64_t>();
      event.what = events::TakeBatch{e["max"].get<size_t>(), ack};
    } else if (kind == "tick") {
      event.what = events::Tick{};
    } else {
      return InvalidArgument("unknown journal event '" + kind + "'");
    }
  } catch (const Json::exception& error) {
    return InvalidArgument(std::string("malformed journal event: ") + error.what());
  }
  return event;
}

Status DurableCore::Apply(Event event, Outcome* out) {
  const Micros now = event.now;
  OrchestratorCore* core = &core_;  // (held here; the lambdas below are not told so)
  return std::visit(
      Overloaded{
          [&](events::Register& r) {
            return core->Register(now, r.cluster, r.region, r.capacity, r.credential, r.model);
          },
          [&](events::Heartbeat& h) { return core->Heartbeat(now, h.cluster, h.ready); },
          [&](events::Drain& d) { return core->Drain(now, d.cluster, d.jobs, d.stop_leasing); },
          [&](events::Deregister& d) { return core->Deregister(now, d.cluster); },
          [&](events::Leases& l) -> Status {
            WEFT_ASSIGN_OR_RETURN(out->leases,
                                  core->RequestLeases(now, l.cluster, l.max, l.request));
            out->changed = !out->leases.empty();
            return Status::Ok();
          },
          [&](events::Submit& s) -> Status {
            WEFT_ASSIGN_OR_RETURN(out->submit, core->Submit(now, std::move(s.group)));
            out->changed = out->submit == SubmitResult::kAccepted;  // a duplicate changes nothing
            return Status::Ok();
          },
          [&](events::Announce& a) { return core->AnnounceVersion(now, a.version); },
          [&](events::Jobs& j) {
            out->jobs = core->AddJobs(now, j.jobs);
            return Status::Ok();
          },
          [&](events::TakeBatch& b) {
            const size_t buffered = core->buffered();
            out->batch = core->TakeBatch(now, b.max, b.ack);
            // Journaled when it acknowledged, handed out a batch (a redelivery re-judges
            // staleness, and is rare) or dropped stale trajectories.
            out->changed =
                out->batch.acknowledged > 0 || out->batch.id != 0 || core->buffered() != buffered;
            return Status::Ok();
          },
          [&](events::Tick&) {
            out->changed = core->Tick(now);
            return Status::Ok();
          },
      },
      event.what);
}

namespace {

// Format 2: groups stored as their API fields (format 1 listed them positionally).
constexpr char kSnapshotMagic[8] = {'W', 'E', 'F', 'T', 'S', 'N', 'P', '2'};
constexpr size_t kSnapshotHeader = 8 + 8 + 8 + 8;  // magic, generation, length, XXH64

}  // namespace

std::string DurableCore::JournalPath(uint64_t generation) const {
  return generation == 0 ? base_ : base_ + "." + std::to_string(generation);
}

std::string DurableCore::SnapshotPath(uint64_t generation) const {
  return base_ + ".snapshot." + std::to_string(generation);
}

Result<std::vector<uint64_t>> DurableCore::Generations(const std::string& prefix) const {
  std::vector<uint64_t> found;
  const size_t slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash);
  const std::string name = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
  Result<std::vector<DirectoryEntry>> entries = env_.ListDirectory(dir);
  if (!entries.ok() && entries.status().code() == StatusCode::kNotFound) return found;
  if (!entries.ok()) return entries.status();
  for (const DirectoryEntry& entry : *entries) {
    const std::string& file = entry.name;
    if (file.size() <= name.size() || file.compare(0, name.size(), name) != 0) continue;
    const std::string digits = file.substr(name.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    found.push_back(std::stoull(digits));
  }
  std::sort(found.begin(), found.end());
  return found;
}

// A crash can leave only a temporary file, never a partial snapshot, but a damaged disk can.
Result<std::string> DurableCore::ReadSnapshot(uint64_t generation) const {
  const std::string path = SnapshotPath(generation);
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, env_.ReadFile(path));
  ByteReader reader(bytes);
  std::span<const uint8_t> magic;
  uint64_t stored_generation = 0, length = 0, hash = 0;
  if (!reader.Bytes(sizeof(kSnapshotMagic), &magic) ||
      std::memcmp(magic.data(), kSnapshotMagic, sizeof(kSnapshotMagic)) != 0 ||
      !reader.U64(&stored_generation) || !reader.U64(&length) || !reader.U64(&hash)) {
    return DataLoss(path + " is not a weft orchestrator snapshot (bad magic or header)");
  }
  if (stored_generation != generation)
    return DataLoss(path + " holds generation " + std::to_string(stored_generation));
  if (length != reader.remaining()) return DataLoss(path + " is truncated");
  if (XXH64(bytes.data() + kSnapshotHeader, length, 0) != hash)
    return DataLoss(path + " is corrupted (hash mismatch)");
  return std::string(bytes.begin() + kSnapshotHeader, bytes.end());
}

Result<std::unique_ptr<DurableCore>> DurableCore::Open(const std::string& journal_path,
                                                       const CoreConfig& config) {
  return Open(journal_path, config, Options{});
}

Result<std::unique_ptr<DurableCore>> DurableCore::Open(const std::string& journal_path,
                                                       const CoreConfig& config, Options options) {
  std::unique_ptr<DurableCore> durable(new DurableCore(journal_path, config, options));
  // The newest intact snapshot; an older one serves when a crash came before the newest was
  // complete (its journals are still there: they go only once a newer snapshot is durable).
  uint64_t start = 0;
  WEFT_ASSIGN_OR_RETURN(std::vector<uint64_t> snapshots,
                        durable->Generations(journal_path + ".snapshot."));
  for (auto g = snapshots.rbegin(); g != snapshots.rend(); ++g) {
    Result<std::string> state = durable->ReadSnapshot(*g);
    if (!state.ok()) {
      WEFT_LOG(kWarning) << state.status().message() << "; trying an older snapshot";
      continue;
    }
    Result<OrchestratorCore> restored = OrchestratorCore::Restore(config, *state);
    if (!restored.ok()) return restored.status().WithContext(durable->SnapshotPath(*g));
    MutexLock lock(durable->mutex_);
    durable->core_ = std::move(restored).value();
    durable->fresh_ = false;
    start = *g;
    break;
  }
  Env& env = durable->env_;
  WEFT_ASSIGN_OR_RETURN(const bool first_journal, env.Exists(journal_path));
  if (start == 0 && !snapshots.empty() && !first_journal) {
    return DataLoss("no intact snapshot of " + journal_path +
                    " and its first journal is gone: the state cannot be rebuilt");
  }
  // Every journal from that generation on, in order; the last one stays open for appending. Each
  // must be there: a journal is created (and synced) before its generation's snapshot is written
  // and before any later journal, so a missing one means acknowledged events are gone.
  uint64_t last = start;
  WEFT_ASSIGN_OR_RETURN(std::vector<uint64_t> journals, durable->Generations(journal_path + "."));
  for (uint64_t g : journals) last = std::max(last, g);
  const bool anything = !snapshots.empty() || last > 0 || first_journal;
  for (uint64_t g = start; anything && g <= last; ++g) {
    WEFT_ASSIGN_OR_RETURN(const bool there, env.Exists(durable->JournalPath(g)));
    if (!there) {
      return DataLoss("the journal " + durable->JournalPath(g) + " of generation " +
                      std::to_string(g) + " is missing, yet " +
                      (g < last ? "the journal of generation " + std::to_string(last)
                                : "the snapshot " + durable->SnapshotPath(start)) +
                      " exists: the events acknowledged in it would be lost (restore the file "
                      "from a backup)");
    }
  }
  auto replay = [&](std::string_view record) {
    Outcome ignored;
    ++durable->replayed_;
    // Only accepted events were journaled: one the core refuses now means the journal and this
    // build disagree, and continuing would diverge from what was acknowledged.
    WEFT_ASSIGN_OR_RETURN(Event event, ParseEvent(record));
    MutexLock lock(durable->mutex_);
    return durable->Apply(std::move(event), &ignored);
  };
  for (uint64_t g = start; g < last; ++g)
    WEFT_RETURN_IF_ERROR(Journal::Replay(durable->JournalPath(g), replay, env));
  WEFT_ASSIGN_OR_RETURN(durable->journal_, Journal::Open(durable->JournalPath(last), replay, env));
  durable->generation_ = last;
  if (durable->replayed_ > 0) durable->fresh_ = false;
  durable->DeleteBefore(start);
  return durable;
}

void DurableCore::DeleteBefore(uint64_t generation) const {
  // (A file left behind, or a directory that cannot be read now, is dealt with by the next
  // compaction or restart.)
  if (Result<std::vector<uint64_t>> found = Generations(base_ + ".snapshot."); found.ok()) {
    for (uint64_t g : *found)
      if (g < generation) (void)env_.Remove(SnapshotPath(g));
  }
  if (Result<std::vector<uint64_t>> found = Generations(base_ + "."); found.ok()) {
    for (uint64_t g : *found)
      if (g < generation) (void)env_.Remove(JournalPath(g));
  }
  if (generation > 0) (void)env_.Remove(JournalPath(0));
}

Status DurableCore::Compact() {
  std::string state;
  uint64_t generation = 0, rotation = 0;
  {
    MutexLock lock(mutex_);
    state = core_.Snapshot();
    generation = generation_ + 1;
    // Events from here on go to the new generation's journal: the snapshot holds all before.
    WEFT_ASSIGN_OR_RETURN(rotation, journal_->Rotate(JournalPath(generation)));
    generation_ = generation;
  }
  WEFT_RETURN_IF_ERROR(journal_->Wait(rotation));
  std::vector<uint8_t> header;
  ByteWriter writer(&header);
  writer.Bytes({reinterpret_cast<const uint8_t*>(kSnapshotMagic), sizeof(kSnapshotMagic)});
  writer.U64(generation);
  writer.U64(state.size());
  writer.U64(XXH64(state.data(), state.size(), 0));
  const std::span<const uint8_t> parts[] = {header, TextBytes(state)};
  WEFT_RETURN_IF_ERROR(env_.WriteAtomic(SnapshotPath(generation), parts));
  DeleteBefore(generation);
  ++compactions_;
  return Status::Ok();
}

Status DurableCore::Record(Event event, Outcome* outcome, bool wait, Durable durable) {
  uint64_t sequence = 0;
  {
    MutexLock lock(mutex_);
    std::string text = EventText(event);
    // A refused request changes nothing: what the journal would not take is refused first.
    WEFT_RETURN_IF_ERROR(journal_->Admits(text.size()));
    WEFT_RETURN_IF_ERROR(Apply(std::move(event), outcome));
    if (durable) {
      // Nothing new: what it saw (a duplicate's original) must be durable before the answer.
      return outcome->changed ? journal_->EnqueueThen(std::move(text), std::move(durable))
                              : journal_->WhenDurable(std::move(durable));
    }
    if (outcome->changed) {
      WEFT_ASSIGN_OR_RETURN(sequence, journal_->Enqueue(std::move(text)));
    } else {
      sequence = journal_->records();
    }
  }
  return wait ? journal_->Wait(sequence) : Status::Ok();
}

void DurableCore::SubmitAsync(Micros now, TrajectoryGroup group,
                              std::function<void(Result<SubmitResult>)> done) {
  // The outcome is filled in before the callback can run (the event is applied before it is
  // queued), and read by it.
  auto out = std::make_shared<Outcome>();
  Status status = Record({now, events::Submit{std::move(group)}}, out.get(), false,
                         [done, out](Status durable) {
                           if (durable.ok()) {
                             done(out->submit);
                           } else {
                             done(durable);
                           }
                         });
  if (!status.ok()) done(status);
}

Status DurableCore::Register(Micros now, const std::string& cluster, const std::string& region,
                             uint32_t capacity, const std::string& credential, Durable durable,
                             const ModelRef& model) {
  Outcome out;
  return Record({now, events::Register{cluster, region, capacity, credential, model}}, &out, true,
                std::move(durable));
}

Status DurableCore::Heartbeat(Micros now, const std::string& cluster,
                              std::optional<uint64_t> ready_version) {
  Outcome out;
  return Record({now, events::Heartbeat{cluster, ready_version}}, &out, false);
}

Status DurableCore::Drain(Micros now, const std::string& cluster, const std::vector<uint64_t>& jobs,
                          bool stop_leasing, Durable durable) {
  Outcome out;
  return Record({now, events::Drain{cluster, jobs, stop_leasing}}, &out, true, std::move(durable));
}

Status DurableCore::Deregister(Micros now, const std::string& cluster, Durable durable) {
  Outcome out;
  return Record({now, events::Deregister{cluster}}, &out, true, std::move(durable));
}

Result<std::vector<Lease>> DurableCore::RequestLeases(Micros now, const std::string& cluster,
                                                      uint32_t max, uint64_t request) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record({now, events::Leases{cluster, max, request}}, &out, false));
  return std::move(out.leases);
}

Result<LeaseAnswer> DurableCore::AnswerLeaseRequest(Micros now, const std::string& cluster,
                                                    uint32_t max, uint64_t request) {
  LeaseAnswer answer;
  WEFT_ASSIGN_OR_RETURN(answer.leases, RequestLeases(now, cluster, max, request));
  answer.latest_version = Inspect([](const OrchestratorCore& c) { return c.latest_version(); });
  return answer;
}

Result<SubmitResult> DurableCore::Submit(Micros now, TrajectoryGroup group) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record({now, events::Submit{std::move(group)}}, &out));
  return out.submit;
}

Status DurableCore::AnnounceVersion(Micros now, uint64_t version, Durable durable) {
  Outcome out;
  return Record({now, events::Announce{version}}, &out, true, std::move(durable));
}

Result<std::vector<uint64_t>> DurableCore::AddJobs(Micros now, const std::vector<JobSpec>& jobs,
                                                   Durable durable) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record({now, events::Jobs{jobs}}, &out, true, std::move(durable)));
  return std::move(out.jobs);
}

Result<Batch> DurableCore::TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack,
                                     Durable durable) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record({now, events::TakeBatch{max, ack}}, &out, true, std::move(durable)));
  return std::move(out.batch);
}

Status DurableCore::Tick(Micros now, bool wait) {
  Outcome out;
  WEFT_RETURN_IF_ERROR(Record({now, events::Tick{}}, &out, wait));
  if (!wait) return Status::Ok();
  // Lease grants and heartbeats not yet on disk get there now, even when nothing else is written.
  return journal_->Wait(journal_->records());
}

}  // namespace weft::orchestrator
