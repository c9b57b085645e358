// Manifests: the description of one immutable policy version, and the store layout around them.
//
// Layout in an ObjectStore (docs/formats.md, "Policy store"):
//   blobs/<sha256 hex>                       immutable, content-addressed: safetensors keyframes
//   and
//                                            weft delta files
//   runs/<run>/versions/<version, 20 digits>.json   the manifest of that version, immutable
//   runs/<run>/shards/<version>/<rank>-of-<world>.json   one rank's part of a sharded version,
//                                            immutable, until merged into the version's manifest
//   runs/<run>/pins/<holder>                 the version a worker, job or trainer still needs
//   runs/<run>/catchup/<target>/<base>.json  a catch-up delta from a pinned version to a target
//   runs/<run>/latest                        the highest complete version, decimal; moved forward
//                                            only, by compare-and-swap
// A version is published in that order: blobs, then manifest, then `latest`, so a reader that sees
// `latest = v` can always fetch v.
//
// A manifest lists every served tensor (name, dtype, shape, state digest) and the blobs that hold
// the version: a keyframe (the whole version as safetensors, in one file or in parts) and/or a
// delta from a named base version. Version 0 of a run always has a keyframe. Plain data;
// thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "sync/delta_codec.h"
#include "sync/served_model.h"

struct evp_md_ctx_st;

namespace weft::policy_store {

// A manifest whose keyframe is one file is written as version 1, which every reader reads; one
// whose keyframe is in parts (`keyframe_parts`) as version 2.
inline constexpr const char* kManifestFormat = "weft.manifest.v1";
inline constexpr const char* kManifestFormatParts = "weft.manifest.v2";
// The most parts a keyframe may have.
inline constexpr size_t kMaxKeyframeParts = 65536;

struct BlobRef {
  std::string sha256;  // 64 lowercase hex digits: the blob's key is blobs/<sha256>
  uint64_t bytes = 0;
};

// A delta from `base` to the manifest's version that skips the versions in between: the squash
// of the deltas it spans (docs/formats.md, "Skip deltas").
struct SkipDelta {
  uint64_t base = 0;
  BlobRef blob;
};

struct ManifestTensor {
  std::string name;
  sync::DType dtype = sync::DType::kF32;
  std::vector<uint64_t> shape;
  sync::Digest digest;
};

struct Manifest {
  std::string run_id;
  uint64_t version = 0;
  std::vector<ManifestTensor> tensors;
  // The whole version as safetensors: one file, or the parts a sharded trainer's ranks wrote,
  // each file holding some of the tensors and every tensor in exactly one. Empty: no keyframe.
  std::vector<BlobRef> keyframe;
  std::optional<uint64_t> delta_base;       // the version the delta starts from
  std::optional<BlobRef> delta;             // a weft delta file from delta_base to this version
  std::vector<SkipDelta> skips;             // longer deltas ending here, by increasing span
  uint64_t last_keyframe = 0;               // the newest version <= this one that has a keyframe
  uint64_t delta_bytes_since_keyframe = 0;  // delta bytes from last_keyframe up to this version
  // Set on the part of a version written by one rank of a sharded trainer (stored under
  // ShardKey, never under ManifestKey): its tensors and blobs only, merged into the version's
  // manifest by CommitShards.
  struct Shard {
    uint64_t rank = 0;
    uint64_t world = 1;
  };
  std::optional<Shard> shard;

  bool has_keyframe() const { return !keyframe.empty(); }
  // The keyframe's size, all its parts together (0 without one).
  uint64_t keyframe_bytes() const;

  // The blobs it references: keyframe (every part), delta, skip deltas.
  std::vector<BlobRef> Blobs() const;

  std::string ToJson() const;
  // Strict: unknown or missing fields, wrong types, bad digests or hashes are errors naming the
  // field.
  static Result<Manifest> FromJson(std::string_view json);
};

// A catch-up record: a delta the publisher wrote from a pinned version `base` straight to
// `target` (docs/formats.md, section 6.7), stored at CatchupKey(run, target, base).
struct Catchup {
  std::string run_id;
  uint64_t base = 0;
  uint64_t target = 0;
  BlobRef blob;

  std::string ToJson() const;
  static Result<Catchup> FromJson(std::string_view json);
};

Status ValidateRunId(const std::string& run_id);
// A holder of a pin: a worker, a trainer, a job ([A-Za-z0-9._-], 1 to 128 bytes).
Status ValidateHolder(const std::string& holder);
std::string ManifestKey(const std::string& run_id, uint64_t version);
std::string LatestKey(const std::string& run_id);
// runs/<run>/shards/<version, 20 digits>/<rank>-of-<world>.json, and the folder of a version's
// parts.
std::string ShardKey(const std::string& run_id, uint64_t version, uint64_t rank, uint64_t world);
std::string ShardPrefix(const std::string& run_id, uint64_t version);
// runs/<run>/pins/<holder>: the version a holder still needs, in decimal (section 6.4).
std::string PinKey(const std::string& run_id, const std::string& holder);
// runs/<run>/catchup/<target, 20 digits>/<base, 20 digits>.json, and the folder of a target's.
std::string CatchupKey(const std::string& run_id, uint64_t target, uint64_t base);
std::string CatchupPrefix(const std::string& run_id, uint64_t target);
std::string BlobKey(const std::string& sha256);
// Whether `key` names one of the objects that change, by compare-and-swap only: a run's `latest`
// pointer (runs/<run>/latest) and its pins (runs/<run>/pins/<holder>). Every other object is
// immutable once written.
bool IsMutableKey(std::string_view key);
std::string Sha256Hex(std::span<const uint8_t> bytes);
// A SHA-256 computed a piece at a time (bytes that stream past). Movable, not copyable.
class Sha256 {
 public:
  Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  ~Sha256();
  void Update(std::span<const uint8_t> bytes);
  // The digest of everything updated since the start (or the last Reset), as Sha256Hex writes it;
  // then starts again.
  std::string HexDigest();
  void Reset();

 private:
  ::evp_md_ctx_st* context_;  // OpenSSL's EVP_MD_CTX
};
// The state digest of a served model (docs/api.md, heartbeats): SHA-256 over each tensor's name
// and digest (hex), in name order, first 32 hex digits. Of a manifest, the state its version's
// readers prove they serve; of a served model, the state it holds.
std::string StateDigest(const Manifest& manifest);
std::string StateDigest(const sync::ServedModel& model);

// Whether `text` is a SHA-256 as Sha256Hex writes it: 64 lowercase hex digits.
bool IsSha256Hex(std::string_view text);

}  // namespace weft::policy_store
