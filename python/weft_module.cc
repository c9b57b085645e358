// weft._weft: the native half of the weft Python package, a thin binding over the trainer adapter
// (trainer_adapter::Publisher, trainer_adapter::BatchClient) and the orchestrator client. The
// public API is the pure-Python layer in python/weft/, which calls only what is defined here.
//
// Tensors arrive through DLPack capsules (`tensor.__dlpack__()`) and are read where they lie: the
// publisher converts and encodes straight from the trainer's memory, never copying the master
// weights. Every call that encodes, uploads or waits on the network releases the GIL. Errors are
// raised as the weft.Error subclass of their status code (registered by the Python layer).
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orchestrator/client.h"
#include "orchestrator/wire.h"
#include "policy_store/object_store.h"
#include "trainer_adapter/batch_client.h"
#include "trainer_adapter/publisher.h"

namespace py = pybind11;

namespace weft::python {
namespace {

// A failed weft call on its way to Python.
struct StatusError {
  Status status;
};

// The Python exception class of each status code, from the Python layer (weft/errors.py).
py::dict& ErrorClasses() {
  static py::dict* classes = new py::dict();  // never destroyed: outlives the interpreter's exit
  return *classes;
}

void Check(const Status& status) {
  if (!status.ok()) throw StatusError{status};
}
template <typename T>
T Unwrap(Result<T> result) {
  if (!result.ok()) throw StatusError{result.status()};
  return std::move(result).value();
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 1e9) {
    throw StatusError{InvalidArgument(
        std::string(what) + " must be a number of seconds >= 0, not " + std::to_string(seconds))};
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// The DLPack tensor inside a capsule that `__dlpack__()` made. The capsule keeps ownership (it is
// not consumed), so the producer frees the tensor when the capsule is collected.
const DLManagedTensor& TensorOf(const py::handle& capsule, const std::string& name) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    throw StatusError{InvalidArgument(
        "tensor '" + name + "': not an unused DLPack capsule (pass tensor.__dlpack__())")};
  }
  return *static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
}

std::string DTypeText(const DLDataType& type) {
  const char* code = type.code == kDLFloat    ? "float"
                     : type.code == kDLBfloat ? "bfloat"
                     : type.code == kDLInt    ? "int"
                     : type.code == kDLUInt   ? "uint"
                                              : nullptr;
  std::string text = code ? std::string(code) + std::to_string(type.bits)
                          : "DLPack type code " + std::to_string(type.code) + " of " +
                                std::to_string(type.bits) + " bits";
  if (type.lanes != 1) text += " x" + std::to_string(type.lanes);
  return text;
}

// Master tensors viewing the memory of (name, capsule) pairs: FP32 or BF16, on the CPU, and
// contiguous (row-major), or a clear error naming the tensor.
std::vector<sync::MasterTensor> MasterView(
    const std::vector<std::pair<std::string, py::object>>& in) {
  std::vector<sync::MasterTensor> master;
  master.reserve(in.size());
  for (const auto& named : in) {
    const std::string& name = named.first;
    const DLTensor& t = TensorOf(named.second, name).dl_tensor;
    if (t.device.device_type != kDLCPU) {
      throw StatusError{
          InvalidArgument("tensor '" + name + "' is not in CPU memory (DLPack device type " +
                          std::to_string(t.device.device_type) +
                          "); publish CPU tensors (the publisher reads them in place)")};
    }
    const bool f32 = t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1;
    const bool bf16 = t.dtype.code == kDLBfloat && t.dtype.bits == 16 && t.dtype.lanes == 1;
    if (!f32 && !bf16) {
      throw StatusError{InvalidArgument("tensor '" + name + "' is " + DTypeText(t.dtype) +
                                        "; master weights are float32 or bfloat16")};
    }
    if (t.ndim < 0 || t.ndim > sync::kMaxRank) {
      throw StatusError{InvalidArgument("tensor '" + name + "' has " + std::to_string(t.ndim) +
                                        " dimensions; at most " + std::to_string(sync::kMaxRank) +
                                        " are served")};
    }
    std::vector<uint64_t> shape;
    uint64_t count = 1;
    for (int d = 0; d < t.ndim; ++d) {
      shape.push_back(static_cast<uint64_t>(t.shape[d]));
      count *= static_cast<uint64_t>(t.shape[d]);
    }
    // Row-major strides (in elements); a dimension of size 1 may carry any stride.
    if (t.strides != nullptr && count > 0) {
      int64_t expected = 1;
      for (int d = t.ndim - 1; d >= 0; --d) {
        if (t.shape[d] != 1 && t.strides[d] != expected) {
          throw StatusError{InvalidArgument(
              "tensor '" + name +
              "' is not contiguous; publish tensor.contiguous() (a copy) or a contiguous view")};
        }
        expected *= t.shape[d];
      }
    }
    const uint8_t* data = static_cast<const uint8_t*>(t.data) + t.byte_offset;
    if (reinterpret_cast<uintptr_t>(data) % (f32 ? 4 : 2) != 0) {
      throw StatusError{InvalidArgument("tensor '" + name + "' is not aligned to its " +
                                        std::string(f32 ? "4" : "2") +
                                        "-byte elements; publish an aligned copy")};
    }
    sync::MasterValues values = f32 ? sync::MasterValues(std::span<const float>(
                                          reinterpret_cast<const float*>(data), count))
                                    : sync::MasterValues::Bf16(std::span<const uint16_t>(
                                          reinterpret_cast<const uint16_t*>(data), count));
    master.push_back({name, std::move(shape), values});
  }
  return master;
}

sync::DType ServingDType(const std::string& serving) {
  if (std::optional<sync::DType> dtype = sync::ServingFormatByName(serving)) return *dtype;
  throw StatusError{InvalidArgument("serving format '" + serving +
                                    "' is not one of bf16, fp16, fp8-e4m3, fp8-e5m2")};
}

py::dict StatsDict(const trainer_adapter::PublishStats& stats,
                   const policy_store::Manifest& manifest, uint64_t served_bytes) {
  py::dict d;
  d["version"] = stats.version;
  d["bytes_written"] = stats.bytes_written;
  d["changed_elements"] = stats.changed_elements;
  d["elements"] = stats.elements;
  d["density"] = stats.density();
  d["seconds"] = stats.seconds;
  d["keyframe"] = manifest.has_keyframe();
  d["keyframe_bytes"] = manifest.keyframe_bytes();
  d["delta_bytes"] = manifest.delta ? manifest.delta->bytes : 0;
  d["served_bytes"] = served_bytes;
  return d;
}

class PyPublisher {
 public:
  PyPublisher(const std::string& store, const std::string& run, const std::string& serving,
              uint32_t block, uint64_t rank, uint64_t world, uint64_t keyframe_interval,
              double keyframe_budget, const std::optional<std::string>& token, int threads,
              double shard_deadline_s, const std::string& delta_mode)
      : run_(run) {
    plan_.dtype = ServingDType(serving);
    plan_.fp8_block = block;
    if (keyframe_interval < 1) throw StatusError{InvalidArgument("keyframe_interval must be >= 1")};
    if (threads < 1 || threads > 1024)
      throw StatusError{InvalidArgument("threads must be 1 to 1024")};
    options_.keyframes.interval = keyframe_interval;
    if (!(keyframe_budget >= 0) || keyframe_budget > 1e9) {
      throw StatusError{InvalidArgument("keyframe_budget must be a positive number (or None)")};
    }
    if (keyframe_budget > 0) options_.keyframes.delta_budget = keyframe_budget;  // 0: the default
    const std::optional<sync::DeltaMode> mode = sync::ParseDeltaMode(delta_mode);
    if (!mode) {
      throw StatusError{
          InvalidArgument("delta_mode must be 'plain' or 'context', not '" + delta_mode + "'")};
    }
    options_.keyframes.delta_mode = *mode;
    options_.codec.threads = threads;
    options_.rank = rank;
    options_.world = world;
    options_.shard_deadline = Millis(shard_deadline_s, "shard_deadline");
    if (world < 1 || rank >= world) {
      throw StatusError{InvalidArgument("rank " + std::to_string(rank) + " is not in a world of " +
                                        std::to_string(world))};
    }
    Check(policy_store::ValidateRunId(run));
    policy_store::OpenOptions open;
    open.writer_token = token;
    open.create = true;
    store_ = Unwrap(policy_store::OpenStore(store, open));
  }

