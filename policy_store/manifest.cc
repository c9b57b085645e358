#include "policy_store/manifest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/byte_io.h"
#include "common/hex.h"
#include "common/json_fields.h"
#include "common/names.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {
namespace {

using Json = nlohmann::json;

Json BlobJson(const BlobRef& blob) { return Json{{"sha256", blob.sha256}, {"bytes", blob.bytes}}; }

Result<BlobRef> ParseBlob(const Json& object, const std::string& where) {
  WEFT_RETURN_IF_ERROR(CheckFields(object, where, {"sha256", "bytes"}, {}));
  BlobRef blob;
  if (!object["sha256"].is_string() || !IsSha256Hex(object["sha256"].get<std::string>())) {
    return InvalidArgument(where + ".sha256 is not 64 lowercase hex digits");
  }
  blob.sha256 = object["sha256"].get<std::string>();
  WEFT_ASSIGN_OR_RETURN(blob.bytes, GetUnsigned(object, "bytes", where));
  return blob;
}

}  // namespace

uint64_t Manifest::keyframe_bytes() const {
  uint64_t bytes = 0;
  for (const BlobRef& part : keyframe) bytes += part.bytes;
  return bytes;
}

std::vector<BlobRef> Manifest::Blobs() const {
  std::vector<BlobRef> blobs = keyframe;
  if (delta) blobs.push_back(*delta);
  for (const SkipDelta& skip : skips) blobs.push_back(skip.blob);
  return blobs;
}

std::string Manifest::ToJson() const {
  Json tensors_json = Json::array();
  for (const ManifestTensor& t : tensors) {
    tensors_json.push_back({{"name", t.name},
                            {"dtype", std::string(sync::Info(t.dtype).safetensors_name)},
                            {"shape", t.shape},
                            {"digest", t.digest.ToHex()}});
  }
  const bool parts = keyframe.size() > 1;
  Json json = {{"format", parts ? kManifestFormatParts : kManifestFormat},
               {"run", run_id},
               {"version", version},
               {"tensors", tensors_json},
               {"last_keyframe", last_keyframe},
               {"delta_bytes_since_keyframe", delta_bytes_since_keyframe}};
  if (keyframe.size() == 1) json["keyframe"] = BlobJson(keyframe.front());
  if (parts) {
    Json list = Json::array();
    for (const BlobRef& part : keyframe) list.push_back(BlobJson(part));
    json["keyframe_parts"] = list;
  }
  if (delta)
    json["delta"] = {{"base", *delta_base}, {"sha256", delta->sha256}, {"bytes", delta->bytes}};
  if (shard) json["shard"] = {{"rank", shard->rank}, {"world", shard->world}};
  if (!skips.empty()) {
    Json list = Json::array();
    for (const SkipDelta& skip : skips)
      list.push_back(
          {{"base", skip.base}, {"sha256", skip.blob.sha256}, {"bytes", skip.blob.bytes}});
    json["skips"] = list;
  }
  return json.dump(1);
}

