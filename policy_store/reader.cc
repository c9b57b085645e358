#include "policy_store/reader.h"

#include <algorithm>
#include <filesystem>

#include "common/concurrent.h"
#include "common/logging.h"
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
  KeyframeSink(uint64_t size, sync::ServedModelStream::StorageFor storage)
      : stream_(size, std::move(storage)) {}
  Status Place(uint64_t offset, std::span<const uint8_t> bytes) override {
    return stream_.Place(offset, bytes);
  }
  void Restart() override { stream_.Restart(); }
  // Parts are read straight into their tensors, once the header is in.
  std::vector<std::span<uint8_t>> Windows(uint64_t offset, uint64_t size) override {
    return stream_.Windows(offset, size);
  }
  Status Placed(uint64_t offset, uint64_t size) override { return stream_.Placed(offset, size); }
  bool StartFirst() const override { return true; }
  sync::ServedModelStream& stream() { return stream_; }

 private:
  sync::ServedModelStream stream_;
};

// "delta from version 7": one step of a plan, in messages.
std::string StepName(const PullPlan::Step& step) {
  return "delta from version " + std::to_string(step.base);
}

// "the delta from version 7", "the deltas from version 7": the steps of a plan, for errors.
std::string PathName(const PullPlan& plan) {
  return (plan.steps.size() == 1 ? "the delta from version " : "the deltas from version ") +
         std::to_string(plan.start);
}

// Whether a delta decoded whole before it is written (sync::ServedModel::Apply: about 8 bytes
// per changed element, kept for the next version) stays within an eighth of the model's size.
bool DecodesSmall(const sync::ModelDelta& delta, uint64_t model_bytes) {
  const sync::DeltaStats stats = sync::ComputeStats(delta);
  return 8 * (stats.changes + stats.raw_units) <= model_bytes / 8;
}

// The bytes of a version's served tensors, from its manifest.
uint64_t ModelBytes(const Manifest& manifest) {
  uint64_t bytes = 0;
  for (const ManifestTensor& tensor : manifest.tensors) {
    uint64_t elements = 1;
    for (uint64_t d : tensor.shape) elements *= d;
    bytes += elements * sync::Info(tensor.dtype).size;
  }
  return bytes;
}

}  // namespace

Status StoreReader::ApplyPath(std::span<const sync::ModelDelta* const> chain, const PullPlan& plan,
                              sync::ServedModel* model,
                              const std::function<void(size_t, std::span<const uint8_t>)>& release,
                              bool* partly_written) {
  if (chain.empty()) return Status::Ok();
  // One small delta (a reader following the run version by version) is decoded whole and written
  // in one short pass. Anything larger (a catch-up) is applied chunk by chunk in place, in the
  // model's memory plus a chunk's working space per thread, proving every delta's digests before
  // it writes.
  if (chain.size() == 1 && DecodesSmall(*chain[0], model->byte_count())) {
    return model->Apply(*chain[0], threads_).WithContext(PathName(plan));
  }
  size_t failed = 0;
  sync::ApplyChainOptions options;
  options.release = release;
  options.partly_written = partly_written;
  // The pages of a window's payloads are held while it is walked: a small part of the model.
  options.window_bytes = std::clamp<uint64_t>(model->byte_count() / 256, 256 << 10, 32 << 20);
  Status status = model->ApplyChain(chain, threads_, &failed, options);
  if (status.ok()) return status;
  return status.WithContext("the " + StepName(plan.steps[std::min(failed, plan.steps.size() - 1)]));
}

std::string StoreReader::DefaultSpillDir() {
  std::error_code error;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(error);
  return error ? std::string() : dir.string();
}

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

