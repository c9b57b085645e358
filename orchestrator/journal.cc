#include "orchestrator/journal.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/logging.h"

namespace weft::orchestrator {
namespace {

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'J', 'R', 'N', '1'};
constexpr size_t kHeader = 12;                             // u32 length + u64 hash
constexpr uint64_t kMaxRecord = Journal::kMaxRecordBytes;  // an event is never this large

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

// Whether an intact record starts at `at`: its header fits, its length is within the limit and
// the file, and its payload has the recorded hash. (Payloads are JSON objects: one that does not
// start with '{' is not hashed.)
bool IntactAt(const std::vector<uint8_t>& bytes, size_t at, uint32_t* length) {
  if (bytes.size() - at < kHeader) return false;
  *length = static_cast<uint32_t>(GetLe(bytes.data() + at, 4));
  if (*length > kMaxRecord || bytes.size() - at - kHeader < *length) return false;
  if (*length > 0 && bytes[at + kHeader] != '{') return false;
  return XXH64(bytes.data() + at + kHeader, *length, 0) == GetLe(bytes.data() + at + 4, 8);
}

// Why the bytes from `at` (where no intact record starts) are damage rather than the torn last
// write of a crash, or "" when they can be a torn write. A crash leaves a prefix of what was being
// written: a partial header, or a whole header whose payload runs past the end of the file, and
// nothing intact after it. A whole record with the wrong hash, a header whose payload (taken to
// the end of the file) has the recorded hash (its length field is damaged), or an intact record
// anywhere later is damage to what may have been acknowledged.
std::string Damage(const std::vector<uint8_t>& bytes, size_t at) {
  const size_t left = bytes.size() - at;
  if (left < kHeader) return "";
  const uint64_t length = GetLe(bytes.data() + at, 4);
  if (length <= kMaxRecord && left - kHeader >= length)
    return "its payload does not match its hash";
  if (XXH64(bytes.data() + at + kHeader, left - kHeader, 0) == GetLe(bytes.data() + at + 4, 8))
    return "its length field is damaged";
  for (size_t next = at + 1; next + kHeader <= bytes.size(); ++next) {
    uint32_t next_length = 0;
    if (IntactAt(bytes, next, &next_length)) {
      return "an intact record follows at byte " + std::to_string(next);
    }
  }
  return "";
}

// Replays the intact records of `bytes` (a journal file's contents). `*valid` ends at the end of
// the last intact record; `*torn` says whether a torn last write follows it (damage is an error).
Status Scan(const std::vector<uint8_t>& bytes, const std::string& path,
            const std::function<Status(std::string_view)>& replay, size_t* valid, bool* torn) {
  *torn = false;
  *valid = sizeof(kMagic);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss(path + " is not a weft journal (bad magic at byte 0)");
  }
  for (uint64_t count = 0; *valid < bytes.size(); ++count) {
    uint32_t length = 0;
    if (!IntactAt(bytes, *valid, &length)) {
      const std::string damage = Damage(bytes, *valid);
      if (!damage.empty()) {
        return DataLoss(path + ": record " + std::to_string(count) + " at byte " +
                        std::to_string(*valid) + " is damaged (" + damage +
                        "); refusing to start rather than lose acknowledged events. Restore the "
                        "file from a backup, or, to give up everything from that record on, cut "
                        "the file there (truncate -s " +
                        std::to_string(*valid) + ")");
      }
      *torn = true;
      return Status::Ok();
    }
    Status applied =
        replay({reinterpret_cast<const char*>(bytes.data() + *valid + kHeader), length});
    if (!applied.ok())
      return applied.WithContext(path + ": replaying record " + std::to_string(count) +
                                 " at byte " + std::to_string(*valid));
    *valid += kHeader + length;
  }
  return Status::Ok();
}

// Writes a journal's magic to its empty `file`, durably.
Status StartFile(WritableFile& file) {
  WEFT_RETURN_IF_ERROR(file.Append({reinterpret_cast<const uint8_t*>(kMagic), sizeof(kMagic)}));
  return file.Sync();
}

