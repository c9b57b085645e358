#include "trainer_adapter/publisher.h"

namespace weft::trainer_adapter {

Result<std::unique_ptr<Publisher>> Publisher::Start(policy_store::ObjectStore& store, std::string run_id,
                                                    const std::vector<sync::MasterTensor>& master,
                                                    const sync::ServingPlan& plan,
                                                    const PublisherOptions& options) {
  WEFT_RETURN_IF_ERROR(policy_store::ValidateRunId(run_id));
  WEFT_ASSIGN_OR_RETURN(bool exists, store.Exists(policy_store::LatestKey(run_id)));
  if (exists) return Conflict("run '" + run_id + "' already exists in " + store.Describe() + "; start a new run id");
  WEFT_ASSIGN_OR_RETURN(sync::ServedModel served, sync::ServedModel::FromMaster(master, plan, options.codec.threads));
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest first,
                        policy_store::PublishVersion(store, run_id, nullptr, served, nullptr, options.keyframes));
  return std::unique_ptr<Publisher>(new Publisher(store, std::move(run_id), std::move(served), std::move(first), options));
}

Result<policy_store::Manifest> Publisher::Publish(const std::vector<sync::MasterTensor>& master) {
  // Work on a copy of the served state so that a failed publish leaves this publisher able to
  // retry from the version it last published.
  sync::ServedModel next = served_;
  WEFT_ASSIGN_OR_RETURN(sync::ModelDelta delta, next.Update(master, options_.codec));
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest manifest,
                        policy_store::PublishVersion(store_, run_id_, &last_, next, &delta, options_.keyframes,
                                                     options_.codec.threads));
  served_ = std::move(next);
  last_ = std::move(manifest);
  return last_;
}

}  // namespace weft::trainer_adapter
