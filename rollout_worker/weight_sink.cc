#include "rollout_worker/weight_sink.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "common/logging.h"

namespace weft::rollout_worker {

Result<policy_store::PullReport> HostWeightSink::Pull(policy_store::StoreReader& reader,
                                                      uint64_t target,
                                                      const policy_store::Manifest* held) {
  const std::optional<uint64_t> have =
      held != nullptr ? std::optional<uint64_t>(held->version) : std::nullopt;
  return reader.Pull(target, have, &copy_, held);
}

Status HostWeightSink::Prove(const policy_store::Manifest& manifest, int threads) {
  if (corrupt_for_test_.exchange(false) && !copy_.tensors().empty() &&
      !copy_.tensors()[0].bytes.empty()) {
    // In place: the bytes of a mapped copy are the file's.
    const_cast<uint8_t&>(copy_.tensors()[0].bytes[0]) ^= 0x01;
  }
  return policy_store::CheckAgainstManifest(copy_, manifest, nullptr, true, threads);
}

Result<policy_store::PullReport> DirectoryWeightSink::Pull(policy_store::StoreReader& reader,
                                                           uint64_t target,
                                                           const policy_store::Manifest* held) {
  if (mapped()) http_.ForgetDirectory();
  return HostWeightSink::Pull(reader, target, held);
}

void DirectoryWeightSink::Drop() {
  if (mapped()) http_.ForgetDirectory();
  HostWeightSink::Drop();
}

Status DirectoryWeightSink::Stage(uint64_t version) {
  WEFT_RETURN_IF_ERROR(HostWeightSink::Stage(version));
  if (mapped()) return Status::Ok();
  // The version is in the file now: the file becomes the copy, and the host's is let go.
  Result<sync::ServedModel> file = http_.MapDirectory();
  if (!file.ok()) {
    WEFT_LOG(kWarning) << "the copy stays in host memory: " << file.status().message();
    return Status::Ok();
  }
  copy_ = std::move(*file);
  return Status::Ok();
}

std::string HostWeightSink::StateDigest() const {
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& t : copy_.tensors()) named.emplace_back(t.spec.name, t.digest.ToHex());
  std::sort(named.begin(), named.end());
  std::string text;
  for (const auto& [name, hex] : named) text += name + '\0' + hex + '\0';
  return policy_store::Sha256Hex(
             std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
      .substr(0, 32);
}

}  // namespace weft::rollout_worker