Result<Manifest> Manifest::FromJson(std::string_view text) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseStrict(text, "manifest"));
  WEFT_RETURN_IF_ERROR(CheckFields(
      json, "manifest",
      {"format", "run", "version", "tensors", "last_keyframe", "delta_bytes_since_keyframe"},
      {"keyframe", "keyframe_parts", "delta", "skips", "shard"}));
  const bool v2 = json["format"] == kManifestFormatParts;
  if (json["format"] != kManifestFormat && !v2) {
    return InvalidArgument("manifest format is not " + std::string(kManifestFormat) + " or " +
                           kManifestFormatParts);
  }
  Manifest m;
  if (!json["run"].is_string()) return InvalidArgument("manifest.run is not a string");
  m.run_id = json["run"].get<std::string>();
  WEFT_RETURN_IF_ERROR(ValidateRunId(m.run_id));
  WEFT_ASSIGN_OR_RETURN(m.version, GetUnsigned(json, "version", "manifest"));
  WEFT_ASSIGN_OR_RETURN(m.last_keyframe, GetUnsigned(json, "last_keyframe", "manifest"));
  WEFT_ASSIGN_OR_RETURN(m.delta_bytes_since_keyframe,
                        GetUnsigned(json, "delta_bytes_since_keyframe", "manifest"));
  if (m.last_keyframe > m.version)
    return InvalidArgument("manifest.last_keyframe is after the version");
  if (!json["tensors"].is_array()) return InvalidArgument("manifest.tensors is not an array");
  std::set<std::string> names;
  for (size_t i = 0; i < json["tensors"].size(); ++i) {
    const Json& t = json["tensors"][i];
    const std::string where = "manifest.tensors[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(CheckFields(t, where, {"name", "dtype", "shape", "digest"}, {}));
    ManifestTensor tensor;
    if (!t["name"].is_string() || t["name"].get<std::string>().empty())
      return InvalidArgument(where + ".name is not a non-empty string");
    tensor.name = t["name"].get<std::string>();
    if (!names.insert(tensor.name).second)
      return InvalidArgument(where + ": tensor '" + tensor.name + "' appears twice");
    std::optional<sync::DType> dtype =
        t["dtype"].is_string() ? sync::DTypeFromSafetensorsName(t["dtype"].get<std::string>())
                               : std::nullopt;
    if (!dtype) return InvalidArgument(where + ".dtype is not a known dtype");
    tensor.dtype = *dtype;
    if (!t["shape"].is_array() || t["shape"].size() > sync::kMaxRank)
      return InvalidArgument(where + ".shape is not an array of at most 8 dimensions");
    for (const Json& d : t["shape"]) {
      if (!d.is_number_unsigned())
        return InvalidArgument(where + ".shape has a dimension that is not a non-negative integer");
      tensor.shape.push_back(d.get<uint64_t>());
    }
    std::optional<sync::Digest> digest = t["digest"].is_string()
                                             ? sync::Digest::FromHex(t["digest"].get<std::string>())
                                             : std::nullopt;
    if (!digest) return InvalidArgument(where + ".digest is not 32 lowercase hex digits");
    tensor.digest = *digest;
    m.tensors.push_back(std::move(tensor));
  }
  if (json.contains("keyframe")) {
    WEFT_ASSIGN_OR_RETURN(BlobRef keyframe, ParseBlob(json["keyframe"], "manifest.keyframe"));
    m.keyframe.push_back(keyframe);
  }
  if (json.contains("keyframe_parts")) {
    const Json& parts = json["keyframe_parts"];
    if (!v2) {
      return InvalidArgument("manifest.keyframe_parts needs format " +
                             std::string(kManifestFormatParts));
    }
    if (m.has_keyframe()) return InvalidArgument("manifest has both keyframe and keyframe_parts");
    if (!parts.is_array() || parts.size() < 2 || parts.size() > kMaxKeyframeParts) {
      return InvalidArgument("manifest.keyframe_parts is not an array of 2 to " +
                             std::to_string(kMaxKeyframeParts) + " blobs");
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      WEFT_ASSIGN_OR_RETURN(
          BlobRef part, ParseBlob(parts[i], "manifest.keyframe_parts[" + std::to_string(i) + "]"));
      m.keyframe.push_back(std::move(part));
    }
  } else if (v2) {
    return InvalidArgument("manifest format " + std::string(kManifestFormatParts) +
                           " is for keyframes in parts, and this one has no keyframe_parts");
  }
  if (json.contains("delta")) {
    const Json& d = json["delta"];
    WEFT_RETURN_IF_ERROR(CheckFields(d, "manifest.delta", {"base", "sha256", "bytes"}, {}));
    WEFT_ASSIGN_OR_RETURN(uint64_t base, GetUnsigned(d, "base", "manifest.delta"));
    if (base >= m.version) return InvalidArgument("manifest.delta.base is not before the version");
    Json blob = {{"sha256", d["sha256"]}, {"bytes", d["bytes"]}};
    WEFT_ASSIGN_OR_RETURN(BlobRef delta, ParseBlob(blob, "manifest.delta"));
    m.delta_base = base;
    m.delta = delta;
  }
  if (json.contains("skips")) {
    if (!json["skips"].is_array()) return InvalidArgument("manifest.skips is not an array");
    for (size_t i = 0; i < json["skips"].size(); ++i) {
      const Json& k = json["skips"][i];
      const std::string where = "manifest.skips[" + std::to_string(i) + "]";
      WEFT_RETURN_IF_ERROR(CheckFields(k, where, {"base", "sha256", "bytes"}, {}));
      SkipDelta skip;
      WEFT_ASSIGN_OR_RETURN(skip.base, GetUnsigned(k, "base", where));
      if (skip.base >= m.version) return InvalidArgument(where + ".base is not before the version");
      Json blob = {{"sha256", k["sha256"]}, {"bytes", k["bytes"]}};
      WEFT_ASSIGN_OR_RETURN(skip.blob, ParseBlob(blob, where));
      m.skips.push_back(skip);
    }
  }
  if (json.contains("shard")) {
    const Json& k = json["shard"];
    WEFT_RETURN_IF_ERROR(CheckFields(k, "manifest.shard", {"rank", "world"}, {}));
    Shard shard;
    WEFT_ASSIGN_OR_RETURN(shard.rank, GetUnsigned(k, "rank", "manifest.shard"));
    WEFT_ASSIGN_OR_RETURN(shard.world, GetUnsigned(k, "world", "manifest.shard"));
    if (shard.world < 1 || shard.world > 65536 || shard.rank >= shard.world) {
      return InvalidArgument("manifest.shard: rank " + std::to_string(shard.rank) + " of world " +
                             std::to_string(shard.world) + " is not valid");
    }
    m.shard = shard;
  }
  if (!m.has_keyframe() && !m.delta)
    return InvalidArgument("manifest has neither a keyframe nor a delta");
  if (m.version == 0 && !m.has_keyframe()) return InvalidArgument("version 0 must have a keyframe");
  if (m.has_keyframe() && m.last_keyframe != m.version)
    return InvalidArgument("manifest.last_keyframe must equal the version of a keyframe");
  return m;
}

