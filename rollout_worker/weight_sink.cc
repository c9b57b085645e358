#include "rollout_worker/weight_sink.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

namespace weft::rollout_worker {

Result<policy_store::PullReport> HostWeightSink::Pull(policy_store::StoreReader& reader,
                                                      uint64_t target,
                                                      const policy_store::Manifest* held) {
  const std::optional<uint64_t> have =
      held != nullptr ? std::optional<uint64_t>(held->version) : std::nullopt;
  return reader.Pull(target, have, &copy_, held);
}

Status HostWeightSink::Prove(const policy_store::Manifest& manifest, int threads) {
  if (corrupt_for_test_.exchange(false) && !copy_.tensors().empty()) {
    std::vector<sync::TensorSpec> specs;
    std::vector<std::vector<uint8_t>> bytes;
    for (const auto& t : copy_.tensors()) {
      specs.push_back(t.spec);
      bytes.push_back(t.bytes);
    }
    bytes.front()[0] ^= 0x01;
    copy_ = sync::ServedModel::FromTensors(specs, bytes, 1);
  }
  return policy_store::CheckAgainstManifest(copy_, manifest, nullptr, true, threads);
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