  // The mutex is only ever taken with the GIL released, so a thread waiting for it never holds
  // the GIL that the thread inside needs back.
  py::dict Start(const std::vector<std::pair<std::string, py::object>>& tensors) {
    const std::vector<sync::MasterTensor> master = MasterView(tensors);
    Status started = Status::Ok();
    trainer_adapter::PublishStats stats;
    policy_store::Manifest manifest;
    uint64_t served_bytes = 0;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      if (publisher_) {
        started = Conflict("start() was called already; call publish()");
      } else {
        Result<std::unique_ptr<trainer_adapter::Publisher>> made =
            trainer_adapter::Publisher::Start(*store_, run_, master, plan_, options_);
        if (made.ok()) {
          publisher_ = std::move(made).value();
          Snapshot(&stats, &manifest, &served_bytes);
        } else {
          started = made.status();
        }
      }
    }
    Check(started);
    return StatsDict(stats, manifest, served_bytes);
  }

  py::dict Publish(const std::vector<std::pair<std::string, py::object>>& tensors) {
    const std::vector<sync::MasterTensor> master = MasterView(tensors);
    Status published = Status::Ok();
    trainer_adapter::PublishStats stats;
    policy_store::Manifest manifest;
    uint64_t served_bytes = 0;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      if (!publisher_) {
        published = Conflict("publish() before start(): start the run first");
      } else {
        published = publisher_->Publish(master).status();
        if (published.ok()) Snapshot(&stats, &manifest, &served_bytes);
      }
    }
    Check(published);
    return StatsDict(stats, manifest, served_bytes);
  }

  // The last version published; read without the mutex, so it answers while a publish runs.
  std::optional<uint64_t> version() const {
    const int64_t v = last_version_.load();
    return v < 0 ? std::nullopt : std::optional<uint64_t>(static_cast<uint64_t>(v));
  }

  std::string describe() const { return store_->Describe(); }

 private:
  // What the last call did (with the mutex held).
  void Snapshot(trainer_adapter::PublishStats* stats, policy_store::Manifest* manifest,
                uint64_t* served_bytes) {
    *stats = publisher_->last_stats();
    *manifest = publisher_->last();
    *served_bytes = publisher_->served().byte_count();
    last_version_.store(static_cast<int64_t>(manifest->version));
  }

  std::string run_;
  sync::ServingPlan plan_;
  trainer_adapter::PublisherOptions options_;
  std::unique_ptr<policy_store::ObjectStore> store_;
  std::mutex mutex_;  // one publish at a time (the GIL is released while it runs)
  std::unique_ptr<trainer_adapter::Publisher> publisher_;
  std::atomic<int64_t> last_version_{-1};
};

