// S3Store: an ObjectStore in an S3 bucket (AWS S3 or an S3-compatible service: Ceph RGW, MinIO,
// R2, ...), under a key prefix. Requests are signed with AWS Signature Version 4 (s3_signer.h),
// payloads included, and sent through common/http_client (deadlines, retries with backoff on
// connection failures, 5xx and SlowDown, resumed downloads).
//
// The store's guarantees rest on S3's conditional writes:
//   - PutImmutable writes with `If-None-Match: *`; a 412 means the key exists, and the object is
//     read back: the same bytes are success, other bytes kConflict. Objects of at least
//     multipart_threshold bytes are uploaded in parts, in parallel, and completed with
//     `If-None-Match: *`; a failed upload is aborted so no parts stay behind.
//   - CompareAndSwap reads the object and its ETag, and writes with `If-Match: ETAG` (or
//     `If-None-Match: *` when it expects no object); 412 or 404 is kConflict.
//   - Before its first write, the store checks that the service honours both conditions on a
//     probe object (under PREFIX/.weft-probe/) and refuses to write where it does not. A service
//     that honours them on single PUTs but not on completing a multipart upload (Ceph RGW before
//     Squid) is used with a check before each multipart upload and one after: a conflicting
//     writer is caught unless two complete within the same moment (docs/store.md).
// Large objects are read with parallel ranged GETs pinned to the first answer's ETag. List uses
// ListObjectsV2 with pagination; Delete is S3's (idempotent). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/http_client.h"
#include "common/mutex.h"
#include "policy_store/object_store.h"
#include "policy_store/s3_config.h"

namespace weft::policy_store {

using S3StoreOptions = HttpClientOptions;

class S3Store : public ObjectStore {
 public:
  S3Store(s3::Settings settings, S3StoreOptions options = {});

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override;
  // Straight into `out` as the bytes arrive, without a buffer.
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override;
  // One streamed ranged GET, resumed where it stops.
  Result<uint64_t> ReadTo(const std::string& key, uint64_t first, uint64_t length,
                          BodyTarget& target) override;
  bool ReadsRanges() const override { return true; }
  // Parts of range_size, `parallel` at once.
  BlobReads blob_reads() const override { return {settings_.range_size, settings_.parallel}; }
  Result<bool> Exists(const std::string& key) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  // The same, with each key's last modification.
  Result<std::vector<std::pair<std::string, std::chrono::system_clock::time_point>>> ListModified(
      const std::string& prefix);
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return settings_.Uri(); }

  // Multipart uploads under the prefix started before `cutoff` (left behind by publishers that
  // were killed) whose key `which` takes (all, without it), aborted; returns how many. `store gc`
  // calls it.
  Result<size_t> AbortUploadsBefore(std::chrono::system_clock::time_point cutoff,
                                    const std::function<bool(const std::string&)>& which = {});
  // The objects of conditional-write checks (.weft-probe/...) written before `cutoff`, which a
  // publisher killed during its check leaves behind, deleted; returns how many. `store gc` calls
  // it.
  Result<size_t> DeleteProbesBefore(std::chrono::system_clock::time_point cutoff);
  // The key prefix of those objects.
  static constexpr const char* kProbePrefix = ".weft-probe/";
  // Multipart uploads in progress under the prefix (keys relative to it), for checks.
  Result<std::vector<std::string>> ListUploads();

  // Checks that the service honours conditional writes (done before the first write; callers may
  // call it earlier to fail fast). Says whether conditional completion of multipart uploads works.
  Result<bool> CheckConditionalWrites();

  const s3::Settings& settings() const { return settings_; }
  uint64_t bytes_received() const { return client_.bytes_received(); }
  uint64_t retries() const { return client_.retries(); }
  // Multipart uploads started again because their completion met a concurrent write (409).
  uint64_t uploads_restarted() const { return conflicts_restarted_.load(); }
  uint64_t resumed() const { return client_.resumed(); }

  struct Call {
    std::string method = "GET";
    std::string key;       // the object key relative to the prefix; empty: the bucket
    bool raw_key = false;  // `key` is the full S3 key (a listing's)
    std::vector<std::pair<std::string, std::string>> query;
    std::vector<std::pair<std::string, std::string>> headers;  // signed and sent
    std::span<const uint8_t> body;
    std::optional<std::pair<uint64_t, uint64_t>> range;
    BodyTarget* target = nullptr;  // a GET's body goes there as it arrives
    bool idempotent = true;
    bool retry_server_errors = true;
  };
  // One signed request with the client's retries.
  Result<HttpReply> Send(const Call& call);

 private:
  std::string FullKey(const std::string& key) const;
  std::string What(const std::string& method, const std::string& key) const;
  Status StatusOf(const HttpReply& reply, const std::string& what) const;
  Result<std::pair<std::vector<uint8_t>, std::string>> GetWithEtag(const std::string& key);
  Status PutSingle(const std::string& key, std::span<const uint8_t> bytes);
  // `conditional`: the service honours If-None-Match on completing an upload.
  Status PutMultipart(const std::string& key, std::span<const uint8_t> bytes, bool conditional);
  // The steps of a multipart upload: its id, a part's ETag, completion with If-None-Match: *.
  Result<std::string> StartUpload(const std::string& key);
  Result<std::string> UploadPart(const std::string& key, const std::string& upload, int number,
                                 std::span<const uint8_t> bytes);
  Result<HttpReply> CompleteUpload(const std::string& key, const std::string& upload,
                                   const std::vector<std::string>& etags);
  void AbortUpload(const std::string& key, const std::string& upload);
  // After a 412 on an immutable write: the key holds `bytes` (Ok) or others (kConflict).
  Status CompareExisting(const std::string& key, std::span<const uint8_t> bytes);
  // Calls fn(key relative to the prefix, upload id, start) for each multipart upload under the
  // prefix (the raw S3 key when it is outside the store's keys, such as the probe's).
  Status ForEachUpload(const std::function<void(const std::string&, const std::string&,
                                                std::chrono::system_clock::time_point)>& fn);

  s3::Settings settings_;
  HttpClient client_;
  std::string host_;       // the Host header (and the signed host)
  std::string base_path_;  // "/BUCKET" (path-style) or ""
  Mutex probe_mutex_;
  std::optional<bool> multipart_conditional_ GUARDED_BY(probe_mutex_);  // set by the probe
  std::atomic<uint64_t> conflicts_restarted_{0};
};

}  // namespace weft::policy_store
