// Publisher: the trainer side of the policy store.
//
// Holds the served copy of the policy (sync::ServedModel) and, for every optimiser step, turns the
// FP32 master weights into the serving format, diffs them against the last published state and
// encodes the delta in one pass (the fused path), then publishes the version: blobs, manifest,
// `latest` (policy_store::PublishVersion), with a keyframe every `keyframes.interval` versions or
// when the deltas since the last keyframe outgrow their budget.
//
// Sharded trainers run one publisher per rank (`rank`, `world`), each over the tensors its rank
// holds: every rank writes its part of each version (policy_store::PublishShard), rank 0 merges
// the parts into the version and publishes it (CommitShards), and every rank returns once the
// version is visible, so all ranks go through Publish in step.
//
// Memory: the publisher holds one served copy, updated in place (ServedModel::Update), the delta
// of the version being published, and the keyframe streamed from the copy when one is due. A
// publish that fails keeps its delta: the next publishes the version again from the last version
// published, that delta squashed with its own, so the publisher can always retry without a
// second copy of the model (served() then holds the weights of the attempt, not the last version
// published).
//
// One publisher per run (per rank); not thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "policy_store/object_store.h"
#include "policy_store/publish.h"
#include "sync/served_model.h"

namespace weft::trainer_adapter {

struct PublisherOptions {
  policy_store::KeyframePolicy keyframes;
  sync::CodecOptions codec;
  uint64_t rank = 0;   // sharded trainers: this rank ...
  uint64_t world = 1;  // ... of this many, each publishing the tensors it holds
  std::chrono::milliseconds shard_deadline{600000};  // how long ranks wait for each other
  // Deltas kept in memory for the skip and catch-up deltas of the next versions, instead of being
  // read back from the store (policy_store::RecentDeltas); 0 keeps none.
  uint64_t recent_delta_bytes = uint64_t{1} << 30;
};

// What one Start or Publish did.
struct PublishStats {
  uint64_t version = 0;
  uint64_t changed_elements = 0;  // served elements (scales included) that changed; all for Start
  uint64_t elements = 0;          // served elements of this publisher's tensors
  uint64_t bytes_written = 0;  // blobs in the manifests this rank wrote (its part, and the merged
                               // version on rank 0): delta, keyframe and skip deltas
  double seconds = 0;          // conversion, encoding and publishing
  double density() const {
    return elements > 0 ? static_cast<double>(changed_elements) / static_cast<double>(elements)
                        : 0.0;
  }
};

class Publisher {
 public:
  // Starts run `run_id`, which must not exist yet, with version 0 served from `master` (this
  // rank's tensors when sharded).
  static Result<std::unique_ptr<Publisher>> Start(policy_store::ObjectStore& store,
                                                  std::string run_id,
                                                  const std::vector<sync::MasterTensor>& master,
                                                  const sync::ServingPlan& plan,
                                                  const PublisherOptions& options);

  // Publishes the next version from the updated master weights (same names and shapes).
  Result<policy_store::Manifest> Publish(const std::vector<sync::MasterTensor>& master);

  const policy_store::Manifest& last() const { return last_; }
  const PublishStats& last_stats() const { return stats_; }
  const sync::ServedModel& served() const { return served_; }

 private:
  Publisher(policy_store::ObjectStore& store, std::string run_id, sync::ServedModel served,
            const PublisherOptions& options)
      : store_(store),
        run_id_(std::move(run_id)),
        served_(std::move(served)),
        options_(options),
        recent_(options.recent_delta_bytes) {}

  // Publishes `served` (with `delta` from the last version, null for version 0), sharded or not;
  // adds the bytes of the blobs it wrote to `*bytes_written`.
  Result<policy_store::Manifest> PublishServed(const sync::ServedModel& served,
                                               const sync::ModelDelta* delta,
                                               uint64_t* bytes_written);

  policy_store::ObjectStore& store_;
  std::string run_id_;
  sync::ServedModel served_;
  policy_store::Manifest last_;
  PublisherOptions options_;
  policy_store::RecentDeltas recent_;
  PublishStats stats_;
  // The delta from the last version published to served_, kept from a publish that failed.
  std::optional<sync::ModelDelta> pending_;
};

}  // namespace weft::trainer_adapter