Result<StoreReader::LatestWatch> StoreReader::WatchLatest(std::chrono::milliseconds wait,
                                                          const std::atomic<bool>* cancel) {
  const std::string key = LatestKey(run_id_);
  WEFT_ASSIGN_OR_RETURN(
      ObjectWatch watched,
      store_.WaitForChange(key, latest_seen_ ? *latest_seen_ : std::nullopt,
                           latest_seen_ ? wait : std::chrono::milliseconds(0), cancel));
  latest_seen_ = watched.value;
  LatestWatch latest{std::nullopt, watched.waited};
  if (!watched.value) return latest;
  latest.version = ParseVersionText(*watched.value);
  if (!latest.version) return DataLoss(key + " does not hold a version number");
  return latest;
}

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
  if (plan.from_keyframe && drop_copy_for_keyframe_ && !model->tensors().empty()) {
    // The copy held cannot start this path: its memory goes before the new copy's arrives.
    *model = sync::ServedModel();
    report.dropped_copy = true;
  }

  // Every blob of the path (and the keyframe) is fetched and verified before anything is
  // applied: in parts, concurrently, each part placed (the keyframe's straight into the tensors of
  // a new model, with their digests) and hashed as it arrives.
  const size_t steps = plan.steps.size();
  std::vector<BlobFetch> fetches;
  // A keyframe in parts is fetched part by part, concurrently, each into a model of its own.
  std::vector<std::unique_ptr<KeyframeSink>> keyframe;
  const std::string keyframe_what = "keyframe of version " + std::to_string(plan.keyframe.version);
  auto part_what = [&](size_t i) {
    return plan.keyframe.keyframe.size() == 1
               ? keyframe_what
               : keyframe_what + ", part " + std::to_string(i + 1) + " of " +
                     std::to_string(plan.keyframe.keyframe.size());
  };
  if (plan.from_keyframe) {
    sync::ServedModelStream::StorageFor storage;
    if (placement_ != nullptr) {
      WEFT_RETURN_IF_ERROR(placement_->Prepare(plan.keyframe).WithContext(keyframe_what));
      storage = [placement = placement_](const sync::TensorSpec& spec, uint64_t bytes) {
        return placement->Storage(spec, bytes);
      };
    }
    for (size_t i = 0; i < plan.keyframe.keyframe.size(); ++i) {
      const BlobRef& part = plan.keyframe.keyframe[i];
      keyframe.push_back(std::make_unique<KeyframeSink>(part.bytes, storage));
      fetches.push_back({part, part_what(i), keyframe.back().get()});
    }
  }
  // The deltas: in memory, or, when they would take more than the spill fraction of the model
  // beside it, in spill files streamed to as they arrive.
  uint64_t delta_total = 0;
  for (const PullPlan::Step& step : plan.steps) delta_total += step.blob.bytes;
  std::vector<SpillFile> spills;
  if (!spill_dir_.empty() &&
      static_cast<double>(delta_total) > spill_fraction_ * static_cast<double>(ModelBytes(goal))) {
    for (const PullPlan::Step& step : plan.steps) {
      Result<SpillFile> spill = SpillFile::Create(spill_dir_, step.blob.bytes);
      if (!spill.ok()) {
        WEFT_LOG(kWarning) << "the deltas of this pull are kept in memory: "
                           << spill.status().message();
        spills.clear();
        break;
      }
      spills.push_back(std::move(spill).value());
    }
  }
  const bool spilled = !spills.empty();
  std::vector<std::unique_ptr<BlobSink>> delta_sinks;
  for (size_t i = 0; i < steps; ++i) {
    if (spilled) {
      delta_sinks.push_back(std::make_unique<FileSink>(std::move(spills[i])));
    } else {
      delta_sinks.push_back(std::make_unique<BytesSink>(plan.steps[i].blob.bytes));
    }
    fetches.push_back({plan.steps[i].blob, StepName(plan.steps[i]), delta_sinks.back().get()});
  }
  WEFT_RETURN_IF_ERROR(FetchBlobs(store_, fetches, fetch_));
  // Parsed where they are: a spilled delta from its mapped file, its pages let go as the parse
  // moves on (they are read again when applied).
  std::vector<std::vector<uint8_t>> delta_bytes(steps);
  std::vector<MappedFile> mapped(steps);
  std::vector<sync::ModelDelta> deltas(steps);
  for (size_t i = 0; i < steps; ++i) {
    std::span<const uint8_t> bytes;
    if (spilled) {
      WEFT_ASSIGN_OR_RETURN(mapped[i], static_cast<FileSink&>(*delta_sinks[i]).spill().Map());
      bytes = mapped[i].bytes();
    } else {
      delta_bytes[i] = std::move(static_cast<BytesSink&>(*delta_sinks[i]).bytes());
      bytes = delta_bytes[i];
    }
    const MappedFile& file = mapped[i];
    Result<sync::ModelDelta> parsed = sync::ParseModelDelta(bytes, [&](uint64_t done) {
      if (spilled) file.Release(bytes.first(done));
    });
    if (!parsed.ok()) return parsed.status().WithContext(StepName(plan.steps[i]));
    deltas[i] = std::move(parsed).value();
    if (spilled) file.Release(bytes);
  }
  std::function<void(size_t, std::span<const uint8_t>)> release;
  if (spilled)
    release = [&](size_t k, std::span<const uint8_t> bytes) { mapped[k].Release(bytes); };
  bool partly_written = false;
  for (const BlobFetch& fetch : fetches) report.bytes_downloaded += fetch.blob.bytes;
  if (plan.from_keyframe) {
    for (const BlobRef& part : plan.keyframe.keyframe) report.fetched.push_back(part);
  }
  for (const PullPlan::Step& step : plan.steps) report.fetched.push_back(step.blob);

  std::vector<const sync::ModelDelta*> chain;
  for (const sync::ModelDelta& d : deltas) chain.push_back(&d);
  if (plan.from_keyframe) {
    // A new copy: built aside and moved in only once it matches the target.
    std::vector<sync::ServedModel> parts;
    for (size_t i = 0; i < keyframe.size(); ++i) {
      Result<sync::ServedModel> built = keyframe[i]->stream().Finish();
      if (!built.ok()) return built.status().WithContext(part_what(i));
      parts.push_back(std::move(built).value());
    }
    Result<sync::ServedModel> joined = sync::ServedModel::Join(std::move(parts));
    if (!joined.ok()) return DataLoss(joined.status().message()).WithContext(keyframe_what);
    sync::ServedModel work = std::move(joined).value();
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, plan.keyframe).WithContext(keyframe_what));
    WEFT_RETURN_IF_ERROR(ApplyPath(chain, plan, &work, release, &partly_written));
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, goal));
    *model = std::move(work);
  } else if (steps > 0) {
    // The copy held, changed in place in O(changed elements), checked to land on the target's
    // digests first; every delta's result digest is proven before anything is written.
    WEFT_RETURN_IF_ERROR(
        CheckAgainstManifest(*model, goal, chain.back()).WithContext(PathName(plan)));
    const Status applied = ApplyPath(chain, plan, model, release, &partly_written);
    if (!applied.ok() && partly_written) {
      // A spilled delta read back other than it was first read: part of the copy was written,
      // so it is no version any more.
      *model = sync::ServedModel();
    }
    WEFT_RETURN_IF_ERROR(applied);
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
