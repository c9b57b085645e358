#include "policy_store/reader.h"

#include "common/concurrent.h"
#include "policy_store/blob_fetch.h"
#include "policy_store/planner.h"
#include "policy_store/run_objects.h"
#include "sync/digest.h"
#include "sync/safetensors.h"
#include "sync/served_model_stream.h"

namespace weft::policy_store {
namespace {

// A keyframe assembled into a new model as its parts arrive.
class KeyframeSink : public BlobSink {
 public:
  explicit KeyframeSink(uint64_t size) : stream_(size) {}
  Status Place(uint64_t offset, std::span<const uint8_t> bytes) override {
    return stream_.Place(offset, bytes);
  }
  void Restart() override { stream_.Restart(); }
  sync::ServedModelStream& stream() { return stream_; }

 private:
  sync::ServedModelStream stream_;
};

}  // namespace

Status CheckAgainstManifest(const sync::ServedModel& model, const Manifest& manifest,
                            const sync::ModelDelta* pending, bool recompute, int threads) {
  if (model.tensors().size() != manifest.tensors.size()) {
    return DataLoss("version " + std::to_string(manifest.version) + " has " +
                    std::to_string(manifest.tensors.size()) + " tensors, the local copy " +
                    std::to_string(model.tensors().size()));
  }
  for (const ManifestTensor& t : manifest.tensors) {
    const sync::ServedModel::Tensor* local = model.Find(t.name);
    const sync::TensorDelta* change = pending ? pending->Find(t.name) : nullptr;
    bool same = local != nullptr && local->spec.dtype == t.dtype && local->spec.shape == t.shape;
    if (same) {
      const sync::Digest digest = change      ? change->result_digest
                                  : recompute ? sync::TensorDigest(t.dtype, local->bytes, threads)
                                              : local->digest;
      same = digest == t.digest;
    }
    if (!same) {
      return DataLoss("tensor '" + t.name + "' does not match version " +
                      std::to_string(manifest.version) + "'s manifest");
    }
  }
  return Status::Ok();
}

Result<uint64_t> StoreReader::Latest() { return ReadLatest(store_, run_id_); }

Result<Manifest> StoreReader::GetManifest(uint64_t version) {
  return ReadManifest(store_, run_id_, version);
}

Result<std::vector<uint64_t>> StoreReader::Versions() {
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        store_.List("runs/" + run_id_ + "/versions/"));
  std::vector<uint64_t> versions;
  for (const std::string& key : keys) {
    const std::string name = key.substr(key.rfind('/') + 1);
    if (name.size() != 25 || name.substr(20) != ".json") continue;
    versions.push_back(std::strtoull(name.substr(0, 20).c_str(), nullptr, 10));
  }
  return versions;
}

