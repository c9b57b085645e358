#include "orchestrator/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/file_util.h"
#include "common/logging.h"

namespace weft::orchestrator {
namespace {

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'J', 'R', 'N', '1'};
constexpr size_t kHeader = 12;                    // u32 length + u64 hash
constexpr uint32_t kMaxRecord = 64u << 20;        // a record is an event, never this large

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

}  // namespace

Result<std::unique_ptr<Journal>> Journal::Open(const std::string& path, const std::function<Status(std::string_view)>& replay) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable("cannot open the journal " + path + ": " + std::strerror(errno));
  std::unique_ptr<Journal> journal(new Journal(path, fd));
  Result<std::vector<uint8_t>> contents = ReadFile(path);
  if (!contents.ok()) return contents.status();
  const std::vector<uint8_t>& bytes = *contents;
  size_t valid = sizeof(kMagic);
  if (bytes.empty()) {
    WEFT_RETURN_IF_ERROR(WriteAll(fd, {reinterpret_cast<const uint8_t*>(kMagic), sizeof(kMagic)}, path));
    if (::fdatasync(fd) != 0) return Unavailable("cannot sync the journal " + path + ": " + std::strerror(errno));
    SyncParentDirectory(path);
  } else {
    if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
      return DataLoss(path + " is not a weft journal (bad magic)");
    }
    uint64_t count = 0;
    while (valid < bytes.size()) {
      const size_t left = bytes.size() - valid;
      bool complete = left >= kHeader;
      uint32_t length = 0;
      if (complete) {
        length = static_cast<uint32_t>(GetLe(bytes.data() + valid, 4));
        complete = length <= kMaxRecord && left - kHeader >= length;
      }
      const bool intact = complete && XXH64(bytes.data() + valid + kHeader, length, 0) == GetLe(bytes.data() + valid + 4, 8);
      if (!intact) {
        // A crash tears only the last write, whose records were never acknowledged: cut it off.
        // A bad record followed by an intact one is damage to acknowledged data instead.
        if (complete) {
          const size_t next = valid + kHeader + length;
          if (bytes.size() - next >= kHeader) {
            const uint64_t next_length = GetLe(bytes.data() + next, 4);
            if (next_length <= kMaxRecord && bytes.size() - next - kHeader >= next_length &&
                XXH64(bytes.data() + next + kHeader, next_length, 0) == GetLe(bytes.data() + next + 4, 8)) {
              return DataLoss(path + ": record " + std::to_string(count) + " at byte " + std::to_string(valid) +
                              " is corrupted and followed by intact records");
            }
          }
        }
        WEFT_LOG(kWarning) << path << ": cutting off " << left << " bytes of a torn last record at byte " << valid;
        if (::ftruncate(fd, static_cast<off_t>(valid)) != 0 || ::fdatasync(fd) != 0) {
          return Unavailable("cannot cut off the torn tail of " + path + ": " + std::strerror(errno));
        }
        break;
      }
      Status applied = replay({reinterpret_cast<const char*>(bytes.data() + valid + kHeader), length});
      if (!applied.ok()) return applied.WithContext(path + ": replaying record " + std::to_string(count));
      valid += kHeader + length;
      ++count;
    }
  }
  if (::lseek(fd, static_cast<off_t>(valid), SEEK_SET) < 0) return Unavailable("cannot seek in " + path);
  Journal* raw = journal.get();
  journal->writer_ = std::thread([raw] { raw->WriteLoop(); });
  return journal;
}

Journal::~Journal() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (fd_ >= 0) ::close(fd_);
}

uint64_t Journal::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_;
}

uint64_t Journal::syncs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return syncs_;
}

Status Journal::Append(std::string record) {
  WEFT_ASSIGN_OR_RETURN(uint64_t sequence, Enqueue(std::move(record)));
  return Wait(sequence);
}

Result<uint64_t> Journal::Enqueue(std::string record) {
  if (record.size() > kMaxRecord) return InvalidArgument("journal record of " + std::to_string(record.size()) + " bytes is too large");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.ok()) return failure_;
  pending_.push_back(std::move(record));
  queued_cv_.notify_one();
  return ++queued_;
}

Status Journal::EnqueueThen(std::string record, std::function<void(Status)> durable) {
  if (record.size() > kMaxRecord) return InvalidArgument("journal record of " + std::to_string(record.size()) + " bytes is too large");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.ok()) return failure_;
  pending_.push_back(std::move(record));
  callbacks_.emplace_back(++queued_, std::move(durable));
  queued_cv_.notify_one();
  return Status::Ok();
}

Status Journal::Wait(uint64_t sequence) {
  std::unique_lock<std::mutex> lock(mutex_);
  synced_.wait(lock, [&] { return durable_ >= sequence || !failure_.ok(); });
  return durable_ >= sequence ? Status::Ok() : failure_;
}

Status Journal::WhenDurable(std::function<void(Status)> durable) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!failure_.ok()) return failure_;
  if (durable_ >= queued_) {
    lock.unlock();
    durable(Status::Ok());
    return Status::Ok();
  }
  callbacks_.emplace_back(queued_, std::move(durable));
  return Status::Ok();
}

void Journal::WriteLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) break;  // stopping, with everything written
    std::vector<std::string> batch;
    batch.swap(pending_);
    const uint64_t last = queued_;
    lock.unlock();
    std::vector<uint8_t> bytes;
    for (const std::string& r : batch) {
      uint8_t header[kHeader];
      PutLe(header, r.size(), 4);
      PutLe(header + 4, XXH64(r.data(), r.size(), 0), 8);
      bytes.insert(bytes.end(), header, header + kHeader);
      bytes.insert(bytes.end(), r.begin(), r.end());
    }
    Status status = WriteAll(fd_, bytes, path_);
    if (status.ok() && ::fdatasync(fd_) != 0) status = Unavailable("cannot sync the journal " + path_ + ": " + std::strerror(errno));
    lock.lock();
    ++syncs_;
    if (status.ok()) {
      durable_ = last;
    } else if (failure_.ok()) {
      failure_ = status;  // the file's state is unknown now: refuse everything until a restart replays it
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
    lock.unlock();
    for (auto& durable : ready) durable(outcome);
    lock.lock();
  }
}

}  // namespace weft::orchestrator
