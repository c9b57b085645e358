#include "rollout_worker/weight_sink.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "common/byte_io.h"

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
  if (mapped()) http_.ForgetDirectory();  // deltas are about to change the file in place
  reader.PlaceKeyframes(&placement_);
  Result<policy_store::PullReport> pulled = HostWeightSink::Pull(reader, target, held);
  reader.PlaceKeyframes(nullptr);
  placement_.Done();  // (a copy that arrived in the file holds it)
  return pulled;
}

void DirectoryWeightSink::Drop() {
  if (mapped()) http_.ForgetDirectory();
  HostWeightSink::Drop();
}

Status FilePlacement::Prepare(const policy_store::Manifest& keyframe) {
  std::vector<sync::TensorSpec> specs;
  specs.reserve(keyframe.tensors.size());
  for (const policy_store::ManifestTensor& t : keyframe.tensors)
    specs.push_back({t.name, t.dtype, t.shape});
  WEFT_ASSIGN_OR_RETURN(file_, new_file_(specs));
  return Status::Ok();
}

Result<sync::TensorStorage> FilePlacement::Storage(const sync::TensorSpec& spec, uint64_t) {
  // (Its size follows from the dtype and shape, which the file's own check compares.)
  if (file_ == nullptr) return Internal("no keyframe is arriving");
  return file_->Storage(spec);
}

std::string HostWeightSink::StateDigest() const { return policy_store::StateDigest(copy_); }

}  // namespace weft::rollout_worker
