#include "orchestrator/durable_core.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/byte_io.h"
#include "common/file_util.h"
#include "common/logging.h"

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
  const std::string_view head = newline == std::string::npos
                                    ? std::string_view(text)
                                    : std::string_view(text).substr(0, newline);
  Json e = Json::parse(head, nullptr, false);
  if (e.is_discarded() || !e.is_object() || !e.contains("e") || !e.contains("t"))
    return InvalidArgument("malformed journal event");
  try {
    const std::string kind = e["e"].get<std::string>();
    const Micros now = e["t"].get<Micros>();
    if (kind == "register")
      return core_.Register(now, e["cluster"], e["region"], e["capacity"].get<uint32_t>());
    if (kind == "heartbeat") {
      std::optional<uint64_t> ready;
      if (!e["ready"].is_null()) ready = e["ready"].get<uint64_t>();
      return core_.Heartbeat(now, e["cluster"], ready);
    }
    if (kind == "drain")
      return core_.Drain(now, e["cluster"], e["jobs"].get<std::vector<uint64_t>>());
    if (kind == "deregister") return core_.Deregister(now, e["cluster"]);
    if (kind == "leases") {
      const uint64_t request = e.contains("request") ? e["request"].get<uint64_t>() : 0;
      WEFT_ASSIGN_OR_RETURN(
          out->leases, core_.RequestLeases(now, e["cluster"], e["max"].get<uint32_t>(), request));
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
      if (newline == std::string::npos)
        return InvalidArgument("submission event without its payload");
      s.payload = text.substr(newline + 1);
      WEFT_ASSIGN_OR_RETURN(out->submit, core_.Submit(now, std::move(s)));
      out->changed = out->submit == SubmitResult::kAccepted;  // a duplicate changes nothing
      return Status::Ok();
    }
    if (kind == "announce") return core_.AnnounceVersion(now, e["version"].get<uint64_t>());
    if (kind == "jobs") {
      out->jobs =
          core_.AddJobs(now, e["prompts"].get<std::vector<std::pair<std::string, uint32_t>>>());
      return Status::Ok();
    }
    if (kind == "batch") {
      const size_t buffered = core_.buffered();
      std::optional<uint64_t> ack;
      if (e.contains("ack") && !e["ack"].is_null()) ack = e["ack"].get<uint64_t>();
      out->batch = core_.TakeBatch(now, e["max"].get<size_t>(), ack);
      // Journaled when it acknowledged, handed out a batch (a redelivery re-judges staleness, and
      // is rare) or dropped stale trajectories.
      out->changed =
          out->batch.acknowledged > 0 || out->batch.id != 0 || core_.buffered() != buffered;
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

namespace {

constexpr char kSnapshotMagic[8] = {'W', 'E', 'F', 'T', 'S', 'N', 'P', '1'};
constexpr size_t kSnapshotHeader = 8 + 8 + 8 + 8;  // magic, generation, length, XXH64

// Generation numbers of the files named `prefix` followed by a number in `prefix`'s directory.
std::vector<uint64_t> Generations(const std::string& prefix) {
  std::vector<uint64_t> found;
  const std::filesystem::path base(prefix);
  const std::filesystem::path dir =
      base.has_parent_path() ? base.parent_path() : std::filesystem::path(".");
  const std::string name = base.filename().string();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    if (file.size() <= name.size() || file.compare(0, name.size(), name) != 0) continue;
    const std::string digits = file.substr(name.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    found.push_back(std::stoull(digits));
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The state stored in a snapshot file, or an error when the file is not a complete snapshot of
// `generation` (a crash can leave only a temporary file, never a partial one, but a damaged disk
// can).
Result<std::string> ReadSnapshot(const std::string& path, uint64_t generation) {
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
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

}  // namespace

std::string DurableCore::JournalPath(uint64_t generation) const {
  return generation == 0 ? base_ : base_ + "." + std::to_string(generation);
}

std::string DurableCore::SnapshotPath(uint64_t generation) const {
  return base_ + ".snapshot." + std::to_string(generation);
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
  std::vector<uint64_t> snapshots = Generations(journal_path + ".snapshot.");
  for (auto g = snapshots.rbegin(); g != snapshots.rend(); ++g) {
    Result<std::string> state = ReadSnapshot(durable->SnapshotPath(*g), *g);
    if (!state.ok()) {
      WEFT_LOG(kWarning) << state.status().message() << "; trying an older snapshot";
      continue;
    }
    Result<OrchestratorCore> restored = OrchestratorCore::Restore(config, *state);
    if (!restored.ok()) return restored.status().WithContext(durable->SnapshotPath(*g));
    durable->core_ = std::move(restored).value();
    durable->fresh_ = false;
    start = *g;
    break;
  }
  if (start == 0 && !snapshots.empty() && !std::filesystem::exists(journal_path)) {
    return DataLoss("no intact snapshot of " + journal_path +
                    " and its first journal is gone: the state cannot be rebuilt");
  }
  // Every journal from that generation on, in order; the last one stays open for appending.
  uint64_t last = start;
  for (uint64_t g : Generations(journal_path + ".")) last = std::max(last, g);
  auto replay = [&](std::string_view record) {
    Outcome ignored;
    ++durable->replayed_;
    // Only accepted events were journaled: one the core refuses now means the journal and this
    // build disagree, and continuing would diverge from what was acknowledged.
    return durable->ApplyEvent(std::string(record), &ignored);
  };
  for (uint64_t g = start; g < last; ++g) {
    if (!std::filesystem::exists(durable->JournalPath(g)))
      continue;  // a rotation that never created it
    WEFT_RETURN_IF_ERROR(Journal::Replay(durable->JournalPath(g), replay));
  }
  WEFT_ASSIGN_OR_RETURN(durable->journal_, Journal::Open(durable->JournalPath(last), replay));
  durable->generation_ = last;
  if (durable->replayed_ > 0) durable->fresh_ = false;
  durable->DeleteBefore(start);
  return durable;
}

void DurableCore::DeleteBefore(uint64_t generation) const {
  std::error_code ignored;
  for (uint64_t g : Generations(base_ + ".snapshot.")) {
    if (g < generation) std::filesystem::remove(SnapshotPath(g), ignored);
  }
  for (uint64_t g : Generations(base_ + ".")) {
    if (g < generation) std::filesystem::remove(JournalPath(g), ignored);
  }
  if (generation > 0) std::filesystem::remove(JournalPath(0), ignored);
}

Status DurableCore::Compact() {
  std::string state;
  uint64_t generation = 0, rotation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
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
  const std::string path = SnapshotPath(generation);
  WEFT_RETURN_IF_ERROR(WriteFileAtomic(path, [&](int fd) {
    WEFT_RETURN_IF_ERROR(WriteAll(fd, header, path));
    return WriteAll(fd, {reinterpret_cast<const uint8_t*>(state.data()), state.size()}, path);
  }));
  DeleteBefore(generation);
  ++compactions_;
  return Status::Ok();
}

Status DurableCore::Record(const std::string& event, Outcome* outcome, bool wait) {
  uint64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WEFT_RETURN_IF_ERROR(ApplyEvent(event, outcome));
    if (outcome->changed) {
      WEFT_ASSIGN_OR_RETURN(sequence, journal_->Enqueue(event));
    } else {
      sequence =
          journal_
              ->records();  // nothing new, but what it saw (a duplicate's original) must be durable
    }
  }
  return wait ? journal_->Wait(sequence) : Status::Ok();
}

void DurableCore::SubmitAsync(Micros now, Submission s,
                              std::function<void(Result<SubmitResult>)> done) {
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

Status DurableCore::Register(Micros now, const std::string& cluster, const std::string& region,
                             uint32_t capacity) {
  Json e = Event("register", now);
  e["cluster"] = cluster;
  e["region"] = region;
  e["capacity"] = capacity;
  Outcome out;
  return Record(e.dump(), &out);
}

Status DurableCore::Heartbeat(Micros now, const std::string& cluster,
                              std::optional<uint64_t> ready_version) {
  Json e = Event("heartbeat", now);
  e["cluster"] = cluster;
  e["ready"] = ready_version ? Json(*ready_version) : Json(nullptr);
  Outcome out;
  return Record(e.dump(), &out, false);
}

Status DurableCore::Drain(Micros now, const std::string& cluster,
                          const std::vector<uint64_t>& jobs) {
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

Result<std::vector<Lease>> DurableCore::RequestLeases(Micros now, const std::string& cluster,
                                                      uint32_t max, uint64_t request) {
  Json e = Event("leases", now);
  e["cluster"] = cluster;
  e["max"] = max;
  if (request != 0) e["request"] = request;
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

Result<std::vector<uint64_t>> DurableCore::AddJobs(
    Micros now, const std::vector<std::pair<std::string, uint32_t>>& prompts) {
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