HttpClientOptions ClientOptions(double deadline_s, const std::string& ca_file) {
  HttpClientOptions options;
  options.deadline = Millis(deadline_s, "deadline");
  options.ca_file = ca_file;
  return options;
}

nlohmann::json ParseJson(const std::string& text, const std::string& what) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) throw StatusError{InvalidArgument(what + " is not JSON")};
  return value;
}

// A delivered group as the Python layer builds its objects from it.
py::dict GroupDict(const orchestrator::Delivered& d) {
  py::dict g;
  g["job"] = d.group.job;
  g["attempt"] = d.group.attempt;
  g["cluster"] = d.group.cluster;
  g["version_start"] = d.group.version_start;
  g["version_end"] = d.group.version_end;
  py::list segments;
  for (const auto& segment : d.group.segments)
    segments.append(py::make_tuple(segment.first, segment.second));
  g["segments"] = segments;
  g["tokens"] = d.group.tokens;
  g["trajectories"] = py::bytes(d.group.trajectories);
  g["metadata"] = d.metadata.empty() ? py::object(py::none()) : py::bytes(d.metadata);
  g["stale"] = d.stale;
  return g;
}

class PyOrchestrator {
 public:
  PyOrchestrator(const std::string& url, const std::string& token, double deadline_s,
                 const std::string& ca_file)
      : client_(url, token, ClientOptions(deadline_s, ca_file)) {}

