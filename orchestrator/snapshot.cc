// OrchestratorCore::Snapshot and Restore: the core's whole state as one JSON document followed
// by the samples of the trajectory groups it holds (docs/formats.md section 7.1, "Snapshot file").
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "common/json_fields.h"
#include "common/names.h"
#include "orchestrator/core.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {
namespace {

using Json = nlohmann::json;

constexpr std::pair<const char*, uint64_t Counters::*> kCounterFields[] = {
    {"jobs_added", &Counters::jobs_added},
    {"jobs_done", &Counters::jobs_done},
    {"jobs_given_up", &Counters::jobs_given_up},
    {"leases_granted", &Counters::leases_granted},
    {"leases_expired", &Counters::leases_expired},
    {"leases_handed_back", &Counters::leases_handed_back},
    {"leases_cancelled", &Counters::leases_cancelled},
    {"submissions_accepted", &Counters::submissions_accepted},
    {"submissions_duplicate", &Counters::submissions_duplicate},
    {"submissions_rejected", &Counters::submissions_rejected},
    {"delivered_fresh", &Counters::delivered_fresh},
    {"delivered_stale", &Counters::delivered_stale},
    {"dropped_stale", &Counters::dropped_stale},
    {"batches", &Counters::batches},
    {"batches_redelivered", &Counters::batches_redelivered},
    {"clusters_lost", &Counters::clusters_lost},
};

template <typename T>
Json Optional(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

template <typename T>
std::optional<T> GetOptional(const Json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<T>();
}

// A group without its samples (wire::GroupFields, with the samples' length and its job's metadata
// when there is some), whose samples go after the document (in `samples`).
Json GroupJson(const Delivered& d, std::string* samples) {
  samples->append(d.group.trajectories);
  Json fields = wire::GroupFields(d.group);
  fields["samples_bytes"] = d.group.trajectories.size();
  if (!d.metadata.empty()) fields["metadata"] = d.metadata;
  if (!d.model.empty()) fields["model"] = d.model;
  if (d.kind != JobKind::kGenerate) fields["kind"] = wire::JobKindName(d.kind);
  return fields;
}

// A job's metadata as a snapshot holds it (a string of JSON text; absent in older snapshots),
// checked as the jobs route checks it: it is handed to the trainer as JSON.
std::string MetadataOf(const Json& text, const std::string& where) {
  std::string metadata = text.get<std::string>();
  Status checked = wire::CheckMetadata(metadata, where);
  if (!checked.ok()) throw std::invalid_argument(checked.message());
  return metadata;
}

// A job's or group's model name and kind (absent in older snapshots: the policy, generate).
std::string ModelOf(const Json& name, const std::string& where) {
  std::string model = name.get<std::string>();
  if (Status checked = CheckName(model, where + ": model"); !checked.ok())
    throw std::invalid_argument(checked.message());
  return model;
}

JobKind KindOf(const Json& name, const std::string& where) {
  Result<JobKind> kind = wire::ParseJobKind(name.get<std::string>());
  if (!kind.ok()) throw std::invalid_argument(where + ": " + kind.status().message());
  return *kind;
}

// The inverse of GroupJson, taking the samples from `samples` at `*offset`; `stale` is left false.
Delivered GroupOf(const Json& fields, std::string_view samples, size_t* offset) {
  Delivered d;
  Status read = wire::ReadGroupFields(fields, "a buffered group", &d.group);
  if (!read.ok()) throw std::invalid_argument(read.message());
  const uint64_t size = fields.at("samples_bytes").get<uint64_t>();
  if (size > samples.size() - *offset) {
    throw std::out_of_range("a group's samples run past the end of the snapshot");
  }
  d.group.trajectories = std::string(samples.substr(*offset, size));
  *offset += size;
  if (fields.contains("metadata"))
    d.metadata = MetadataOf(fields["metadata"], "the metadata of a buffered group");
  if (fields.contains("model")) d.model = ModelOf(fields["model"], "a buffered group");
  if (fields.contains("kind")) d.kind = KindOf(fields["kind"], "a buffered group");
  return d;
}

}  // namespace

std::string OrchestratorCore::Snapshot() const {
  std::string samples;
  Json doc = Json::object();
  doc["latest"] = Optional(latest_);
  doc["next_job"] = next_job_;
  doc["next_batch"] = next_batch_;
  doc["last_progress"] = last_progress_;
  Json counters = Json::object();
  for (const auto& [name, field] : kCounterFields) counters[name] = counters_.*field;
  doc["counters"] = counters;
  Json jobs = Json::array();
  for (const auto& [id, j] : jobs_) {
    Json job = {id,        j.prompt, j.samples, j.holders, j.min_versions, Optional(j.leased_to),
                j.deadline};
    wire::AppendJobTail(job, j.metadata, j.model, j.kind, j.targets);
    jobs.push_back(std::move(job));
  }
  doc["jobs"] = std::move(jobs);
  // Each model's queue in its order, the models one after another.
  Json queue = Json::array();
  for (const auto& [model, ids] : queues_)
    for (uint64_t id : ids) queue.push_back(id);
  doc["queue"] = std::move(queue);
  if (!fixed_models_.empty()) doc["models"] = fixed_models_;
  doc["done"] = done_;
  Json clusters = Json::array();
  for (const auto& [id, c] : clusters_) {
    clusters.push_back({id, c.region, c.capacity, Optional(c.ready_version), c.max_ready_version,
                        c.draining, c.gone, c.last_heartbeat, c.completed, c.throughput,
                        c.last_completion, c.last_request, c.last_granted, c.credential});
    if (!c.model.empty()) clusters.back().push_back(c.model);
  }
  doc["clusters"] = std::move(clusters);
  Json buffer = Json::array();
  for (const Delivered& d : buffer_) buffer.push_back(GroupJson(d, &samples));
  doc["buffer"] = std::move(buffer);
  Json outstanding = Json::array();
  for (const auto& [id, items] : outstanding_) {
    Json batch = Json::array();
    for (const Delivered& d : items) batch.push_back({GroupJson(d, &samples), d.stale});
    outstanding.push_back({id, std::move(batch)});
  }
  doc["outstanding"] = std::move(outstanding);
  return doc.dump() + "\n" + samples;
}

Result<OrchestratorCore> OrchestratorCore::Restore(CoreConfig config, std::string_view snapshot) {
  const size_t newline = snapshot.find('\n');
  if (newline == std::string_view::npos)
    return DataLoss("core snapshot: no newline after the state document");
  Json doc = Json::parse(snapshot.substr(0, newline), nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return DataLoss("core snapshot: the state document is not a JSON object");
  const std::string_view samples = snapshot.substr(newline + 1);
  // Integers only, but a cluster's throughput: a fraction read as an integer is undefined.
  for (const auto& [key, value] : doc.items()) {
    if (key == "clusters" && value.is_array()) {
      for (const Json& c : value) {
        for (size_t i = 0; c.is_array() && i < c.size(); ++i)
          if (i != 9 && !AllIntegers(c[i]))
            return DataLoss("core snapshot: a fraction in a cluster");
      }
    } else if (!AllIntegers(value)) {
      return DataLoss("core snapshot: a fraction where " + key + " has integers");
    }
  }
  auto time = [](const Json& value) {
    const Micros t = value.get<Micros>();
    if (t < 0 || t > kMaxMicros) throw std::out_of_range("a time out of range");
    return t;
  };
  size_t offset = 0;
  OrchestratorCore core(config);
  try {
    core.latest_ = GetOptional<uint64_t>(doc.at("latest"));
    core.next_job_ = doc.at("next_job").get<uint64_t>();
    core.next_batch_ = doc.at("next_batch").get<uint64_t>();
    core.last_progress_ = time(doc.at("last_progress"));
    for (const auto& [name, field] : kCounterFields)
      core.counters_.*field = doc.at("counters").at(name).get<uint64_t>();
    if (doc.contains("models")) {
      for (const auto& [name, digest] : doc.at("models").items()) {
        ModelOf(name, "the snapshot's models");
        core.fixed_models_[name] = digest.get<std::string>();
      }
    }
    for (const Json& c : doc.at("clusters")) {
      const std::string id = c.at(0).get<std::string>();
      if (core.clusters_.count(id)) return DataLoss("core snapshot: cluster " + id + " twice");
      Cluster& cluster = core.clusters_[id];
      cluster.region = c.at(1).get<std::string>();
      cluster.capacity = c.at(2).get<uint32_t>();
      if (c.size() > 14) cluster.model = c.at(14).get<std::string>();  // older: the policy
      if (!cluster.model.empty() && !core.fixed_models_.count(cluster.model))
        return DataLoss("core snapshot: cluster " + id + " serves model " + cluster.model +
                        ", whose digest it does not hold");
      core.capacity_sum_[cluster.model] += cluster.capacity;
      cluster.ready_version = GetOptional<uint64_t>(c.at(3));
      cluster.max_ready_version = c.at(4).get<uint64_t>();
      cluster.draining = c.at(5).get<bool>();
      cluster.gone = c.at(6).get<bool>();
      cluster.last_heartbeat = time(c.at(7));
      cluster.completed = c.at(8).get<uint64_t>();
      cluster.throughput = c.at(9).get<double>();
      cluster.last_completion = time(c.at(10));
      cluster.last_request = c.at(11).get<uint64_t>();
      cluster.last_granted = c.at(12).get<std::vector<std::pair<uint64_t, uint32_t>>>();
      if (c.size() > 13) cluster.credential = c.at(13).get<std::string>();  // older: none
    }
    for (const Json& j : doc.at("jobs")) {
      const uint64_t id = j.at(0).get<uint64_t>();
      if (core.jobs_.count(id) || id == 0 || id >= core.next_job_)
        return DataLoss("core snapshot: job " + std::to_string(id) + " twice or out of range");
      Job& job = core.jobs_[id];
      job.prompt = j.at(1).get<std::string>();
      job.samples = j.at(2).get<uint32_t>();
      job.holders = j.at(3).get<std::vector<std::string>>();
      job.min_versions = j.at(4).get<std::vector<uint64_t>>();
      job.leased_to = GetOptional<std::string>(j.at(5));
      job.deadline = time(j.at(6));
      if (j.size() > 7 && !j.at(7).get<std::string>().empty())  // older snapshots: no metadata
        job.metadata = MetadataOf(j.at(7), "the metadata of job " + std::to_string(id));
      if (j.size() > 8) {  // older snapshots: the policy's generate jobs only
        job.model = j.at(8).get<std::string>();
        if (!job.model.empty()) ModelOf(j.at(8), "job " + std::to_string(id));
        job.kind = KindOf(j.at(9), "job " + std::to_string(id));
        job.targets = j.at(10).get<std::string>();
        Status targets =
            wire::CheckTargets(job.targets, job.kind, "the targets of job " + std::to_string(id));
        if (!targets.ok()) throw std::invalid_argument(targets.message());
      }
      if (job.holders.size() != job.min_versions.size() ||
          (job.leased_to && (job.holders.empty() || job.holders.back() != *job.leased_to)))
        return DataLoss("core snapshot: job " + std::to_string(id) + " is inconsistent");
      if (job.leased_to) {
        Cluster* holder = core.FindCluster(*job.leased_to);
        if (holder == nullptr)
          return DataLoss("core snapshot: job " + std::to_string(id) +
                          " is leased to an unknown cluster");
        holder->jobs.insert(id);
        core.leases_.insert(id);
      }
    }
    std::set<uint64_t> queued;
    for (uint64_t id : doc.at("queue").get<std::vector<uint64_t>>()) {
      auto job = core.jobs_.find(id);
      if (job == core.jobs_.end() || job->second.leased_to || !queued.insert(id).second)
        return DataLoss("core snapshot: the queue holds job " + std::to_string(id) +
                        ", which is not an open job waiting for a lease");
      core.queues_[job->second.model].push_back(id);
    }
    if (queued.size() + core.leases_.size() != core.jobs_.size())
      return DataLoss("core snapshot: an open job is neither queued nor leased");
    core.done_ = doc.at("done").get<std::map<uint64_t, uint32_t>>();
    for (const Json& s : doc.at("buffer")) core.buffer_.push_back(GroupOf(s, samples, &offset));
    for (const Json& batch : doc.at("outstanding")) {
      std::vector<Delivered>& items = core.outstanding_[batch.at(0).get<uint64_t>()];
      for (const Json& d : batch.at(1)) {
        items.push_back(GroupOf(d.at(0), samples, &offset));
        items.back().stale = d.at(1).get<bool>();
      }
      core.outstanding_items_ += items.size();
    }
  } catch (const std::exception& error) {
    return DataLoss(std::string("core snapshot: ") + error.what());
  }
  if (offset != samples.size())
    return DataLoss("core snapshot: " + std::to_string(samples.size() - offset) +
                    " bytes after the last group's samples");
  return core;
}

}  // namespace weft::orchestrator