// Creates an empty journal file (just the magic), durably.
Result<std::unique_ptr<WritableFile>> CreateFile(Env& env, const std::string& path) {
  Result<std::unique_ptr<WritableFile>> file = env.OpenWritable(path, true);
  if (!file.ok()) return file.status().WithContext("creating the journal");
  WEFT_RETURN_IF_ERROR(StartFile(**file));
  return file;
}

}  // namespace

Status Journal::Replay(const std::string& path,
                       const std::function<Status(std::string_view)>& replay, Env& env) {
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, env.ReadFile(path));
  size_t valid = 0;
  bool torn = false;
  WEFT_RETURN_IF_ERROR(Scan(bytes, path, replay, &valid, &torn));
  if (torn)
    return DataLoss(path + ": damaged at byte " + std::to_string(valid) +
                    ", and it is not the last journal file");
  return Status::Ok();
}

Result<std::unique_ptr<Journal>> Journal::Open(
    const std::string& path, const std::function<Status(std::string_view)>& replay, Env& env) {
  // (An error here is not "no journal": creating one would lose the events of the one there.)
  WEFT_ASSIGN_OR_RETURN(const bool exists, env.Exists(path));
  if (!exists) {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, CreateFile(env, path));
    std::unique_ptr<Journal> journal(new Journal(env, path, std::move(file), sizeof(kMagic)));
    journal->Start();
    return journal;
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env.OpenWritable(path, false));
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, env.ReadFile(path));
  if (bytes.size() < sizeof(kMagic) && std::equal(bytes.begin(), bytes.end(), kMagic)) {
    // Created by a rotation (or a first start) that a crash cut short before its magic was
    // durable. Nothing was written to it (records go to a journal only once its magic is synced),
    // so it starts afresh.
    WEFT_LOG(kWarning) << path << ": its creation was cut short (" << bytes.size() << " of "
                       << sizeof(kMagic) << " bytes of its magic); starting it afresh";
    WEFT_RETURN_IF_ERROR(file->Truncate(0).WithContext("restarting a journal cut short"));
    WEFT_RETURN_IF_ERROR(StartFile(*file));
    bytes.assign(kMagic, kMagic + sizeof(kMagic));
  }
  size_t valid = 0;
  bool torn = false;
  WEFT_RETURN_IF_ERROR(Scan(bytes, path, replay, &valid, &torn));
  if (torn) {
    WEFT_LOG(kWarning) << path << ": cutting off " << bytes.size() - valid
                       << " bytes of a torn last record at byte " << valid;
    WEFT_RETURN_IF_ERROR(file->Truncate(valid).WithContext("cutting off the torn tail"));
  }
  std::unique_ptr<Journal> journal(new Journal(env, path, std::move(file), valid));
  journal->Start();
  return journal;
}

void Journal::Start() {
  writer_ = std::thread([this] { WriteLoop(); });
}

Journal::~Journal() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  queued_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

uint64_t Journal::records() const {
  MutexLock lock(mutex_);
  return queued_;
}

uint64_t Journal::syncs() const {
  MutexLock lock(mutex_);
  return syncs_;
}

Status Journal::Append(std::string record) {
  WEFT_ASSIGN_OR_RETURN(uint64_t sequence, Enqueue(std::move(record)));
  return Wait(sequence);
}

Result<uint64_t> Journal::Enqueue(std::string record) { return Queue(std::move(record), nullptr); }

Status Journal::Admits(uint64_t bytes) const {
  if (bytes > kMaxRecord)
    return InvalidArgument("the event's journal record would be " + std::to_string(bytes) +
                           " bytes, more than the limit of " + std::to_string(kMaxRecord));
  MutexLock lock(mutex_);
  return failure_;
}

Result<uint64_t> Journal::Queue(std::string record, std::function<void(Status)> durable) {
  if (record.empty() || record.front() != '{' || record.size() > kMaxRecord) {
    return InvalidArgument("a journal record must be a JSON object of at most " +
                           std::to_string(kMaxRecord) + " bytes (this one has " +
                           std::to_string(record.size()) + ")");
  }
  MutexLock lock(mutex_);
  if (!failure_.ok()) return failure_;
  pending_.push_back({std::move(record), false});
  ++queued_;
  if (durable) callbacks_.emplace_back(queued_, std::move(durable));
  queued_cv_.notify_one();
  return queued_;
}