Status ValidateRunId(const std::string& run_id) { return CheckName(run_id, "run id"); }

std::string ManifestKey(const std::string& run_id, uint64_t version) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(version));
  return "runs/" + run_id + "/versions/" + digits + ".json";
}

std::string ShardPrefix(const std::string& run_id, uint64_t version) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(version));
  return "runs/" + run_id + "/shards/" + digits + "/";
}

std::string ShardKey(const std::string& run_id, uint64_t version, uint64_t rank, uint64_t world) {
  return ShardPrefix(run_id, version) + std::to_string(rank) + "-of-" + std::to_string(world) +
         ".json";
}

std::string PinKey(const std::string& run_id, const std::string& holder) {
  return "runs/" + run_id + "/pins/" + holder;
}

std::string CatchupPrefix(const std::string& run_id, uint64_t target) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(target));
  return "runs/" + run_id + "/catchup/" + digits + "/";
}

std::string CatchupKey(const std::string& run_id, uint64_t target, uint64_t base) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(base));
  return CatchupPrefix(run_id, target) + digits + ".json";
}

Status ValidateHolder(const std::string& holder) {
  if (holder.empty() || holder.size() > 128 || holder == "." || holder == ".." ||
      holder.find('/') != std::string::npos) {
    return InvalidArgument("pin holder '" + holder +
                           "' must be 1 to 128 characters of [A-Za-z0-9._-]");
  }
  return ValidateKey(holder).WithContext("pin holder");
}