  void Announce(uint64_t version, std::optional<double> publish_seconds) {
    Status announced = Status::Ok();
    {
      py::gil_scoped_release release;
      announced = client_.AnnounceVersion(version, publish_seconds);
    }
    Check(announced);
  }

  // Jobs as (prompt JSON text, samples, metadata JSON text or None).
  std::vector<uint64_t> AddJobs(
      const std::vector<std::tuple<std::string, uint32_t, std::optional<std::string>>>& jobs) {
    std::vector<orchestrator::NewJob> parsed;
    parsed.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      const std::string where = "job " + std::to_string(i);
      orchestrator::NewJob job;
      job.prompt = ParseJson(std::get<0>(jobs[i]), where + "'s prompt");
      job.samples = std::get<1>(jobs[i]);
      if (std::get<2>(jobs[i]))
        job.metadata = ParseJson(*std::get<2>(jobs[i]), where + "'s metadata");
      parsed.push_back(std::move(job));
    }
    std::optional<Result<std::vector<uint64_t>>> ids;
    {
      py::gil_scoped_release release;
      ids.emplace(client_.AddJobs(std::span<const orchestrator::NewJob>(parsed)));
    }
    return Unwrap(std::move(*ids));
  }

  // The status page, checked by the client and encoded again (the same JSON the service sent).
  std::string GetStatus() {
    std::optional<Result<orchestrator::wire::StatusPage>> status;
    {
      py::gil_scoped_release release;
      status.emplace(client_.GetStatus());
    }
    return orchestrator::wire::Encode(Unwrap(std::move(*status)));
  }

 private:
  orchestrator::OrchestratorClient client_;
};

class PyBatchClient {
 public:
  PyBatchClient(const std::string& url, const std::string& token, uint64_t max_staleness,
                double deadline_s, const std::string& ca_file)
      : client_(url, token, ClientOptions(deadline_s, ca_file)), batches_(client_, max_staleness) {}

  py::list NextGroups(size_t groups, uint64_t trainer_version, double timeout_s) {
    if (groups < 1 || groups > 100000)
      throw StatusError{InvalidArgument("groups must be 1 to 100000")};
    const std::chrono::milliseconds wait = Millis(timeout_s, "timeout");
    std::optional<Result<std::vector<orchestrator::Delivered>>> batch;
    {
      py::gil_scoped_release release;  // before the mutex: see PyPublisher
      std::lock_guard<std::mutex> lock(mutex_);
      batch.emplace(batches_.NextGroups(groups, trainer_version, wait));
    }
    py::list out;
    for (const orchestrator::Delivered& d : Unwrap(std::move(*batch))) out.append(GroupDict(d));
    return out;
  }