Result<uint64_t> Journal::Rotate(std::string path) {
  MutexLock lock(mutex_);
  if (!failure_.ok()) return failure_;
  pending_.push_back({std::move(path), true});
  queued_cv_.notify_one();
  return ++queued_;
}

std::string Journal::path() const {
  MutexLock lock(mutex_);
  return path_;
}

uint64_t Journal::size() const {
  MutexLock lock(mutex_);
  return size_;
}

Status Journal::EnqueueThen(std::string record, std::function<void(Status)> durable) {
  return Queue(std::move(record), std::move(durable)).status();
}

Status Journal::Wait(uint64_t sequence) {
  MutexLock lock(mutex_);
  synced_.wait(lock.native(),
               [&]() REQUIRES(mutex_) { return durable_ >= sequence || !failure_.ok(); });
  return durable_ >= sequence ? Status::Ok() : failure_;
}

Status Journal::WhenDurable(std::function<void(Status)> durable) {
  MutexLock lock(mutex_);
  if (!failure_.ok()) return failure_;
  if (durable_ >= queued_) {
    lock.Unlock();
    durable(Status::Ok());
    return Status::Ok();
  }
  callbacks_.emplace_back(queued_, std::move(durable));
  return Status::Ok();
}

void Journal::WriteLoop() {
  MutexLock lock(mutex_);
  while (true) {
    queued_cv_.wait(lock.native(),
                    [&]() REQUIRES(mutex_) { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) break;  // stopping, with everything written
    std::vector<Pending> batch;
    batch.swap(pending_);
    const uint64_t last = queued_;
    std::string path = path_;
    uint64_t size = size_;
    lock.Unlock();
    // The batch's records, in order, with one sync per file (a rotation syncs the file it leaves
    // and starts the next one durably before anything is written there).
    std::vector<uint8_t> bytes;
    Status status;
    auto flush = [&] {
      if (!status.ok()) return;
      status = file_->Append(bytes);
      if (status.ok()) status = file_->Sync();
      if (status.ok()) size += bytes.size();
      bytes.clear();
    };
    for (const Pending& entry : batch) {
      if (entry.rotate) {
        flush();
        if (!status.ok()) break;
        Result<std::unique_ptr<WritableFile>> next = CreateFile(env_, entry.text);
        if (!next.ok()) {
          status = next.status();
          break;
        }
        file_ = std::move(*next);
        path = entry.text;
        size = sizeof(kMagic);
        continue;
      }
      const std::string& r = entry.text;
      uint8_t header[kHeader];
      PutLe(header, r.size(), 4);
      PutLe(header + 4, XXH64(r.data(), r.size(), 0), 8);
      bytes.insert(bytes.end(), header, header + kHeader);
      bytes.insert(bytes.end(), r.begin(), r.end());
    }
    flush();
    lock.Lock();
    ++syncs_;
    path_ = path;
    size_ = size;
    if (status.ok()) {
      durable_ = last;
    } else if (failure_.ok()) {
      failure_ =
          status;  // the file's state is unknown now: refuse everything until a restart replays it
      pending_.clear();
    }
    // Callbacks whose record is now on disk (all of them after a failure), in order.
    std::vector<std::function<void(Status)>> ready;
    auto keep = callbacks_.begin();
    for (auto& [sequence, durable] : callbacks_) {
      if (sequence <= durable_ || !failure_.ok()) {
        ready.push_back(std::move(durable));
      } else {
        *keep++ = {sequence, std::move(durable)};
      }
    }
    callbacks_.erase(keep, callbacks_.end());
    const Status outcome = failure_.ok() ? Status::Ok() : failure_;
    synced_.notify_all();
    lock.Unlock();
    for (auto& durable : ready) durable(outcome);
    lock.Lock();
  }
}

}  // namespace weft::orchestrator
