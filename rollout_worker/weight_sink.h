// WeightSink: where the rollout worker's verified copy of the policy lives, between the store and
// the engines. The worker's sync loop asks it to pull a version (apply the keyframe or deltas,
// every blob and digest checked against the manifests), to prove its copy in full, to stage it in
// the engines while they generate and to commit it (the short pause), and reports its state
// digest; the worker itself never touches the weights.
//
// HostWeightSink keeps the copy in host memory (sync::ServedModel) and hands it to an Engine,
// whose Stage puts it where the engine loads from (the embedded engine's weights; for SGLang and
// vLLM, the served checkpoint directory of rollout_worker/served_checkpoint.h). DirectoryWeightSink
// keeps it in that directory's file and nowhere else. A sink that keeps the copy in device memory,
// or fans a version out to several local engine processes (shared memory, NCCL), implements the
// same calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "policy_store/manifest.h"
#include "policy_store/reader.h"
#include "rollout_worker/engine.h"
#include "rollout_worker/http_engine.h"
#include "sync/served_model.h"

namespace weft::rollout_worker {

class WeightSink {
 public:
  virtual ~WeightSink() = default;

  // Brings the copy to version `target` through `reader`, from `held` (the manifest of the version
  // it holds; null: from nothing). On error the copy is as it was, or empty (empty() says).
  virtual Result<policy_store::PullReport> Pull(policy_store::StoreReader& reader, uint64_t target,
                                                const policy_store::Manifest* held) = 0;
  // Whether the copy holds nothing (never pulled, dropped, or emptied by a failed keyframe pull).
  virtual bool empty() const = 0;
  // Empties the copy (it no longer matches any version).
  virtual void Drop() = 0;
  // Recomputes every digest of the copy from its bytes on `threads` threads and checks them
  // against `manifest`: kDataLoss names the first tensor that differs.
  virtual Status Prove(const policy_store::Manifest& manifest, int threads) = 0;
  // Makes the copy, verified at `version`, ready to serve without pausing generation.
  virtual Status Stage(uint64_t version) = 0;
  // The engines serve what was staged from their next token on; returns the pause in microseconds.
  virtual Result<int64_t> Commit() = 0;
  // The state digest of the copy (docs/api.md, heartbeats): SHA-256 over each tensor's name and
  // digest, in name order, first 32 hex digits.
  virtual std::string StateDigest() const = 0;
};

// The copy in host memory, staged and committed through `engine` (which must outlive it).
class HostWeightSink : public WeightSink {
 public:
  explicit HostWeightSink(Engine& engine) : engine_(engine) {}

  Result<policy_store::PullReport> Pull(policy_store::StoreReader& reader, uint64_t target,
                                        const policy_store::Manifest* held) override;
  bool empty() const override { return copy_.tensors().empty(); }
  void Drop() override { copy_ = sync::ServedModel(); }
  Status Prove(const policy_store::Manifest& manifest, int threads) override;
  Status Stage(uint64_t version) override { return engine_.Stage(copy_, version); }
  Result<int64_t> Commit() override { return engine_.Commit(); }
  std::string StateDigest() const override;

  // Tests, from any thread: the next Prove first flips one bit of the copy's first tensor where
  // it lives, as a memory fault would (only the proof, against the manifest, can notice).
  void CorruptForTest() { corrupt_for_test_ = true; }
  const sync::ServedModel& copy() const { return copy_; }

 protected:
  Engine& engine_;
  sync::ServedModel copy_;
  std::atomic<bool> corrupt_for_test_{false};
};

// A reader's keyframes placed in a new weights file (ServedCheckpoint::NewFile): `new_file`
// makes it, for the keyframe's tensors, and each tensor's storage is its view of that file. The
// file lives as long as a model over it does, or until Done.
class FilePlacement : public policy_store::KeyframePlacement {
 public:
  using NewFile =
      std::function<Result<std::shared_ptr<NewWeightsFile>>(const std::vector<sync::TensorSpec>&)>;
  explicit FilePlacement(NewFile new_file) : new_file_(std::move(new_file)) {}

  Status Prepare(const policy_store::Manifest& keyframe) override;
  Result<sync::TensorStorage> Storage(const sync::TensorSpec& spec, uint64_t bytes) override;
  // Lets the file go (a model over it still holds it).
  void Done() { file_.reset(); }

 private:
  NewFile new_file_;
  std::shared_ptr<NewWeightsFile> file_;  // the keyframe's, from Prepare
};

// The copy in the served checkpoint directory of an HttpEngine (served_checkpoint.h), and nowhere
// else: a keyframe arrives straight into a new weights file there, mapped (the sink places the
// reader's keyframes there: FilePlacement), which Stage puts in place; each later
// version is applied to that file in place: the changed elements are written once, into the
// file's pages, the proof reads the bytes the replicas will load, and Stage writes nothing. The
// host holds no copy of the model in its own memory, whatever the model's size. While a delta is
// applied the directory holds no version, so the engine loads no replica from it until the next
// Stage; while a keyframe arrives the directory keeps the version it had.
class DirectoryWeightSink final : public HostWeightSink {
 public:
  explicit DirectoryWeightSink(HttpEngine& engine)
      : HostWeightSink(engine),
        http_(engine),
        placement_([&engine](const std::vector<sync::TensorSpec>& specs) {
          return engine.NewDirectoryFile(specs);
        }) {}

  Result<policy_store::PullReport> Pull(policy_store::StoreReader& reader, uint64_t target,
                                        const policy_store::Manifest* held) override;
  // A copy dropped (its proof failed, say) leaves the file in doubt: the next version is written
  // whole.
  void Drop() override;
  // Whether the copy is a file's bytes (rather than host memory): true once a version is held.
  bool mapped() const { return !copy_.tensors().empty() && copy_.tensors()[0].bytes.is_view(); }

 private:
  HttpEngine& http_;
  FilePlacement placement_;  // the reader's, during a pull
};

}  // namespace weft::rollout_worker