  void Acknowledge() {
    Status acknowledged = Status::Ok();
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      acknowledged = client_.AcknowledgeBatches();
    }
    Check(acknowledged);
  }

  py::dict Staleness() {
    trainer_adapter::StalenessStats s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      s = batches_.staleness();
    }
    py::dict d;
    d["groups"] = s.groups;
    d["samples"] = s.samples;
    d["stale_delivered"] = s.stale_delivered;
    d["violations"] = s.violations;
    d["max_lag"] = s.max_lag;
    d["mean_lag"] = s.mean_lag();
    py::dict histogram;
    for (const auto& entry : s.lag_histogram) histogram[py::int_(entry.first)] = entry.second;
    d["lag_histogram"] = histogram;
    return d;
  }

 private:
  orchestrator::OrchestratorClient client_;
  trainer_adapter::BatchClient batches_;
  std::mutex mutex_;  // the batch client is one trainer loop's
};

// The pointer, dtype and shape the publisher would read for each tensor (tests prove with it that
// nothing is copied).
py::list Inspect(const std::vector<std::pair<std::string, py::object>>& tensors) {
  py::list out;
  for (const sync::MasterTensor& m : MasterView(tensors)) {
    const void* data = m.weights.is_f32() ? static_cast<const void*>(m.weights.f32().data())
                                          : static_cast<const void*>(m.weights.bf16().data());
    out.append(py::make_tuple(m.name, m.weights.is_f32() ? "float32" : "bfloat16",
                              reinterpret_cast<uintptr_t>(data), m.shape));
  }
  return out;
}

}  // namespace
}  // namespace weft::python

PYBIND11_MODULE(_weft, m) {
  using namespace weft::python;
  m.doc() = "weft's native module; use the weft package";
  m.def("_set_error_classes", [](py::dict classes) { ErrorClasses() = std::move(classes); });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const std::string code(weft::StatusCodeName(e.status.code()));
      py::dict& classes = ErrorClasses();
      PyObject* type = classes.contains(code) ? classes[py::str(code)].ptr() : PyExc_RuntimeError;
      // Messages may quote bytes from elsewhere (an error body cut short): never lose them.
      const std::string& message = e.status.message();
      py::object text = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace"));
      PyErr_SetObject(type, text.ptr());
    }
  });
  m.def("inspect_tensors", &Inspect, py::arg("tensors"));

  py::class_<PyPublisher>(m, "Publisher")
      .def(py::init<const std::string&, const std::string&, const std::string&, uint32_t, uint64_t,
                    uint64_t, uint64_t, double, const std::optional<std::string>&, int, double,
                    const std::string&>(),
           py::arg("store"), py::arg("run"), py::arg("serving"), py::arg("block"), py::arg("rank"),
           py::arg("world"), py::arg("keyframe_interval"), py::arg("keyframe_budget"),
           py::arg("token"), py::arg("threads"), py::arg("shard_deadline"),
           py::arg("delta_mode") = "plain")
      .def("start", &PyPublisher::Start)
      .def("publish", &PyPublisher::Publish)
      .def_property_readonly("version", &PyPublisher::version)
      .def_property_readonly("store", &PyPublisher::describe);

  py::class_<PyOrchestrator>(m, "Orchestrator")
      .def(py::init<const std::string&, const std::string&, double, const std::string&>(),
           py::arg("url"), py::arg("token"), py::arg("deadline"), py::arg("ca_file"))
      .def("announce", &PyOrchestrator::Announce, py::arg("version"),
           py::arg("publish_seconds") = py::none())
      .def("add_jobs", &PyOrchestrator::AddJobs)
      .def("status", &PyOrchestrator::GetStatus);

  py::class_<PyBatchClient>(m, "BatchClient")
      .def(py::init<const std::string&, const std::string&, uint64_t, double, const std::string&>(),
           py::arg("url"), py::arg("token"), py::arg("max_staleness"), py::arg("deadline"),
           py::arg("ca_file"))
      .def("next_groups", &PyBatchClient::NextGroups)
      .def("acknowledge", &PyBatchClient::Acknowledge)
      .def("staleness", &PyBatchClient::Staleness);
}