Result<PullReport> StoreReader::Pull(uint64_t target, std::optional<uint64_t> have,
                                     sync::ServedModel* model, const Manifest* held) {
  WEFT_ASSIGN_OR_RETURN(Manifest goal, GetManifest(target));
  if (have) {
    if (*have > target) {
      return InvalidArgument("cannot go back from version " + std::to_string(*have) + " to " +
                             std::to_string(target));
    }
    Manifest fetched;
    if (held == nullptr || held->version != *have || held->run_id != run_id_) {
      Result<Manifest> manifest = GetManifest(*have);
      if (!manifest.ok() && manifest.status().code() != StatusCode::kNotFound) {
        return manifest.status();
      }
      if (manifest.ok()) fetched = std::move(*manifest);
      held = manifest.ok() ? &fetched : nullptr;
    }
    if (held == nullptr) {
      have.reset();  // retention removed it: nothing chains from there any more
    } else {
      WEFT_RETURN_IF_ERROR(CheckAgainstManifest(*model, *held).WithContext("the local copy"));
    }
  }
  Result<PullPlan> planned = PlanPath(store_, run_id_, goal, have, true, fetch_.concurrency);
  if (!planned.ok() && planned.status().code() == StatusCode::kNotFound && have) {
    // Versions after the one held were collected meanwhile: start from the keyframe.
    have.reset();
    planned = PlanPath(store_, run_id_, goal, have, true, fetch_.concurrency);
  }
  if (!planned.ok()) return planned.status();
  const PullPlan& plan = *planned;
  PullReport report;
  report.from = plan.from_keyframe ? std::nullopt : have;
  report.to = target;
  report.path = plan.Describe();

  // Every blob of the path (and the keyframe) is fetched and verified before anything is
  // applied: in parts, concurrently, each part placed (the keyframe's straight into the tensors of
  // a new model, with their digests) and hashed as it arrives.
  const size_t steps = plan.steps.size();
  std::vector<BlobFetch> fetches;
  std::unique_ptr<KeyframeSink> keyframe;
  const std::string keyframe_what = "keyframe of version " + std::to_string(plan.keyframe.version);
  if (plan.from_keyframe) {
    keyframe = std::make_unique<KeyframeSink>(plan.keyframe.keyframe->bytes);
    fetches.push_back({*plan.keyframe.keyframe, keyframe_what, keyframe.get()});
  }
  std::vector<std::unique_ptr<BytesSink>> delta_bytes;
  for (const PullPlan::Step& step : plan.steps) {
    delta_bytes.push_back(std::make_unique<BytesSink>(step.blob.bytes));
    fetches.push_back(
        {step.blob, "delta from version " + std::to_string(step.base), delta_bytes.back().get()});
  }
  WEFT_RETURN_IF_ERROR(FetchBlobs(store_, fetches, fetch_));
  std::vector<LoadedDelta> deltas;
  for (size_t i = 0; i < steps; ++i) {
    WEFT_ASSIGN_OR_RETURN(
        deltas.emplace_back(),
        ParseLoadedDelta(std::move(delta_bytes[i]->bytes()),
                         "delta from version " + std::to_string(plan.steps[i].base)));
  }
  for (const BlobFetch& fetch : fetches) report.bytes_downloaded += fetch.blob.bytes;
  if (plan.from_keyframe) report.fetched.push_back(*plan.keyframe.keyframe);
  for (const PullPlan::Step& step : plan.steps) report.fetched.push_back(step.blob);

  if (plan.from_keyframe) {
    // A new copy: built aside and moved in only once it matches the target.
    Result<sync::ServedModel> built = keyframe->stream().Finish();
    if (!built.ok()) return built.status().WithContext(keyframe_what);
    sync::ServedModel work = std::move(built).value();
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, plan.keyframe).WithContext(keyframe_what));
    for (size_t i = 0; i < steps; ++i) {
      WEFT_RETURN_IF_ERROR(
          work.Apply(deltas[i].delta, threads_)
              .WithContext("delta from version " + std::to_string(plan.steps[i].base)));
    }
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, goal));
    *model = std::move(work);
  } else if (steps > 0) {
    // The copy held, changed in place in O(changed elements): the path squashed into one delta
    // (without the weights; on the held copy, read only, when a delta has context chunks),
    // checked to land on the target's digests, then applied to every tensor at once, which
    // proves each result digest before it writes.
    const std::string what = steps == 1 ? "the delta from version " + std::to_string(plan.start)
                                        : "the deltas from version " + std::to_string(plan.start);
    sync::ModelDelta squashed;
    const sync::ModelDelta* path = &deltas[0].delta;
    if (steps > 1) {
      std::vector<const sync::ModelDelta*> chain;
      for (const LoadedDelta& d : deltas) chain.push_back(&d.delta);
      bool context = false;
      for (const sync::ModelDelta* d : chain) context = context || sync::HasContextChunks(*d);
      Result<sync::ModelDelta> all =
          context ? sync::SquashChainOnBase(chain, model->AsTensorBytes(), sync::DeltaMode::kPlain,
                                            threads_)
                  : sync::SquashChain(chain, threads_);
      if (!all.ok()) return all.status().WithContext(what);
      squashed = std::move(all).value();
      path = &squashed;
    }
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(*model, goal, path).WithContext(what));
    WEFT_RETURN_IF_ERROR(model->Apply(*path, threads_).WithContext(what));
  }
  report.manifest = std::move(goal);
  return report;
}

Result<std::optional<uint64_t>> StoreReader::IdentifyVersion(const sync::ServedModel& model,
                                                             uint64_t max_versions) {
  WEFT_ASSIGN_OR_RETURN(uint64_t latest, Latest());
  for (uint64_t checked = 0; checked < max_versions && checked <= latest; ++checked) {
    WEFT_ASSIGN_OR_RETURN(Manifest m, GetManifest(latest - checked));
    if (CheckAgainstManifest(model, m).ok()) return std::optional<uint64_t>(m.version);
  }
  return std::optional<uint64_t>();
}

}  // namespace weft::policy_store
