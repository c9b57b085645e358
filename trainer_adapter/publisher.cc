#include "trainer_adapter/publisher.h"

namespace weft::trainer_adapter {

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
  if (options.rank == 0) {
    WEFT_ASSIGN_OR_RETURN(bool exists, store.Exists(policy_store::LatestKey(run_id)));
    if (exists)
      return Conflict("run '" + run_id + "' already exists in " + store.Describe() +
                      "; start a new run id");
  }
  WEFT_ASSIGN_OR_RETURN(sync::ServedModel served,
                        sync::ServedModel::FromMaster(master, plan, options.codec.threads));
  std::unique_ptr<Publisher> publisher(
      new Publisher(store, std::move(run_id), std::move(served), options));
  WEFT_ASSIGN_OR_RETURN(publisher->last_, publisher->PublishServed(publisher->served_, nullptr));
  return publisher;
}

Result<policy_store::Manifest> Publisher::PublishServed(const sync::ServedModel& served,
                                                        const sync::ModelDelta* delta) {
  const policy_store::Manifest* previous = delta ? &last_ : nullptr;
  if (options_.world == 1) {
    return policy_store::PublishVersion(store_, run_id_, previous, served, delta,
                                        options_.keyframes, options_.codec.threads, &recent_);
  }
  WEFT_RETURN_IF_ERROR(policy_store::PublishShard(store_, run_id_, previous, options_.rank,
                                                  options_.world, served, delta, options_.keyframes,
                                                  &recent_)
                           .status());
  if (options_.rank == 0) {
    return policy_store::CommitShards(store_, run_id_, previous, options_.world, options_.keyframes,
                                      options_.codec.threads, options_.shard_deadline, &recent_);
  }
  return policy_store::WaitForVersion(store_, run_id_, previous ? previous->version + 1 : 0,
                                      options_.shard_deadline);
}

Result<policy_store::Manifest> Publisher::Publish(const std::vector<sync::MasterTensor>& master) {
  // Work on a copy of the served state so that a failed publish leaves this publisher able to
  // retry from the version it last published.
  sync::ServedModel next = served_;
  WEFT_ASSIGN_OR_RETURN(sync::ModelDelta delta, next.Update(master, options_.codec));
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest manifest, PublishServed(next, &delta));
  served_ = std::move(next);
  last_ = std::move(manifest);
  return last_;
}

}  // namespace weft::trainer_adapter
