// Publisher: the trainer side of the policy store.
//
// Holds the served copy of the policy (sync::ServedModel) and, for every optimiser step, turns the
// FP32 master weights into the serving format, diffs them against the last published state and
// encodes the delta in one pass (the fused path), then publishes the version: blobs, manifest,
// `latest` (policy_store::PublishVersion), with a keyframe every `keyframes.interval` versions or
// when the deltas since the last keyframe outgrow their budget.
//
// One publisher per run; not thread-safe. Publishing per rank for sharded trainers is not
// implemented yet.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "policy_store/object_store.h"
#include "policy_store/store_client.h"
#include "sync/served_model.h"

namespace weft::trainer_adapter {

struct PublisherOptions {
  policy_store::KeyframePolicy keyframes;
  sync::CodecOptions codec;
};

class Publisher {
 public:
  // Starts run `run_id`, which must not exist yet, with version 0 served from `master`.
  static Result<std::unique_ptr<Publisher>> Start(policy_store::ObjectStore& store, std::string run_id,
                                                  const std::vector<sync::MasterTensor>& master,
                                                  const sync::ServingPlan& plan,
                                                  const PublisherOptions& options);

  // Publishes the next version from the updated master weights (same names and shapes).
  Result<policy_store::Manifest> Publish(const std::vector<sync::MasterTensor>& master);

  const policy_store::Manifest& last() const { return last_; }
  const sync::ServedModel& served() const { return served_; }

 private:
  Publisher(policy_store::ObjectStore& store, std::string run_id, sync::ServedModel served,
            policy_store::Manifest last, const PublisherOptions& options)
      : store_(store), run_id_(std::move(run_id)), served_(std::move(served)), last_(std::move(last)),
        options_(options) {}

  policy_store::ObjectStore& store_;
  std::string run_id_;
  sync::ServedModel served_;
  policy_store::Manifest last_;
  PublisherOptions options_;
};

}  // namespace weft::trainer_adapter