std::string Catchup::ToJson() const {
  return Json({{"format", "weft.catchup.v1"},
               {"run", run_id},
               {"base", base},
               {"target", target},
               {"sha256", blob.sha256},
               {"bytes", blob.bytes}})
      .dump();
}

Result<Catchup> Catchup::FromJson(std::string_view text) {
  WEFT_ASSIGN_OR_RETURN(Json json, ParseStrict(text, "catch-up record"));
  WEFT_RETURN_IF_ERROR(CheckFields(json, "catch-up record",
                                   {"format", "run", "base", "target", "sha256", "bytes"}, {}));
  if (json["format"] != "weft.catchup.v1")
    return InvalidArgument("catch-up record format is not weft.catchup.v1");
  Catchup c;
  if (!json["run"].is_string()) return InvalidArgument("catch-up record: run is not a string");
  c.run_id = json["run"].get<std::string>();
  WEFT_ASSIGN_OR_RETURN(c.base, GetUnsigned(json, "base", "catch-up record"));
  WEFT_ASSIGN_OR_RETURN(c.target, GetUnsigned(json, "target", "catch-up record"));
  if (c.base >= c.target) return InvalidArgument("catch-up record: base is not before target");
  WEFT_ASSIGN_OR_RETURN(
      c.blob,
      ParseBlob(Json{{"sha256", json["sha256"]}, {"bytes", json["bytes"]}}, "catch-up record"));
  return c;
}

std::string LatestKey(const std::string& run_id) { return "runs/" + run_id + "/latest"; }

std::string BlobKey(const std::string& sha256) { return "blobs/" + sha256; }

bool IsMutableKey(std::string_view key) {
  if (!key.starts_with("runs/")) return false;
  const std::string_view rest = key.substr(5);
  const size_t slash = rest.find('/');
  if (slash == 0 || slash == std::string_view::npos) return false;
  const std::string_view tail = rest.substr(slash + 1);
  if (tail == "latest") return true;
  return tail.starts_with("pins/") && tail.size() > 5 &&
         tail.find('/', 5) == std::string_view::npos;
}

std::string Sha256Hex(std::span<const uint8_t> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return HexEncode({digest, length});
}

Sha256::Sha256() : context_(EVP_MD_CTX_new()) { Reset(); }
Sha256::Sha256(Sha256&& other) noexcept : context_(std::exchange(other.context_, nullptr)) {}
Sha256& Sha256::operator=(Sha256&& other) noexcept {
  std::swap(context_, other.context_);
  return *this;
}
Sha256::~Sha256() { EVP_MD_CTX_free(context_); }
void Sha256::Reset() { EVP_DigestInit_ex(context_, EVP_sha256(), nullptr); }
void Sha256::Update(std::span<const uint8_t> bytes) {
  EVP_DigestUpdate(context_, bytes.data(), bytes.size());
}
std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context_, digest, &length);
  Reset();
  return HexEncode({digest, length});
}

namespace {

// Of (name, digest hex) pairs.
std::string StateDigestOf(std::vector<std::pair<std::string, std::string>> named) {
  std::sort(named.begin(), named.end());
  std::string text;
  for (const auto& [name, hex] : named) text += name + '\0' + hex + '\0';
  return Sha256Hex(TextBytes(text)).substr(0, 32);
}

}  // namespace

std::string StateDigest(const Manifest& manifest) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const ManifestTensor& t : manifest.tensors) named.emplace_back(t.name, t.digest.ToHex());
  return StateDigestOf(std::move(named));
}

std::string StateDigest(const sync::ServedModel& model) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& t : model.tensors()) named.emplace_back(t.spec.name, t.digest.ToHex());
  return StateDigestOf(std::move(named));
}

bool IsSha256Hex(std::string_view text) { return text.size() == 64 && IsLowerHex(text); }

}  // namespace weft::policy_store
