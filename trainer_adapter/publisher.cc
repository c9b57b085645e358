#include "trainer_adapter/publisher.h"

namespace weft::trainer_adapter {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t BlobBytes(const policy_store::Manifest& manifest) {
  uint64_t bytes = 0;
  bytes += manifest.keyframe_bytes();
  if (manifest.delta) bytes += manifest.delta->bytes;
  for (const policy_store::SkipDelta& skip : manifest.skips) bytes += skip.blob.bytes;
  return bytes;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Start(policy_store::ObjectStore& store,
                                                    std::string run_id,
                                                    const std::vector<sync::MasterTensor>& master,
                                                    const sync::ServingPlan& plan,
                                                    const PublisherOptions& options) {
  WEFT_RETURN_IF_ERROR(policy_store::ValidateRunId(run_id));
  if (options.world < 1 || options.rank >= options.world) {
    return InvalidArgument("publisher rank " + std::to_string(options.rank) +
                           " is not in a world of " + std::to_string(options.world));
  }
  if (options.world > 1 && options.keyframes.delta_mode != sync::DeltaMode::kPlain) {
    // The rank that commits a sharded version holds none of the weights that context chunks
    // are coded against.
    return InvalidArgument("context-coded deltas need a single publishing rank, not a world of " +
                           std::to_string(options.world) + "; publish plain deltas");
  }
  if (options.rank == 0) {
    WEFT_ASSIGN_OR_RETURN(bool exists, store.Exists(policy_store::LatestKey(run_id)));
    if (exists)
      return Conflict("run '" + run_id + "' already exists in " + store.Describe() +
                      "; start a new run id");
  }
  const auto started = Clock::now();
  WEFT_ASSIGN_OR_RETURN(sync::ServedModel served,
                        sync::ServedModel::FromMaster(master, plan, options.codec.threads));
  std::unique_ptr<Publisher> publisher(
      new Publisher(store, std::move(run_id), std::move(served), options));
  PublishStats stats;
  WEFT_ASSIGN_OR_RETURN(publisher->last_, publisher->PublishServed(publisher->served_, nullptr,
                                                                   &stats.bytes_written));
  stats.version = publisher->last_.version;
  stats.elements = publisher->served_.element_count();
  stats.changed_elements = stats.elements;
  stats.seconds = SecondsSince(started);
  publisher->stats_ = stats;
  return publisher;
}

Result<policy_store::Manifest> Publisher::PublishServed(const sync::ServedModel& served,
                                                        const sync::ModelDelta* delta,
                                                        uint64_t* bytes_written) {
  const policy_store::Manifest* previous = delta ? &last_ : nullptr;
  if (options_.world == 1) {
    WEFT_ASSIGN_OR_RETURN(
        policy_store::Manifest manifest,
        policy_store::PublishVersion(store_, run_id_, previous, served, delta, options_.keyframes,
                                     options_.codec.threads, &recent_));
    *bytes_written += BlobBytes(manifest);
    return manifest;
  }
  WEFT_ASSIGN_OR_RETURN(
      policy_store::Manifest part,
      policy_store::PublishShard(store_, run_id_, previous, options_.rank, options_.world, served,
                                 delta, options_.keyframes, &recent_));
  *bytes_written += BlobBytes(part);
  if (options_.rank == 0) {
    WEFT_ASSIGN_OR_RETURN(
        policy_store::Manifest manifest,
        policy_store::CommitShards(store_, run_id_, previous, options_.world, options_.keyframes,
                                   options_.codec.threads, options_.shard_deadline, &recent_));
    *bytes_written += BlobBytes(manifest);
    return manifest;
  }
  return policy_store::WaitForVersion(store_, run_id_, previous ? previous->version + 1 : 0,
                                      options_.shard_deadline);
}

Result<policy_store::Manifest> Publisher::Publish(const std::vector<sync::MasterTensor>& master) {
  const auto started = Clock::now();
  PublishStats stats;
  // In place: the only served copy moves to the new weights (all or nothing). The version goes
  // out as the delta from the last version published: this step's, after a failed publish that
  // one's squashed with it.
  WEFT_ASSIGN_OR_RETURN(sync::ModelDelta step,
                        served_.Update(master, options_.codec, &stats.changed_elements));
  sync::ModelDelta delta;
  if (pending_ && stats.changed_elements == 0) {
    // The same weights again (a retry): the same delta, so that a version the failed publish
    // wrote in part is completed with the same bytes.
    delta = std::move(*pending_);
  } else if (pending_) {
    Result<sync::ModelDelta> squashed =
        sync::SquashModelDeltas(*pending_, step, options_.codec.threads);
    if (!squashed.ok()) {
      return InvalidArgument(
          "cannot squash this step onto the delta of the publish that failed (publish the same "
          "tensors as it did): " +
          squashed.status().message());
    }
    delta = std::move(squashed).value();
  } else {
    delta = std::move(step);
  }
  Result<policy_store::Manifest> manifest = PublishServed(served_, &delta, &stats.bytes_written);
  if (!manifest.ok()) {
    pending_ = std::move(delta);
    return manifest.status();
  }
  pending_.reset();
  last_ = std::move(manifest).value();
  stats.version = last_.version;
  stats.elements = served_.element_count();
  stats.seconds = SecondsSince(started);
  stats_ = stats;
  return last_;
}

}  // namespace weft::trainer_adapter
