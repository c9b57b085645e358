#include "tests/engines/fake_engine.h"

#include <algorithm>
#include <atomic>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "common/file_util.h"
#include "common/http_server.h"
#include "common/json_fields.h"
#include "common/logging.h"
#include "examples/arithmetic_task.h"
#include "rollout_worker/replica_api.h"
#include "sync/convert.h"
#include "sync/safetensors.h"

namespace weft::fake_engine {
namespace {

namespace bhttp = boost::beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Small helpers.

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// 32 random hex digits, the form of the engines' uuid4().hex request ids.
std::string RandomHex() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          std::hash<std::thread::id>()(std::this_thread::get_id()));
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(32, '0');
  for (char& c : text) c = kDigits[rng() & 15];
  return text;
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

// The seed of one sampling step: a mix of the request's seed and the position in the sequence.
uint64_t StepSeed(uint64_t seed, size_t position) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (position + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string UrlDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() &&
               std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// A query string's parameters (the last of a repeated name wins, as FastAPI reads a scalar).
std::map<std::string, std::string> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    out[UrlDecode(pair.substr(0, eq))] =
        eq == std::string_view::npos ? "" : UrlDecode(pair.substr(eq + 1));
  }
  return out;
}

// A boolean query parameter as FastAPI reads one.
std::optional<bool> QueryBool(const std::string& value) {
  std::string lower;
  for (char c : value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

// The example task's tokenizer: a problem ("12+34=") encodes as the task encodes it; other text
// character by character over the same vocabulary (digits, '+', '=', '$' for the end token, '^'
// for the begin token), after the begin token.
Result<std::vector<int>> Tokenize(const std::string& text) {
  using examples::ArithmeticTask;
  Result<std::vector<int>> problem = ArithmeticTask().Encode(text);
  if (problem.ok()) return problem;
  std::vector<int> ids = {ArithmeticTask::kBegin};
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      ids.push_back(c - '0');
    } else if (c == '+' || c == '=' || c == '$' || c == '^') {
      ids.push_back(c == '+'   ? ArithmeticTask::kPlus
                    : c == '=' ? ArithmeticTask::kEquals
                    : c == '$' ? ArithmeticTask::kEnd
                               : ArithmeticTask::kBegin);
    } else {
      char shown[8];
      std::snprintf(shown, sizeof(shown), c >= 32 && c < 127 ? "'%c'" : "\\x%02x",
                    static_cast<unsigned char>(c));
      return InvalidArgument("the text cannot be tokenized: the character " + std::string(shown) +
                             " at offset " + std::to_string(i) +
                             " is not in the vocabulary (digits, '+', '=', '$', '^')");
    }
  }
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Reading request fields. The messages name the field as the request spells it.

Status CheckKnown(const json& object, const std::set<std::string>& known,
                  const std::string& where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!known.count(it.key()))
      return InvalidArgument("unknown field '" + it.key() + "' in " + where);
  }
  return Status::Ok();
}

bool Has(const json& object, const std::string& key) {
  return object.contains(key) && !object.at(key).is_null();
}

Result<int64_t> GetInt(const json& object, const std::string& key, const std::string& where,
                       int64_t low, int64_t high) {
  const json& v = object.at(key);
  if (!v.is_number_integer())
    return InvalidArgument(where + "." + key + " must be an integer, not " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(high))
    return InvalidArgument(where + "." + key + " must be at most " + std::to_string(high));
  const int64_t value = v.get<int64_t>();
  if (value < low || value > high) {
    return InvalidArgument(where + "." + key + " must be in [" + std::to_string(low) + ", " +
                           std::to_string(high) + "], not " + std::to_string(value));
  }
  return value;
}

Result<uint64_t> GetSeed(const json& object, const std::string& key, const std::string& where) {
  const json& v = object.at(key);
  if (!v.is_number_integer())
    return InvalidArgument(where + "." + key + " must be an integer, not " + v.dump());
  return v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
}

Result<double> GetNumber(const json& object, const std::string& key, const std::string& where) {
  const json& v = object.at(key);
  if (!v.is_number()) return InvalidArgument(where + "." + key + " must be a number");
  return v.get<double>();
}

Result<bool> GetBool(const json& object, const std::string& key, const std::string& where) {
  const json& v = object.at(key);
  if (!v.is_boolean()) return InvalidArgument(where + "." + key + " must be true or false");
  return v.get<bool>();
}

Result<std::string> GetText(const json& object, const std::string& key, const std::string& where) {
  const json& v = object.at(key);
  if (!v.is_string()) return InvalidArgument(where + "." + key + " must be a string");
  return v.get<std::string>();
}

Result<std::vector<int>> GetIds(const json& v, const std::string& what) {
  if (!v.is_array()) return InvalidArgument(what + " must be a list of token ids");
  std::vector<int> ids;
  for (const json& id : v) {
    if (!id.is_number_integer() || (!id.is_number_unsigned() && id.get<int64_t>() < 0) ||
        id.get<uint64_t>() > 1u << 30) {
      return InvalidArgument(what + " holds " + id.dump() + ", not a token id");
    }
    ids.push_back(id.get<int>());
  }
  return ids;
}

// A field of a documented behaviour the server does not implement: accepted only at a value
// that changes nothing.
Status OnlyDefault(const json& object, const std::string& key, const std::string& where,
                   const std::function<bool(const json&)>& is_default) {
  if (object.contains(key) && !object.at(key).is_null() && !is_default(object.at(key))) {
    return InvalidArgument(where + "." + key + " = " + object.at(key).dump() +
                           " is not supported by the test server");
  }
  return Status::Ok();
}
bool IsZero(const json& v) { return v.is_number() && v.get<double>() == 0.0; }
bool IsOne(const json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsEmpty(const json& v) {
  return (v.is_string() || v.is_array() || v.is_object()) && v.empty();
}
bool IsNothing(const json&) { return false; }  // only null (or absent) is accepted

// ---------------------------------------------------------------------------------------------
// Model directories.

Result<int> ConfigInt(const json& config, const std::string& key, int low, int high) {
  if (!config.contains(key)) return InvalidArgument("config.json has no \"" + key + "\"");
  WEFT_ASSIGN_OR_RETURN(int64_t value, GetInt(config, key, "config.json", low, high));
  return static_cast<int>(value);
}

}  // namespace

std::string_view ApiName(Api api) { return api == Api::kSglang ? "sglang" : "vllm"; }

Status WriteModelDirectory(const std::string& dir, const examples::TinyLmConfig& config,
                           std::span<const float> weights, sync::DType dtype) {
  const examples::TinyLmLayout layout(config);
  if (weights.size() != layout.size()) {
    return InvalidArgument("model directory " + dir + ": " + std::to_string(weights.size()) +
                           " weights for a model of " + std::to_string(layout.size()));
  }
  if (dtype != sync::DType::kF32 && dtype != sync::DType::kBF16 && dtype != sync::DType::kF16) {
    return InvalidArgument("model directory " + dir + ": weights are written as BF16, F16 or F32");
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return Unavailable("cannot create " + dir + ": " + error.message());
  const json c = {{"architectures", {kArchitecture}},
                  {"model_type", kModelType},
                  {"vocab_size", config.vocab},
                  {"d_model", config.d_model},
                  {"layers", config.layers},
                  {"heads", config.heads},
                  {"d_ff", config.d_ff},
                  {"max_seq", config.max_seq}};
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(dir + "/config.json", c.dump(2) + "\n"));
  // Narrow formats are held as 16-bit words and handed to the writer as their bytes.
  std::vector<std::vector<uint16_t>> narrow(layout.parameters().size());
  std::vector<sync::TensorToWrite> tensors;
  for (size_t i = 0; i < layout.parameters().size(); ++i) {
    const examples::ParameterInfo& p = layout.parameters()[i];
    const std::span<const float> values = weights.subspan(p.offset, p.size);
    std::span<const uint8_t> bytes;
    if (dtype == sync::DType::kF32) {
      bytes = {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)};
    } else {
      narrow[i].resize(values.size());
      if (dtype == sync::DType::kBF16) {
        sync::ConvertBf16(values, narrow[i]);
      } else {
        sync::ConvertF16(values, narrow[i]);
      }
      bytes = {reinterpret_cast<const uint8_t*>(narrow[i].data()), narrow[i].size() * 2};
    }
    tensors.push_back({p.name, dtype, p.shape, bytes});
  }
  return sync::WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

Result<examples::TinyLmConfig> ReadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  WEFT_ASSIGN_OR_RETURN(
      json config,
      ParseStrict(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                  path));
  auto fail = [&](const Status& status) { return status.WithContext(path); };
  if (!config.is_object()) return fail(InvalidArgument("not a JSON object"));
  if (!config.contains("model_type") || config["model_type"] != kModelType) {
    return fail(InvalidArgument("model_type must be \"" + std::string(kModelType) + "\""));
  }
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      std::find(config["architectures"].begin(), config["architectures"].end(), kArchitecture) ==
          config["architectures"].end()) {
    return fail(InvalidArgument("architectures must name \"" + std::string(kArchitecture) + "\""));
  }
  examples::TinyLmConfig c;
  Result<int> value = ConfigInt(config, "vocab_size", 1, 1 << 16);
  if (!value.ok()) return fail(value.status());
  c.vocab = *value;
  const std::pair<const char*, int*> fields[] = {{"d_model", &c.d_model},
                                                 {"layers", &c.layers},
                                                 {"heads", &c.heads},
                                                 {"d_ff", &c.d_ff},
                                                 {"max_seq", &c.max_seq}};
  for (const auto& field : fields) {
    value = ConfigInt(config, field.first, 1, 1 << 16);
    if (!value.ok()) return fail(value.status());
    *field.second = *value;
  }
  if (c.max_seq < 2) return fail(InvalidArgument("max_seq must be at least 2"));
  if (c.d_model % c.heads != 0) return fail(InvalidArgument("d_model must be a multiple of heads"));
  return c;
}

Result<std::vector<float>> ReadModelWeights(const std::string& dir,
                                            const examples::TinyLmLayout& layout) {
  std::vector<std::string> files;
  std::error_code error;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it->path().extension() == ".safetensors") files.push_back(it->path().string());
  }
  if (error) return NotFound("cannot list the model directory " + dir + ": " + error.message());
  if (files.empty()) return NotFound("the model directory " + dir + " has no *.safetensors file");
  std::sort(files.begin(), files.end());
  std::map<std::string, const examples::ParameterInfo*> parameters;
  for (const examples::ParameterInfo& p : layout.parameters()) parameters[p.name] = &p;
  std::map<std::string, std::string> seen;  // tensor -> the file it came from
  std::vector<float> values(layout.size());
  for (const std::string& file : files) {
    WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile st, sync::SafetensorsFile::Open(file));
    for (const sync::SafetensorsTensor& t : st.tensors()) {
      const auto found = parameters.find(t.name);
      if (found == parameters.end())
        return InvalidArgument(file + ": tensor '" + t.name + "' is not a parameter of the model");
      if (seen.count(t.name)) {
        return InvalidArgument(file + ": tensor '" + t.name + "' appears again (first in " +
                               seen[t.name] + ")");
      }
      seen[t.name] = file;
      const examples::ParameterInfo& p = *found->second;
      if (t.shape != p.shape) {
        return InvalidArgument(file + ": tensor '" + t.name + "' has shape " + ShapeText(t.shape) +
                               ", the model's is " + ShapeText(p.shape));
      }
      if (t.dtype != sync::DType::kBF16 && t.dtype != sync::DType::kF16 &&
          t.dtype != sync::DType::kF32) {
        return InvalidArgument(file + ": tensor '" + t.name + "' is " +
                               std::string(sync::Info(t.dtype).safetensors_name) +
                               ", not BF16, F16 or F32");
      }
      sync::ConvertToFloat(t.dtype, t.data, std::span<float>(values).subspan(p.offset, p.size));
    }
  }
  for (const examples::ParameterInfo& p : layout.parameters()) {
    if (!seen.count(p.name))
      return InvalidArgument("model directory " + dir + ": tensor '" + p.name + "' is missing");
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// The engine.

namespace {

enum class Finish { kRunning, kStop, kLength, kAbort };

// One sequence to generate: what was asked, and what came out.
struct Sample {
  std::string id;  // SGLang meta_info.id, vLLM request_id
  size_t prompt_index = 0;
  std::vector<int> prompt;
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::optional<int> max_tokens;  // nullopt: up to the context
  std::vector<int> stop_ids;
  uint64_t seed = 0;
  int top_n = 0;                 // alternatives reported per token
  int input_logprobs_from = -1;  // SGLang logprob_start_len; -1: none
  int prompt_logprobs = -1;      // vLLM prompt_logprobs: alternatives per position; -1: none

  std::vector<int> tokens;
  std::vector<float> logprobs;
  std::vector<std::string> versions;  // the weight version of each token
  std::vector<std::vector<std::pair<int, float>>> top;
  std::vector<std::optional<float>> input_logprobs;
  // vLLM prompt_logprobs: per prompt position (none for the first) the token there and the best
  // alternatives, as (token id, logprob, rank from 1).
  struct Ranked {
    int id;
    float logprob;
    int rank;
  };
  std::vector<std::vector<Ranked>> prompt_ranked;
  Finish finish = Finish::kRunning;
  int matched = -1;
  // Set by an abort (under Impl::mutex); the sample ends before its next token.
  bool abort_requested = false;
  std::string abort_message;
};

// One generation request: its samples advance together, a token each per step, as a batch does.
struct Job {
  std::vector<Sample> samples;
  uint64_t epoch = 0;  // the engine's life it belongs to
};

// Threads that run requests, joined when done (and all of them at the end).
class ThreadSet {
 public:
  ~ThreadSet() { JoinAll(); }
  void Spawn(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    Reap();
    const uint64_t id = next_++;
    threads_.emplace(id, std::thread([this, id, work = std::move(work)] {
                       work();
                       std::lock_guard<std::mutex> done_lock(mutex_);
                       done_.push_back(id);
                     }));
  }
  void JoinAll() {
    while (true) {
      std::map<uint64_t, std::thread> threads;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        threads.swap(threads_);
        done_.clear();
      }
      if (threads.empty()) return;
      for (auto& entry : threads) entry.second.join();
    }
  }

 private:
  void Reap() {
    for (uint64_t id : done_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      it->second.join();
      threads_.erase(it);
    }
    done_.clear();
  }
  std::mutex mutex_;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> done_;
  uint64_t next_ = 0;
};

// A request the handlers see: the parsed target and the body.
struct Call {
  std::shared_ptr<const http::Request> request;
  std::string method, path;
  std::map<std::string, std::string> query;
  std::string body;
  http::Responder respond;
};

// A fault switch: the next `count` requests (to `path`, when set).
struct Injection {
  int count = 0;
  int status = 503;
  std::string path;
  bool Take(const std::string& request_path) {
    if (count <= 0 || (!path.empty() && path != request_path)) return false;
    --count;
    return true;
  }
};

enum class PauseMode { kAbort, kWait, kFreeze };

}  // namespace

struct FakeEngine::Impl {
  Impl(Api api, FakeEngineOptions options, const examples::TinyLmConfig& config)
      : api(api),
        options(std::move(options)),
        port(this->options.port),
        layout(config),
        launched(Clock::now()) {
    token_delay_ms = static_cast<int>(this->options.token_delay.count());
    report_weight_versions = this->options.report_weight_versions;
    dev_mode = this->options.dev_mode;
  }

  const Api api;
  const FakeEngineOptions options;
  std::atomic<uint16_t> port{0};  // the bound port after the first start, kept by restarts
  const examples::TinyLmLayout layout;
  const Clock::time_point launched;

  // The engine's state.
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::shared_ptr<const std::vector<float>> weights;
  std::string weight_version;
  std::string model_path;
  bool running = false;
  bool paused = false;
  bool frozen = false;
  int updating = 0;   // SGLang loads waiting for in-flight requests: new ones wait
  int computing = 0;  // jobs inside a step
  int held = 0;
  std::set<Job*> jobs;
  uint64_t epoch = 0;  // one per life of the engine (Stop ends one)
  uint64_t stops = 0;  // Stops begun: a load waiting out its delay ends (the process died)
  bool shutting_down = false;
  uint64_t tokens = 0;
  uint64_t loads = 0;
  std::vector<RecordedCall> calls;
  // Test switches (under `mutex`).
  int token_delay_ms = 0;
  int load_delay_ms = 0;
  Injection fail_next, disconnect_next;
  bool healthy = true;
  bool report_weight_versions = false;
  bool dev_mode = true;

  // The listener: started, stopped and restarted under `server_mutex`, never under `mutex`.
  std::mutex server_mutex;
  std::unique_ptr<http::HttpServer> server;
  bool closing = false;
  std::mutex load_mutex;  // one weight load at a time
  ThreadSet threads;

  // ---- life

  Status Listen() {
    http::ServerOptions server_options;
    server_options.address = options.host;
    server_options.port = port.load();
    server_options.threads = 2;
    WEFT_ASSIGN_OR_RETURN(
        server, http::HttpServer::Start(server_options,
                                        [this](http::Request request, http::Responder respond) {
                                          Handle(std::move(request), std::move(respond));
                                        }));
    port = server->port();
    return Status::Ok();
  }

  Status Start() {
    std::lock_guard<std::mutex> server_lock(server_mutex);
    if (closing) return Unavailable("the engine is shutting down");
    if (server) return Status::Ok();
    WEFT_ASSIGN_OR_RETURN(std::vector<float> values, ReadModelWeights(options.model_path, layout));
    {
      std::lock_guard<std::mutex> lock(mutex);
      weights = std::make_shared<const std::vector<float>>(std::move(values));
      weight_version = options.weight_version;
      model_path = options.model_path;
      paused = frozen = false;
      running = true;
    }
    Status listening = Listen();
    if (!listening.ok()) {
      std::lock_guard<std::mutex> lock(mutex);
      running = false;
    }
    return listening;
  }

  void Stop() {
    std::lock_guard<std::mutex> server_lock(server_mutex);
    if (!server) return;
    {
      // A load waiting out its delay holds an I/O thread, which server->Stop() joins: it ends now.
      std::lock_guard<std::mutex> lock(mutex);
      ++stops;
    }
    changed.notify_all();
    // The connections close first, so that no generation ended below gets its answer out.
    server->Stop();
    server.reset();
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++epoch;
      AbortAllLocked("the engine stopped");
      paused = frozen = false;
      running = false;
    }
    changed.notify_all();
  }

  // Every connection closes; the engine itself goes on.
  void RestartListener() {
    std::lock_guard<std::mutex> server_lock(server_mutex);
    if (closing || !server) return;
    server->Stop();
    server.reset();
    Status listening = Listen();
    if (!listening.ok()) {
      WEFT_LOG(kError) << "fake engine: " << listening.message();
    }
  }

  // Stops for good: nothing starts the listener again, every thread ends.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> server_lock(server_mutex);
      closing = true;
    }
    Stop();
    {
      std::lock_guard<std::mutex> lock(mutex);
      shutting_down = true;
    }
    changed.notify_all();
    threads.JoinAll();
  }

  // ---- generation

  void AbortAllLocked(const std::string& message) {
    for (Job* job : jobs) {
      for (Sample& s : job->samples) {
        if (s.finish == Finish::kRunning && !s.abort_requested) {
          s.abort_requested = true;
          s.abort_message = message;
        }
      }
    }
  }
  int AbortByIdLocked(const std::set<std::string>& ids, const std::string& message) {
    int aborted = 0;
    for (Job* job : jobs) {
      for (Sample& s : job->samples) {
        if (s.finish == Finish::kRunning && !s.abort_requested && ids.count(s.id)) {
          s.abort_requested = true;
          s.abort_message = message;
          ++aborted;
        }
      }
    }
    return aborted;
  }

  static bool AbortPending(const Job& job) {
    for (const Sample& s : job.samples) {
      if (s.finish == Finish::kRunning && s.abort_requested) return true;
    }
    return false;
  }
  static bool AnyRunning(const Job& job) {
    for (const Sample& s : job.samples) {
      if (s.finish == Finish::kRunning) return true;
    }
    return false;
  }

  // The log-probabilities of every token after `prefix`, best first (ties: lower id first).
  std::vector<std::pair<int, float>> Alternatives(const std::vector<float>& w,
                                                  const std::vector<int>& prefix) const {
    const examples::Decoder decoder(layout, w);
    std::vector<std::pair<int, float>> all;
    std::vector<int> sequence = prefix;
    sequence.push_back(0);
    for (int v = 0; v < layout.config().vocab; ++v) {
      sequence.back() = v;
      Result<std::vector<float>> scored = decoder.Score(sequence);
      all.emplace_back(v, scored.ok() ? scored->back() : -INFINITY);
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
    return all;
  }

  // Turns every token's log-probability at temperature 1 (`all`) into what the engine reports
  // under options.logprobs_mode at `temperature` (0: greedy, where no temperature applies).
  void Report(std::vector<std::pair<int, float>>& all, float temperature) const {
    if (options.logprobs_mode == "raw_logits") {
      for (auto& entry : all) entry.second += 3.0f;
      return;
    }
    const double t = temperature > 0.0f ? temperature : 1.0;
    double top = -INFINITY;
    for (const auto& entry : all) top = std::max(top, entry.second / t);
    double sum = 0.0;
    for (const auto& entry : all) sum += std::exp(entry.second / t - top);
    const double normaliser = top + std::log(sum);
    for (auto& entry : all) entry.second = static_cast<float>(entry.second / t - normaliser);
  }

  // One token of `s` at weights `w`.
  void Step(Sample& s, const std::vector<float>& w, const std::string& version) const {
    std::vector<int> prefix = s.prompt;
    prefix.insert(prefix.end(), s.tokens.begin(), s.tokens.end());
    examples::Sampling sampling;
    sampling.temperature = s.temperature;
    sampling.top_p = s.top_p;
    sampling.max_tokens = 1;
    sampling.seed = StepSeed(s.seed, prefix.size());
    Result<std::vector<rollout_worker::Completion>> out =
        examples::Decoder(layout, w).Generate({prefix}, sampling, 1);
    if (!out.ok() || out->size() != 1 || out->front().tokens.size() != 1) {
      s.finish = Finish::kAbort;
      s.abort_message = out.ok() ? "the decoder returned no token" : out.status().message();
      return;
    }
    const int token = out->front().tokens[0];
    s.tokens.push_back(token);
    s.versions.push_back(version);
    const bool raw = options.logprobs_mode == "raw_logprobs";
    if (raw) s.logprobs.push_back(out->front().logprobs[0]);
    if (s.top_n > 0 || !raw) {
      std::vector<std::pair<int, float>> all = Alternatives(w, prefix);
      if (!raw) {
        Report(all, s.temperature);
        for (const auto& [id, value] : all) {
          if (id == token) s.logprobs.push_back(value);
        }
      }
      all.resize(std::min<size_t>(all.size(), s.top_n));
      s.top.push_back(std::move(all));
    }
    const int max_seq = layout.config().max_seq;
    if (std::find(s.stop_ids.begin(), s.stop_ids.end(), token) != s.stop_ids.end()) {
      s.finish = Finish::kStop;
      s.matched = token;
    } else if ((s.max_tokens && static_cast<int>(s.tokens.size()) >= *s.max_tokens) ||
               static_cast<int>(prefix.size()) + 1 >= max_seq) {
      s.finish = Finish::kLength;
    }
  }

  // Runs `job` to its end: waits to be admitted (not paused, no load waiting), then a token per
  // running sample per step, pausing between steps while frozen, ending aborted samples there.
  // The job stays in flight until Release().
  void RunJob(Job& job) {
    std::shared_ptr<const std::vector<float>> w0;  // the weights at admission
    for (Sample& s : job.samples) {
      if (s.max_tokens && *s.max_tokens == 0) s.finish = Finish::kLength;
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      job.epoch = epoch;
      ++held;
      changed.wait(
          lock, [&] { return job.epoch != epoch || shutting_down || (!paused && updating == 0); });
      --held;
      if (job.epoch != epoch || shutting_down) {
        for (Sample& s : job.samples) {
          if (s.finish == Finish::kRunning) {
            s.finish = Finish::kAbort;
            s.abort_message = "the engine stopped";
          }
        }
        return;
      }
      jobs.insert(&job);
      w0 = weights;
    }
    for (Sample& s : job.samples) {
      if (s.input_logprobs_from >= 0) InputLogprobs(s, *w0);
      if (s.prompt_logprobs >= 0) PromptLogprobs(s, *w0);
    }
    bool first = true;
    while (true) {
      std::shared_ptr<const std::vector<float>> w;
      std::string version;
      {
        std::unique_lock<std::mutex> lock(mutex);
        auto interrupted = [&] { return AbortPending(job) || job.epoch != epoch || shutting_down; };
        if (!first && token_delay_ms > 0) {
          changed.wait_for(lock, std::chrono::milliseconds(token_delay_ms), interrupted);
        }
        changed.wait(lock, [&] { return !frozen || interrupted(); });
        for (Sample& s : job.samples) {
          if (s.finish != Finish::kRunning) continue;
          if (job.epoch != epoch || shutting_down) {
            s.abort_requested = true;
            s.abort_message = "the engine stopped";
          }
          if (s.abort_requested) s.finish = Finish::kAbort;
        }
        if (!AnyRunning(job)) break;
        w = weights;
        version = weight_version;
        ++computing;
      }
      uint64_t stepped = 0;
      for (Sample& s : job.samples) {
        if (s.finish != Finish::kRunning) continue;
        Step(s, *w, version);
        ++stepped;
      }
      first = false;
      {
        std::lock_guard<std::mutex> lock(mutex);
        --computing;
        tokens += stepped;
      }
      changed.notify_all();
    }
  }

  // The request has its answer: it no longer counts as in flight. (Until then a load that waits
  // for in-flight requests waits for it, so its answer reports the version it ran at.)
  void Release(Job& job) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      jobs.erase(&job);
    }
    changed.notify_all();
  }

  // SGLang input_token_logprobs: from logprob_start_len on; the first position has none.
  void InputLogprobs(Sample& s, const std::vector<float>& w) const {
    Result<std::vector<float>> scored = s.prompt.size() >= 2
                                            ? examples::Decoder(layout, w).Score(s.prompt)
                                            : Result<std::vector<float>>(std::vector<float>());
    for (size_t i = static_cast<size_t>(s.input_logprobs_from); i < s.prompt.size(); ++i) {
      if (i == 0 || !scored.ok()) {
        s.input_logprobs.push_back(std::nullopt);
      } else {
        s.input_logprobs.push_back((*scored)[i - 1]);
      }
    }
  }

  // vLLM prompt_logprobs: at each position after the first, the prompt's token (its logprob at
  // temperature 1, whatever the request's temperature, and its rank) and the best
  // `prompt_logprobs` alternatives.
  void PromptLogprobs(Sample& s, const std::vector<float>& w) const {
    s.prompt_ranked.assign(s.prompt.size(), {});
    for (size_t i = 1; i < s.prompt.size(); ++i) {
      const std::vector<std::pair<int, float>> all =
          Alternatives(w, std::vector<int>(s.prompt.begin(), s.prompt.begin() + i));
      for (size_t r = 0; r < all.size(); ++r) {
        if (all[r].first == s.prompt[i] || r < static_cast<size_t>(s.prompt_logprobs))
          s.prompt_ranked[i].push_back({all[r].first, all[r].second, static_cast<int>(r) + 1});
      }
    }
  }

  // Pauses generation; returns the number of requests left in flight (frozen).
  int Pause(PauseMode mode, const std::string& message) {
    std::unique_lock<std::mutex> lock(mutex);
    paused = true;
    if (mode == PauseMode::kAbort) {
      AbortAllLocked(message);
      changed.notify_all();
      changed.wait(lock, [&] { return jobs.empty() || shutting_down; });
    } else if (mode == PauseMode::kWait) {
      changed.wait(lock, [&] { return jobs.empty() || frozen || shutting_down; });
    } else {
      frozen = true;
      changed.wait(lock, [&] { return computing == 0 || shutting_down; });
    }
    return static_cast<int>(jobs.size());
  }

  void Resume() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      paused = frozen = false;
    }
    changed.notify_all();
  }

  // Reads a model directory against the served layout, after the load delay.
  Result<std::vector<float>> Load(const std::string& path) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // (The delay is read again on every wake: lowering it shortens a load under way.)
      const auto began = std::chrono::steady_clock::now();
      const uint64_t stops_then = stops;
      changed.wait_until(lock, began + std::chrono::milliseconds(load_delay_ms), [&] {
        return shutting_down || stops != stops_then ||
               std::chrono::steady_clock::now() >= began + std::chrono::milliseconds(load_delay_ms);
      });
      if (shutting_down || stops != stops_then)
        return Unavailable("the engine stopped during the load");
    }
    return ReadModelWeights(path, layout);
  }

  // Makes loaded weights current, unless the engine died since the load began (`life`, the
  // epoch then): a restarted engine serves its launch weights.
  void Install(std::vector<float> values, const std::string& path,
               const std::optional<std::string>& version, uint64_t life) {
    std::lock_guard<std::mutex> lock(mutex);
    if (life != epoch) return;
    weights = std::make_shared<const std::vector<float>>(std::move(values));
    model_path = path;
    if (version) weight_version = *version;
    ++loads;
  }

  // ---- HTTP

  void Handle(http::Request request, http::Responder respond) {
    auto call = std::make_shared<Call>();
    call->request = std::make_shared<const http::Request>(std::move(request));
    const std::string_view target(call->request->target().data(), call->request->target().size());
    const size_t question = target.find('?');
    call->path = std::string(target.substr(0, question));
    if (question != std::string_view::npos) call->query = ParseQuery(target.substr(question + 1));
    call->method = std::string(call->request->method_string());
    call->body.assign(call->request->body().begin(), call->request->body().end());
    call->respond = std::move(respond);
    if (call->path.starts_with("/_test/")) {
      threads.Spawn([this, call] { HandleTest(*call); });
      return;
    }
    bool disconnect = false;
    std::optional<int> failure;
    {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back({call->method, std::string(target), call->body, Clock::now()});
      if (disconnect_next.Take(call->path)) {
        disconnect = true;
      } else if (fail_next.Take(call->path)) {
        failure = fail_next.status;
      }
    }
    if (disconnect) {
      // The responder is dropped unanswered; the restart closes the connection.
      threads.Spawn([this] { RestartListener(); });
      return;
    }
    if (failure) {
      ApiError(*call, static_cast<bhttp::status>(*failure), "injected failure (test server)");
      return;
    }
    threads.Spawn([this, call] { Route(*call); });
  }

  // ---- answers

  void Reply(Call& c, bhttp::status status, const json& body) {
    c.respond(http::JsonResponse(*c.request, status, body));
  }
  void ReplyEmpty(Call& c, bhttp::status status) {
    http::Response response(status, c.request->version());
    response.prepare_payload();
    c.respond(std::move(response));
  }
  void ReplyText(Call& c, bhttp::status status, const std::string& text) {
    http::Response response(status, c.request->version());
    response.set(bhttp::field::content_type, "text/plain; charset=utf-8");
    response.body().assign(text.begin(), text.end());
    response.prepare_payload();
    c.respond(std::move(response));
  }
  // The engine's error body: SGLang {"error": {"message"}}, vLLM's OpenAI error.
  void ApiError(Call& c, bhttp::status status, const std::string& message) {
    if (api == Api::kSglang) {
      Reply(c, status, {{"error", {{"message", message}}}});
      return;
    }
    const unsigned code = static_cast<unsigned>(status);
    std::string type = code == 400   ? "BadRequestError"
                       : code == 404 ? "NotFoundError"
                       : code == 401 ? "AuthenticationError"
                       : code >= 500 ? "InternalServerError"
                                     : std::string(bhttp::obsolete_reason(status));
    Reply(c, status,
          {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}});
  }
  void NotFoundRoute(Call& c) { Reply(c, bhttp::status::not_found, {{"detail", "Not Found"}}); }
  void WrongMethod(Call& c) {
    Reply(c, bhttp::status::method_not_allowed, {{"detail", "Method Not Allowed"}});
  }

  // The body as a JSON object; an absent body reads as {} when `empty_ok`.
  Result<json> Body(const Call& c, bool empty_ok) {
    if (c.body.find_first_not_of(" \t\r\n") == std::string::npos) {
      if (empty_ok) return json::object();
      return InvalidArgument("the request has no JSON body");
    }
    WEFT_ASSIGN_OR_RETURN(json body, ParseStrict(c.body, "the request body"));
    if (!body.is_object()) return InvalidArgument("the request body must be a JSON object");
    return body;
  }

  bool Authorized(const Call& c) const {
    if (options.api_key.empty()) return true;
    if (http::BearerMatches(*c.request, options.api_key)) return true;
    if (api == Api::kSglang) {
      const auto key = (*c.request)["x-api-key"];
      return http::TokenDigest(options.api_key)
          .Matches(http::TokenDigest(std::string_view(key.data(), key.size())));
    }
    return false;
  }

  void Route(Call& c) {
    if (!c.path.starts_with("/health") && !Authorized(c)) {
      Reply(c, bhttp::status::unauthorized, {{"error", "Unauthorized"}});
      return;
    }
    if (api == Api::kSglang) {
      RouteSglang(c);
    } else {
      RouteVllm(c);
    }
  }

  // Calls `handler` when the method is one of `methods`, else answers 405.
  template <typename Handler>
  void On(Call& c, std::initializer_list<std::string_view> methods, Handler handler) {
    for (std::string_view m : methods) {
      if (c.method == m) {
        handler();
        return;
      }
    }
    WrongMethod(c);
  }

  void Health(Call& c, bool generation) {
    bool ok;
    {
      std::lock_guard<std::mutex> lock(mutex);
      // A generation-based check cannot finish while generation is paused.
      ok = healthy && !(generation && paused);
    }
    ReplyEmpty(c, ok ? bhttp::status::ok : bhttp::status::service_unavailable);
  }

  // ---- SGLang

  void RouteSglang(Call& c) {
    const std::string& p = c.path;
    if (p == "/generate") return On(c, {"POST", "PUT"}, [&] { SglangGenerate(c); });
    if (p == "/update_weights_from_disk") return On(c, {"POST"}, [&] { SglangUpdate(c); });
    if (p == "/pause_generation") return On(c, {"POST"}, [&] { SglangPause(c); });
    if (p == "/continue_generation") return On(c, {"POST"}, [&] { SglangContinue(c); });
    if (p == "/update_weight_version") return On(c, {"POST"}, [&] { SglangSetVersion(c); });
    if (p == "/abort_request") return On(c, {"POST"}, [&] { SglangAbort(c); });
    if (p == "/flush_cache") return On(c, {"GET", "POST"}, [&] { SglangFlush(c); });
    if (p == "/model_info" || p == "/get_model_info")
      return On(c, {"GET"}, [&] { SglangModelInfo(c); });
    if (p == "/server_info" || p == "/get_server_info")
      return On(c, {"GET"}, [&] { SglangServerInfo(c); });
    if (p == "/health") return On(c, {"GET"}, [&] { Health(c, false); });
    if (p == "/health_generate") return On(c, {"GET"}, [&] { Health(c, true); });
    if (p == "/v1/models") return On(c, {"GET"}, [&] { Models(c); });
    NotFoundRoute(c);
  }

  // The fields of a /generate request, besides the prompt: per batch item.
  struct SglangItem {
    bool return_logprob = false;
    int logprob_start_len = -1;
    int top_logprobs_num = 0;
    bool no_stop_trim = false;
  };

  Status ParseSglangSampling(const json& p, Sample* s, int* n, bool* no_stop_trim) {
    const std::string where = "sampling_params";
    if (!p.is_object()) return InvalidArgument("sampling_params must be an object");
    static const std::set<std::string> kKnown = {"max_new_tokens",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "min_p",
                                                 "stop",
                                                 "stop_token_ids",
                                                 "stop_regex",
                                                 "frequency_penalty",
                                                 "presence_penalty",
                                                 "repetition_penalty",
                                                 "min_new_tokens",
                                                 "n",
                                                 "json_schema",
                                                 "regex",
                                                 "ebnf",
                                                 "structural_tag",
                                                 "ignore_eos",
                                                 "skip_special_tokens",
                                                 "spaces_between_special_tokens",
                                                 "no_stop_trim",
                                                 "stream_interval",
                                                 "logit_bias",
                                                 "sampling_seed",
                                                 "custom_params",
                                                 "beam_width"};
    for (auto it = p.begin(); it != p.end(); ++it) {
      // As SamplingParams(**kwargs) raises on an unknown keyword.
      if (!kKnown.count(it.key())) {
        return InvalidArgument("SamplingParams.__init__() got an unexpected keyword argument '" +
                               it.key() + "'");
      }
    }
    s->max_tokens = 128;
    if (p.contains("max_new_tokens")) {
      if (p["max_new_tokens"].is_null()) {
        s->max_tokens.reset();
      } else {
        WEFT_ASSIGN_OR_RETURN(int64_t v, GetInt(p, "max_new_tokens", where, 0, 1 << 30));
        s->max_tokens = static_cast<int>(v);
      }
    }
    if (Has(p, "temperature")) {
      WEFT_ASSIGN_OR_RETURN(double v, GetNumber(p, "temperature", where));
      if (v < 0)
        return InvalidArgument("temperature must be non-negative, got " + p["temperature"].dump());
      // SGLang samples greedily below this temperature.
      s->temperature = v < 1e-6 ? 0.0f : static_cast<float>(v);
    }
    if (Has(p, "top_p")) {
      WEFT_ASSIGN_OR_RETURN(double v, GetNumber(p, "top_p", where));
      if (!(v > 0 && v <= 1))
        return InvalidArgument("top_p must be in (0, 1], got " + p["top_p"].dump());
      s->top_p = static_cast<float>(v);
    }
    if (Has(p, "top_k")) {
      WEFT_ASSIGN_OR_RETURN(int64_t k, GetInt(p, "top_k", where, -1, 1 << 30));
      if (k == 0) return InvalidArgument("top_k must be -1 (disable), or at least 1, got 0");
      if (k != -1 && k < layout.config().vocab) {
        return InvalidArgument("sampling_params.top_k = " + std::to_string(k) +
                               " is not supported by the test server (only -1 or at least the "
                               "vocabulary, " +
                               std::to_string(layout.config().vocab) + ")");
      }
    }
    if (Has(p, "stop_token_ids")) {
      WEFT_ASSIGN_OR_RETURN(s->stop_ids,
                            GetIds(p["stop_token_ids"], "sampling_params.stop_token_ids"));
    }
    // SGLang reads the seed only under deterministic inference, and keeps it in an int32 tensor.
    if (Has(p, "sampling_seed") && options.deterministic_inference) {
      WEFT_ASSIGN_OR_RETURN(s->seed, GetSeed(p, "sampling_seed", where));
      if (s->seed > 0x7fffffffull)
        return Internal("value cannot be converted to type int32_t without overflow");
    } else {
      s->seed = RandomSeed();
    }
    if (Has(p, "n")) {
      WEFT_ASSIGN_OR_RETURN(int64_t v, GetInt(p, "n", where, 1, 1024));
      *n = static_cast<int>(v);
    }
    for (const char* key :
         {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}) {
      if (Has(p, key)) WEFT_RETURN_IF_ERROR(GetBool(p, key, where).status());
    }
    if (Has(p, "no_stop_trim")) *no_stop_trim = p["no_stop_trim"].get<bool>();
    if (Has(p, "stream_interval"))
      WEFT_RETURN_IF_ERROR(GetInt(p, "stream_interval", where, 1, 1 << 30).status());
    for (const char* key : {"min_p", "frequency_penalty", "presence_penalty", "min_new_tokens"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(p, key, where, IsZero));
    WEFT_RETURN_IF_ERROR(OnlyDefault(p, "repetition_penalty", where, IsOne));
    for (const char* key : {"stop", "stop_regex", "logit_bias"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(p, key, where, IsEmpty));
    for (const char* key : {"json_schema", "regex", "ebnf", "structural_tag", "custom_params"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(p, key, where, IsNothing));
    WEFT_RETURN_IF_ERROR(OnlyDefault(p, "beam_width", where, [](const json& v) {
      return v.is_number_integer() && v.get<int64_t>() <= 1;
    }));
    return Status::Ok();
  }

  // A prompt the model can continue: 1 to max_seq - 1 ids inside the vocabulary.
  Status CheckPrompt(const std::vector<int>& prompt) const {
    const examples::TinyLmConfig& config = layout.config();
    if (prompt.empty()) return InvalidArgument("the prompt has no tokens");
    if (static_cast<int>(prompt.size()) >= config.max_seq) {
      return InvalidArgument(
          api == Api::kSglang
              ? "The input (" + std::to_string(prompt.size()) +
                    " tokens) is longer than the model's context length (" +
                    std::to_string(config.max_seq) + " tokens)."
              : "This model's maximum context length is " + std::to_string(config.max_seq) +
                    " tokens. However, your request has " + std::to_string(prompt.size()) +
                    " input tokens. Please reduce the length of the input.");
    }
    for (int id : prompt) {
      if (id >= config.vocab) {
        return InvalidArgument("Token id " + std::to_string(id) + " is out of vocabulary (size " +
                               std::to_string(config.vocab) + ")");
      }
    }
    return Status::Ok();
  }

  // A list field of /generate that may be one value for every item or one per item.
  static Result<json> PerItem(const json& body, const std::string& key, size_t items, size_t i,
                              const json& fallback) {
    if (!Has(body, key)) return fallback;
    const json& v = body.at(key);
    if (!v.is_array()) return v;
    if (v.size() != items) {
      return InvalidArgument(key + " has " + std::to_string(v.size()) + " entries for " +
                             std::to_string(items) + " prompts");
    }
    return v[i];
  }

  void SglangGenerate(Call& c) {
    Result<json> body = Body(c, false);
    if (!body.ok()) return ApiError(c, bhttp::status::bad_request, body.status().message());
    Status parsed = ParseSglangGenerate(c, *body);
    if (!parsed.ok()) return ApiError(c, bhttp::status::bad_request, parsed.message());
  }

  Status ParseSglangGenerate(Call& c, const json& body) {
    static const std::set<std::string> kKnown = {"text",
                                                 "input_ids",
                                                 "input_embeds",
                                                 "image_data",
                                                 "video_data",
                                                 "audio_data",
                                                 "sampling_params",
                                                 "rid",
                                                 "return_logprob",
                                                 "logprob_start_len",
                                                 "top_logprobs_num",
                                                 "token_ids_logprob",
                                                 "return_text_in_logprobs",
                                                 "stream",
                                                 "log_metrics",
                                                 "return_hidden_states",
                                                 "modalities",
                                                 "session_params",
                                                 "lora_path",
                                                 "lora_id",
                                                 "custom_logit_processor",
                                                 "bootstrap_host",
                                                 "bootstrap_port",
                                                 "bootstrap_room",
                                                 "bootstrap_pair_key",
                                                 "data_parallel_rank",
                                                 "routed_dp_rank",
                                                 "background",
                                                 "priority",
                                                 "extra_key",
                                                 "cache_salt",
                                                 "no_logs",
                                                 "custom_labels",
                                                 "return_bytes",
                                                 "return_entropy",
                                                 "return_prompt_token_ids",
                                                 "return_routed_experts",
                                                 "return_sampling_mask",
                                                 "conversation_id"};
    WEFT_RETURN_IF_ERROR(CheckKnown(body, kKnown, "the /generate request"));
    const std::string where = "the /generate request";
    for (const char* key :
         {"input_embeds", "image_data", "video_data", "audio_data", "token_ids_logprob",
          "session_params", "lora_path", "lora_id", "custom_logit_processor", "bootstrap_host",
          "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "modalities"}) {
      WEFT_RETURN_IF_ERROR(OnlyDefault(body, key, where, IsNothing));
    }
    for (const char* key : {"return_hidden_states", "return_routed_experts", "return_sampling_mask",
                            "return_entropy", "return_bytes", "background"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(body, key, where, IsFalse));
    if (Has(body, "stream")) {
      WEFT_ASSIGN_OR_RETURN(bool stream, GetBool(body, "stream", where));
      if (stream) return InvalidArgument("streaming is not supported by the test server");
    }
    // The prompts.
    if (Has(body, "text") == Has(body, "input_ids"))
      return InvalidArgument("Either text, input_ids or input_embeds should be provided.");
    std::vector<std::vector<int>> prompts;
    bool batch = false;
    if (Has(body, "text")) {
      const json& text = body["text"];
      std::vector<std::string> texts;
      if (text.is_string()) {
        texts.push_back(text.get<std::string>());
      } else if (text.is_array() && !text.empty()) {
        batch = true;
        for (const json& t : text) {
          if (!t.is_string()) return InvalidArgument("text must be a string or a list of strings");
          texts.push_back(t.get<std::string>());
        }
      } else {
        return InvalidArgument("text must be a string or a non-empty list of strings");
      }
      for (const std::string& t : texts) {
        WEFT_ASSIGN_OR_RETURN(std::vector<int> ids, Tokenize(t));
        prompts.push_back(std::move(ids));
      }
    } else {
      const json& ids = body["input_ids"];
      if (!ids.is_array()) return InvalidArgument("input_ids must be a list");
      if (ids.empty()) return InvalidArgument("input_ids cannot be empty");
      if (ids[0].is_array()) {
        batch = true;
        for (const json& one : ids) {
          WEFT_ASSIGN_OR_RETURN(std::vector<int> prompt, GetIds(one, "input_ids"));
          if (prompt.empty()) return InvalidArgument("input_ids cannot be empty");
          prompts.push_back(std::move(prompt));
        }
      } else {
        WEFT_ASSIGN_OR_RETURN(std::vector<int> prompt, GetIds(ids, "input_ids"));
        prompts.push_back(std::move(prompt));
      }
    }
    for (const std::vector<int>& prompt : prompts) WEFT_RETURN_IF_ERROR(CheckPrompt(prompt));
    const size_t items = prompts.size();
    // The sampling parameters: one object for all, or one per prompt; n equal across them.
    if (Has(body, "sampling_params") && body["sampling_params"].is_array() &&
        body["sampling_params"].size() != items) {
      return InvalidArgument("sampling_params has " +
                             std::to_string(body["sampling_params"].size()) + " entries for " +
                             std::to_string(items) + " prompts");
    }
    if (!batch && Has(body, "sampling_params") && body["sampling_params"].is_array())
      return InvalidArgument("sampling_params must be an object for a single prompt");
    // Request ids.
    std::vector<std::string> rids(items);
    if (Has(body, "rid")) {
      const json& rid = body["rid"];
      if (rid.is_string()) {
        for (size_t i = 0; i < items; ++i)
          rids[i] =
              batch ? rid.get<std::string>() + "_" + std::to_string(i) : rid.get<std::string>();
      } else if (rid.is_array() && batch && rid.size() == items) {
        for (size_t i = 0; i < items; ++i) {
          if (!rid[i].is_string()) return InvalidArgument("rid must hold strings");
          rids[i] = rid[i].get<std::string>();
        }
      } else {
        return InvalidArgument(batch ? "rid must be a string or one string per prompt"
                                     : "rid must be a string for a single prompt");
      }
      if (std::set<std::string>(rids.begin(), rids.end()).size() != rids.size())
        return InvalidArgument("Duplicate request IDs detected within the request");
    } else {
      for (std::string& r : rids) r = RandomHex();
    }
    bool text_in_logprobs = false;
    if (Has(body, "return_text_in_logprobs")) {
      WEFT_ASSIGN_OR_RETURN(text_in_logprobs, GetBool(body, "return_text_in_logprobs", where));
    }
    bool return_prompt_ids = false;
    if (Has(body, "return_prompt_token_ids")) {
      WEFT_ASSIGN_OR_RETURN(return_prompt_ids, GetBool(body, "return_prompt_token_ids", where));
    }

    Job job;
    std::vector<SglangItem> outputs;
    int n_all = -1;
    for (size_t i = 0; i < items; ++i) {
      Sample base;
      base.prompt = prompts[i];
      base.prompt_index = i;
      int n = 1;
      SglangItem item;
      WEFT_ASSIGN_OR_RETURN(json params,
                            PerItem(body, "sampling_params", items, i, json::object()));
      if (params.is_null()) params = json::object();
      WEFT_RETURN_IF_ERROR(ParseSglangSampling(params, &base, &n, &item.no_stop_trim));
      WEFT_RETURN_IF_ERROR(CheckContext(base.prompt, base.max_tokens));
      if (n_all != -1 && n != n_all)
        return InvalidArgument("The n parameter must be the same for all requests in a batch");
      n_all = n;
      WEFT_ASSIGN_OR_RETURN(json lp, PerItem(body, "return_logprob", items, i, false));
      if (!lp.is_boolean()) return InvalidArgument("return_logprob must be true or false");
      item.return_logprob = lp.get<bool>();
      WEFT_ASSIGN_OR_RETURN(json start, PerItem(body, "logprob_start_len", items, i, -1));
      if (!start.is_number_integer() || start.get<int64_t>() < -1 ||
          start.get<int64_t>() >= static_cast<int64_t>(base.prompt.size())) {
        return InvalidArgument("logprob_start_len must be -1 or a position of the prompt, not " +
                               start.dump());
      }
      item.logprob_start_len = start.get<int>();
      WEFT_ASSIGN_OR_RETURN(json top, PerItem(body, "top_logprobs_num", items, i, 0));
      if (!top.is_number_integer() || top.get<int64_t>() < 0 ||
          top.get<int64_t>() > layout.config().vocab) {
        return InvalidArgument("top_logprobs_num must be an integer from 0 to the vocabulary");
      }
      item.top_logprobs_num = top.get<int>();
      if (item.return_logprob) {
        base.top_n = item.top_logprobs_num;
        base.input_logprobs_from = item.logprob_start_len;
      }
      for (int k = 0; k < n; ++k) {
        Sample s = base;
        // n > 1 makes every sample a request of its own, with a fresh id.
        s.id = n > 1 ? RandomHex() : rids[i];
        job.samples.push_back(std::move(s));
        outputs.push_back(item);
      }
    }
    const bool as_list = batch || n_all > 1;
    const Clock::time_point started = Clock::now();
    RunJob(job);
    const double latency = std::chrono::duration<double>(Clock::now() - started).count();

    std::string version;
    bool spans;
    {
      std::lock_guard<std::mutex> lock(mutex);
      version = weight_version;
      spans = report_weight_versions;
    }
    json answer = json::array();
    for (size_t i = 0; i < job.samples.size(); ++i) {
      answer.push_back(SglangOutput(job.samples[i], outputs[i], version, spans, text_in_logprobs,
                                    return_prompt_ids, latency));
    }
    Release(job);
    Reply(c, bhttp::status::ok, as_list ? answer : answer[0]);
    return Status::Ok();
  }

  static json TokenText(int id, bool with_text) {
    return with_text ? json(examples::ArithmeticTask::Decode({id})) : json(nullptr);
  }

  json SglangOutput(const Sample& s, const SglangItem& item, const std::string& version, bool spans,
                    bool text_in_logprobs, bool return_prompt_ids, double latency) const {
    std::vector<int> shown = s.tokens;
    // The text leaves out the stop token it matched, unless asked to keep it.
    if (s.finish == Finish::kStop && !item.no_stop_trim && !shown.empty()) shown.pop_back();
    json finish;
    if (s.finish == Finish::kStop) {
      finish = {{"type", "stop"}, {"matched", s.matched}};
    } else if (s.finish == Finish::kLength) {
      finish = {{"type", "length"}, {"length", s.tokens.size()}};
    } else {
      finish = {{"type", "abort"},
                {"message", s.abort_message},
                {"status_code", nullptr},
                {"err_type", nullptr}};
    }
    json meta = {{"id", s.id},
                 {"finish_reason", finish},
                 {"prompt_tokens", s.prompt.size()},
                 {"completion_tokens", s.tokens.size()},
                 {"cached_tokens", 0},
                 {"weight_version", version},
                 {"e2e_latency", latency}};
    if (item.return_logprob) {
      json out = json::array();
      for (size_t t = 0; t < s.tokens.size(); ++t) {
        out.push_back({static_cast<double>(s.logprobs[t]), s.tokens[t],
                       TokenText(s.tokens[t], text_in_logprobs)});
      }
      meta["output_token_logprobs"] = out;
      if (item.logprob_start_len >= 0) {
        json in = json::array();
        for (size_t t = 0; t < s.input_logprobs.size(); ++t) {
          const int id = s.prompt[item.logprob_start_len + t];
          in.push_back({s.input_logprobs[t] ? json(static_cast<double>(*s.input_logprobs[t]))
                                            : json(nullptr),
                        id, TokenText(id, text_in_logprobs)});
        }
        meta["input_token_logprobs"] = in;
      }
      if (item.top_logprobs_num > 0) {
        json top = json::array();
        for (const auto& position : s.top) {
          json entries = json::array();
          for (const auto& alternative : position) {
            entries.push_back({static_cast<double>(alternative.second), alternative.first,
                               TokenText(alternative.first, text_in_logprobs)});
          }
          top.push_back(entries);
        }
        meta["output_top_logprobs"] = top;
      }
    }
    if (spans) {
      json list = json::array();
      for (size_t t = 0; t < s.versions.size(); ++t) {
        if (t == 0 || s.versions[t] != s.versions[t - 1]) {
          list.push_back({{"version", s.versions[t]}, {"start", t}, {"end", t + 1}});
        } else {
          list.back()["end"] = t + 1;
        }
      }
      meta["weight_versions"] = list;
    }
    json output = {{"text", examples::ArithmeticTask::Decode(shown)},
                   {"output_ids", s.tokens},
                   {"meta_info", meta}};
    if (return_prompt_ids) output["prompt_token_ids"] = s.prompt;
    return output;
  }

  void SglangUpdate(Call& c) {
    auto failed = [&](const std::string& message, int paused_requests) {
      Reply(c, bhttp::status::bad_request,
            {{"success", false}, {"message", message}, {"num_paused_requests", paused_requests}});
    };
    Result<json> parsed = Body(c, false);
    if (!parsed.ok()) return ApiError(c, bhttp::status::bad_request, parsed.status().message());
    const json& body = *parsed;
    const std::string where = "the /update_weights_from_disk request";
    static const std::set<std::string> kKnown = {
        "model_path",        "load_format", "abort_all_requests",   "weight_version", "is_async",
        "torch_empty_cache", "keep_pause",  "recapture_cuda_graph", "token_step",     "flush_cache",
        "manifest"};
    Status checked = CheckKnown(body, kKnown, where);
    if (checked.ok() && !Has(body, "model_path"))
      checked = InvalidArgument("model_path is required");
    Result<std::string> path =
        checked.ok() ? GetText(body, "model_path", where) : Result<std::string>(checked);
    if (!path.ok()) return ApiError(c, bhttp::status::bad_request, path.status().message());
    bool abort_all = false;
    std::optional<std::string> version;
    Status fields = Status::Ok();
    for (const char* key : {"is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph",
                            "flush_cache", "abort_all_requests"}) {
      if (fields.ok() && Has(body, key)) fields = GetBool(body, key, where).status();
    }
    if (fields.ok() && Has(body, "abort_all_requests"))
      abort_all = body["abort_all_requests"].get<bool>();
    if (fields.ok() && Has(body, "token_step"))
      fields = GetInt(body, "token_step", where, 0, 1 << 30).status();
    if (fields.ok() && Has(body, "weight_version")) {
      Result<std::string> v = GetText(body, "weight_version", where);
      if (v.ok()) version = *v;
      fields = v.status();
    }
    if (fields.ok()) fields = OnlyDefault(body, "manifest", where, IsNothing);
    if (fields.ok() && Has(body, "load_format")) {
      Result<std::string> format = GetText(body, "load_format", where);
      fields = format.status();
      if (fields.ok() && *format != "auto" && *format != "safetensors")
        fields =
            InvalidArgument("load_format '" + *format + "' is not supported by the test server");
    }
    if (!fields.ok()) return ApiError(c, bhttp::status::bad_request, fields.message());

    std::lock_guard<std::mutex> one_load(load_mutex);
    bool gated = false;
    int paused_requests = 0;
    uint64_t life;
    {
      std::unique_lock<std::mutex> lock(mutex);
      life = epoch;
      if (abort_all) AbortAllLocked("Abort all requests for weight update");
      changed.notify_all();
      if (!paused) {
        // As SGLang's model update lock: wait for every in-flight request, hold new ones.
        ++updating;
        gated = true;
        changed.wait(lock, [&] { return jobs.empty() || shutting_down; });
      } else if (!options.pause_aware_disk_load && !jobs.empty()) {
        // As released SGLang: the requests kept across the pause hold the model-update lock the
        // disk load takes, so it waits for them to end, which they do only after a resume.
        paused_requests = static_cast<int>(jobs.size());
        ++updating;
        gated = true;
        changed.wait(lock, [&] { return jobs.empty() || shutting_down; });
      } else {
        paused_requests = static_cast<int>(jobs.size());
      }
    }
    Result<std::vector<float>> loaded = Load(*path);
    if (loaded.ok()) Install(std::move(*loaded), *path, version, life);
    if (gated) {
      std::lock_guard<std::mutex> lock(mutex);
      --updating;
    }
    changed.notify_all();
    if (!loaded.ok()) {
      return failed("Failed to update weights: " + loaded.status().message() +
                        ".\nRolling back to original weights.",
                    paused_requests);
    }
    std::string message = "Succeeded to update model weights.";
    if (version) message += " Weight version updated to " + *version + ".";
    Reply(c, bhttp::status::ok,
          {{"success", true}, {"message", message}, {"num_paused_requests", paused_requests}});
  }

  void SglangPause(Call& c) {
    Result<json> body = Body(c, true);
    Status checked =
        body.ok() ? CheckKnown(*body, {"mode"}, "the /pause_generation request") : body.status();
    PauseMode mode = PauseMode::kAbort;
    if (checked.ok() && Has(*body, "mode")) {
      const json& m = (*body)["mode"];
      if (m == "abort") {
        mode = PauseMode::kAbort;
      } else if (m == "retract" || m == "in_place") {
        mode = PauseMode::kFreeze;
      } else {
        checked =
            InvalidArgument("mode must be \"abort\", \"retract\" or \"in_place\", not " + m.dump());
      }
    }
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    Pause(mode, "Abort by pause_generation");
    Reply(c, bhttp::status::ok, {{"message", "Generation paused successfully."}, {"status", "ok"}});
  }

  void SglangContinue(Call& c) {
    Result<json> body = Body(c, true);
    Status checked =
        body.ok() ? CheckKnown(*body, {"torch_empty_cache"}, "the /continue_generation request")
                  : body.status();
    if (checked.ok() && Has(*body, "torch_empty_cache"))
      checked = GetBool(*body, "torch_empty_cache", "the /continue_generation request").status();
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    Resume();
    Reply(c, bhttp::status::ok,
          {{"message", "Generation continued successfully."}, {"status", "ok"}});
  }

  void SglangSetVersion(Call& c) {
    const std::string where = "the /update_weight_version request";
    Result<json> body = Body(c, false);
    Status checked =
        body.ok() ? CheckKnown(*body, {"new_version", "abort_all_requests"}, where) : body.status();
    if (checked.ok() && !Has(*body, "new_version"))
      checked = InvalidArgument("new_version is required");
    Result<std::string> version =
        checked.ok() ? GetText(*body, "new_version", where) : Result<std::string>(checked);
    bool abort_all = true;  // SGLang's default
    if (version.ok() && Has(*body, "abort_all_requests")) {
      Result<bool> v = GetBool(*body, "abort_all_requests", where);
      if (!v.ok()) version = v.status();
      if (v.ok()) abort_all = *v;
    }
    if (!version.ok()) return ApiError(c, bhttp::status::bad_request, version.status().message());
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (abort_all) AbortAllLocked("Abort all requests for weight version update");
      weight_version = *version;
    }
    changed.notify_all();
    Reply(c, bhttp::status::ok,
          {{"success", true},
           {"message", "Weight version updated to " + *version + "."},
           {"new_version", *version}});
  }

  void SglangAbort(Call& c) {
    const std::string where = "the /abort_request request";
    Result<json> body = Body(c, true);
    Status checked =
        body.ok() ? CheckKnown(*body, {"rid", "abort_all", "abort_message"}, where) : body.status();
    std::string rid;
    bool all = false;
    if (checked.ok() && Has(*body, "rid")) {
      Result<std::string> v = GetText(*body, "rid", where);
      checked = v.status();
      if (v.ok()) rid = *v;
    }
    if (checked.ok() && Has(*body, "abort_all")) {
      Result<bool> v = GetBool(*body, "abort_all", where);
      checked = v.status();
      if (v.ok()) all = *v;
    }
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (all) {
        AbortAllLocked("Abort by /abort_request");
      } else {
        AbortByIdLocked({rid}, "Abort by /abort_request");
      }
    }
    changed.notify_all();
    ReplyEmpty(c, bhttp::status::ok);
  }

  void SglangFlush(Call& c) {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mutex);
      busy = !jobs.empty() || held > 0;
    }
    if (busy) {
      ReplyText(c, bhttp::status::bad_request,
                "Cache not flushed: there are running or waiting requests.");
    } else {
      ReplyText(c, bhttp::status::ok,
                "Cache flushed.\nPlease check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n");
    }
  }

  // The release this engine says it is.
  std::string EngineVersion() const {
    if (!options.engine_version.empty()) return options.engine_version;
    return api == Api::kSglang ? "0.5.6" : "0.16.0";
  }

  // The server's arguments and version, as SGLang's /server_info gives them (the fields weft
  // reads, and a few besides).
  void SglangServerInfo(Call& c) {
    Reply(c, bhttp::status::ok,
          {{"model_path", options.model_path},
           {"enable_deterministic_inference", options.deterministic_inference},
           {"random_seed", 42},
           {"context_length", nullptr},
           {"version", EngineVersion()}});
  }

  // The request fits the context: SGLang refuses prompt + limit reaching it, vLLM passing it.
  Status CheckContext(const std::vector<int>& prompt, const std::optional<int>& max_tokens) const {
    if (!options.refuse_past_context || !max_tokens) return Status::Ok();
    const int64_t context = layout.config().max_seq;
    const int64_t total = static_cast<int64_t>(prompt.size()) + *max_tokens;
    if (api == Api::kSglang && total >= context) {
      return InvalidArgument(
          "Requested token count exceeds the model's maximum context length of " +
          std::to_string(context) + " tokens. You requested a total of " + std::to_string(total) +
          " tokens: " + std::to_string(prompt.size()) + " tokens from the input messages and " +
          std::to_string(*max_tokens) +
          " tokens for the completion. Please reduce the number of tokens in "
          "the input messages or the completion to fit within the limit.");
    }
    if (api == Api::kVllm && total > context) {
      return InvalidArgument(
          "'max_tokens' or 'max_completion_tokens' is too large: " + std::to_string(*max_tokens) +
          ". This model's maximum context length is " + std::to_string(context) +
          " tokens and your request has " + std::to_string(prompt.size()) + " input tokens (" +
          std::to_string(*max_tokens) + " > " + std::to_string(context) + " - " +
          std::to_string(prompt.size()) + ").");
    }
    return Status::Ok();
  }

  void SglangModelInfo(Call& c) {
    std::lock_guard<std::mutex> lock(mutex);
    Reply(c, bhttp::status::ok,
          {{"model_path", model_path},
           {"tokenizer_path", options.model_path},
           {"is_generation", true},
           {"preferred_sampling_params", nullptr},
           {"weight_version", weight_version},
           {"has_image_understanding", false},
           {"has_audio_understanding", false},
           {"model_type", kModelType},
           {"architectures", {kArchitecture}}});
  }

  // GET /v1/models. SGLang names the model by its path, which a weight load changes; vLLM keeps
  // the name and root it was launched with.
  void Models(Call& c) {
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    std::string id, root;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (api == Api::kSglang) {
        id = root = model_path;
        if (!options.served_model_name.empty() && model_path == options.model_path)
          id = options.served_model_name;
      } else {
        root = options.model_path;
        id = ServedName();
      }
    }
    json card = {{"id", id},           {"object", "model"},
                 {"created", created}, {"owned_by", api == Api::kSglang ? "sglang" : "vllm"},
                 {"root", root},       {"max_model_len", layout.config().max_seq}};
    if (api == Api::kVllm) {
      card["parent"] = nullptr;
      card["permission"] = {{{"id", "modelperm-" + RandomHex()},
                             {"object", "model_permission"},
                             {"created", created},
                             {"allow_create_engine", false},
                             {"allow_sampling", true},
                             {"allow_logprobs", true},
                             {"allow_search_indices", false},
                             {"allow_view", true},
                             {"allow_fine_tuning", false},
                             {"organization", "*"},
                             {"group", nullptr},
                             {"is_blocking", false}}};
    }
    Reply(c, bhttp::status::ok, {{"object", "list"}, {"data", {card}}});
  }

  std::string ServedName() const {
    return options.served_model_name.empty() ? options.model_path : options.served_model_name;
  }

  // ---- vLLM

  void RouteVllm(Call& c) {
    const std::string& p = c.path;
    if (p == "/v1/completions") return On(c, {"POST"}, [&] { VllmCompletions(c); });
    if (p == "/health") return On(c, {"GET"}, [&] { Health(c, false); });
    if (p == "/v1/models") return On(c, {"GET"}, [&] { Models(c); });
    if (p == "/version") {
      return On(c, {"GET"}, [&] { Reply(c, bhttp::status::ok, {{"version", EngineVersion()}}); });
    }
    bool dev;
    {
      std::lock_guard<std::mutex> lock(mutex);
      dev = dev_mode;
    }
    if (dev) {
      if (p == "/pause") return On(c, {"POST"}, [&] { VllmPause(c); });
      if (p == "/resume")
        return On(c, {"POST"}, [&] {
          Resume();
          Reply(c, bhttp::status::ok, {{"status", "resumed"}});
        });
      if (p == "/is_paused")
        return On(c, {"GET"}, [&] {
          std::lock_guard<std::mutex> lock(mutex);
          Reply(c, bhttp::status::ok, {{"is_paused", paused}});
        });
      if (p == "/collective_rpc") return On(c, {"POST"}, [&] { VllmRpc(c); });
      if (p == "/reset_prefix_cache") return On(c, {"POST"}, [&] { VllmResetCache(c); });
      if (p == "/update_weight_version") return On(c, {"POST"}, [&] { VllmSetVersion(c); });
      if (p == "/weight_info")
        return On(c, {"GET"}, [&] {
          std::lock_guard<std::mutex> lock(mutex);
          Reply(c, bhttp::status::ok, {{"weight_version", weight_version}});
        });
      if (p == "/abort_requests") return On(c, {"POST"}, [&] { VllmAbort(c); });
    }
    NotFoundRoute(c);
  }

  Status CheckQuery(const Call& c, const std::set<std::string>& known) const {
    for (const auto& entry : c.query) {
      if (!known.count(entry.first))
        return InvalidArgument("unknown query parameter '" + entry.first + "' of " + c.path);
    }
    return Status::Ok();
  }

  void VllmPause(Call& c) {
    Status checked = CheckQuery(c, {"mode", "clear_cache", "wait_for_inflight_requests"});
    PauseMode mode = PauseMode::kAbort;
    if (checked.ok() && c.query.count("mode")) {
      const std::string& m = c.query["mode"];
      if (m == "abort") {
        mode = PauseMode::kAbort;
      } else if (m == "wait") {
        mode = PauseMode::kWait;
      } else if (m == "keep") {
        mode = PauseMode::kFreeze;
      } else {
        checked = InvalidArgument("Invalid mode '" + m + "': expected 'abort', 'wait' or 'keep'");
      }
    }
    for (const char* key : {"clear_cache", "wait_for_inflight_requests"}) {
      if (checked.ok() && c.query.count(key) && !QueryBool(c.query[key]))
        checked = InvalidArgument(std::string(key) + " must be a boolean");
    }
    if (checked.ok() && c.query.count("wait_for_inflight_requests") &&
        *QueryBool(c.query["wait_for_inflight_requests"])) {
      mode = PauseMode::kWait;
    }
    if (!checked.ok()) return Reply(c, bhttp::status::bad_request, {{"error", checked.message()}});
    Pause(mode, "aborted by /pause");
    Reply(c, bhttp::status::ok, {{"status", "paused"}});
  }

  void VllmRpc(Call& c) {
    Result<json> body = Body(c, false);
    if (!body.ok()) return ApiError(c, bhttp::status::bad_request, body.status().message());
    const std::string where = "the /collective_rpc request";
    Status checked = CheckKnown(*body, {"method", "args", "kwargs", "timeout"}, where);
    if (checked.ok() && !Has(*body, "method"))
      checked = InvalidArgument("Missing 'method' in request body");
    if (checked.ok() && (*body)["method"] != "reload_weights") {
      checked = InvalidArgument("collective_rpc method " + (*body)["method"].dump() +
                                " is not supported by the test server (only reload_weights)");
    }
    if (checked.ok() && Has(*body, "args") &&
        (!(*body)["args"].is_array() || !(*body)["args"].empty()))
      checked = InvalidArgument("reload_weights takes its arguments as kwargs");
    if (checked.ok() && Has(*body, "timeout") && !(*body)["timeout"].is_number())
      checked = InvalidArgument("timeout must be a number");
    json kwargs = Has(*body, "kwargs") ? (*body)["kwargs"] : json::object();
    if (checked.ok() && !kwargs.is_object()) checked = InvalidArgument("kwargs must be an object");
    if (checked.ok())
      checked =
          CheckKnown(kwargs, {"weights_path", "is_checkpoint_format"}, "reload_weights kwargs");
    if (checked.ok() && Has(kwargs, "weights_path"))
      checked = GetText(kwargs, "weights_path", "kwargs").status();
    if (checked.ok() && Has(kwargs, "is_checkpoint_format"))
      checked = GetBool(kwargs, "is_checkpoint_format", "kwargs").status();
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    // Workers before vLLM 0.15 define reload_weights(self): a keyword is a TypeError.
    const std::optional<std::array<int, 3>> release = rollout_worker::ParseRelease(EngineVersion());
    if (release && *release < std::array<int, 3>{0, 15, 0} && !kwargs.empty()) {
      return ApiError(c, bhttp::status::internal_server_error,
                      "TypeError: Worker.reload_weights() got an unexpected keyword argument '" +
                          kwargs.begin().key() + "'");
    }
    std::string path;
    uint64_t life;
    {
      std::lock_guard<std::mutex> lock(mutex);
      life = epoch;
      path = Has(kwargs, "weights_path") ? kwargs["weights_path"].get<std::string>() : model_path;
    }
    // vLLM reloads between two steps: in-flight requests go on at the new weights.
    std::lock_guard<std::mutex> one_load(load_mutex);
    Result<std::vector<float>> loaded = Load(path);
    if (!loaded.ok())
      return ApiError(c, bhttp::status::internal_server_error, loaded.status().message());
    Install(std::move(*loaded), path, std::nullopt, life);
    changed.notify_all();
    Reply(c, bhttp::status::ok, {{"results", {nullptr}}});
  }

  void VllmResetCache(Call& c) {
    Status checked = CheckQuery(c, {"reset_running_requests", "reset_external"});
    bool reset_running = false;
    for (const char* key : {"reset_running_requests", "reset_external"}) {
      if (checked.ok() && c.query.count(key)) {
        std::optional<bool> v = QueryBool(c.query[key]);
        if (!v) checked = InvalidArgument(std::string(key) + " must be a boolean");
        if (v && std::string(key) == "reset_running_requests") reset_running = *v;
      }
    }
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mutex);
      busy = !jobs.empty();
    }
    // Requests in flight (frozen ones too) hold cache blocks: the reset fails unless told to
    // reset them as well, answered as the build family answers (FakeEngineOptions).
    const bool reset = !busy || reset_running;
    if (options.reset_answers == "success")
      return Reply(c, bhttp::status::ok, {{"success", reset}});
    if (options.reset_answers == "conflict" && !reset) {
      return ApiError(c, bhttp::status::conflict, "Failed to reset prefix cache");
    }
    ReplyEmpty(c, bhttp::status::ok);
  }

  void VllmSetVersion(Call& c) {
    Result<json> body = Body(c, false);
    Status checked = body.ok()
                         ? CheckKnown(*body, {"new_version"}, "the /update_weight_version request")
                         : body.status();
    if (checked.ok() && !Has(*body, "new_version"))
      checked = InvalidArgument("new_version is required");
    Result<std::string> version =
        checked.ok() ? GetText(*body, "new_version", "the request") : Result<std::string>(checked);
    if (!version.ok()) return ApiError(c, bhttp::status::bad_request, version.status().message());
    {
      std::lock_guard<std::mutex> lock(mutex);
      weight_version = *version;
    }
    Reply(c, bhttp::status::ok, {{"success", true}, {"new_version", *version}});
  }

  void VllmAbort(Call& c) {
    Result<json> body = Body(c, true);
    Status checked = body.ok() ? CheckKnown(*body, {"request_ids"}, "the /abort_requests request")
                               : body.status();
    std::set<std::string> ids;
    if (checked.ok() && Has(*body, "request_ids")) {
      if (!(*body)["request_ids"].is_array())
        checked = InvalidArgument("request_ids must be a list");
      for (const json& id : checked.ok() ? (*body)["request_ids"] : json::array()) {
        if (!id.is_string()) {
          checked = InvalidArgument("request_ids must hold strings");
          break;
        }
        ids.insert(id.get<std::string>());
      }
    }
    if (!checked.ok()) return ApiError(c, bhttp::status::bad_request, checked.message());
    int aborted = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (ids.empty()) {
        for (Job* job : jobs) {
          for (const Sample& s : job->samples) aborted += s.finish == Finish::kRunning;
        }
        AbortAllLocked("aborted by /abort_requests");
      } else {
        aborted = AbortByIdLocked(ids, "aborted by /abort_requests");
      }
    }
    changed.notify_all();
    Reply(c, bhttp::status::ok, {{"status", "aborted"}, {"aborted", aborted}});
  }

  struct VllmChoiceOptions {
    int logprobs = -1;  // -1: none
    bool token_ids_as_text = false;
    bool return_token_ids = false;
    bool include_stop = false;
  };

  void VllmCompletions(Call& c) {
    Result<json> body = Body(c, false);
    if (!body.ok()) return ApiError(c, bhttp::status::bad_request, body.status().message());
    bool not_found = false;
    Status parsed = ParseVllmCompletions(c, *body, &not_found);
    if (!parsed.ok()) {
      return ApiError(c, not_found ? bhttp::status::not_found : bhttp::status::bad_request,
                      parsed.message());
    }
  }

  Status ParseVllmCompletions(Call& c, const json& body, bool* not_found) {
    const std::string where = "the /v1/completions request";
    static const std::set<std::string> kKnown = {"model",
                                                 "prompt",
                                                 "echo",
                                                 "frequency_penalty",
                                                 "logit_bias",
                                                 "logprobs",
                                                 "max_tokens",
                                                 "n",
                                                 "presence_penalty",
                                                 "seed",
                                                 "stop",
                                                 "stream",
                                                 "stream_options",
                                                 "suffix",
                                                 "temperature",
                                                 "top_p",
                                                 "user",
                                                 "use_beam_search",
                                                 "top_k",
                                                 "min_p",
                                                 "repetition_penalty",
                                                 "length_penalty",
                                                 "stop_token_ids",
                                                 "include_stop_str_in_output",
                                                 "ignore_eos",
                                                 "min_tokens",
                                                 "skip_special_tokens",
                                                 "spaces_between_special_tokens",
                                                 "truncate_prompt_tokens",
                                                 "allowed_token_ids",
                                                 "prompt_logprobs",
                                                 "prompt_embeds",
                                                 "add_special_tokens",
                                                 "response_format",
                                                 "structured_outputs",
                                                 "priority",
                                                 "request_id",
                                                 "logits_processors",
                                                 "return_tokens_as_token_ids",
                                                 "return_token_ids",
                                                 "cache_salt",
                                                 "kv_transfer_params",
                                                 "vllm_xargs"};
    WEFT_RETURN_IF_ERROR(CheckKnown(body, kKnown, where));
    if (Has(body, "stream")) {
      WEFT_ASSIGN_OR_RETURN(bool stream, GetBool(body, "stream", where));
      if (stream) return InvalidArgument("streaming is not supported by the test server");
    }
    if (Has(body, "echo")) {
      WEFT_ASSIGN_OR_RETURN(bool echo, GetBool(body, "echo", where));
      if (echo) return InvalidArgument("echo is not supported by the test server");
    }
    for (const char* key : {"frequency_penalty", "presence_penalty", "min_p", "min_tokens"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(body, key, where, IsZero));
    WEFT_RETURN_IF_ERROR(OnlyDefault(body, "repetition_penalty", where, IsOne));
    for (const char* key : {"stop", "logit_bias"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(body, key, where, IsEmpty));
    for (const char* key : {"stream_options", "suffix", "allowed_token_ids", "prompt_embeds",
                            "truncate_prompt_tokens", "response_format", "structured_outputs",
                            "logits_processors", "kv_transfer_params", "vllm_xargs"})
      WEFT_RETURN_IF_ERROR(OnlyDefault(body, key, where, IsNothing));
    WEFT_RETURN_IF_ERROR(OnlyDefault(body, "use_beam_search", where, IsFalse));
    WEFT_RETURN_IF_ERROR(OnlyDefault(body, "priority", where, IsZero));
    if (Has(body, "length_penalty"))
      WEFT_RETURN_IF_ERROR(GetNumber(body, "length_penalty", where).status());
    for (const char* key : {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                            "include_stop_str_in_output", "add_special_tokens",
                            "return_tokens_as_token_ids", "return_token_ids"}) {
      if (Has(body, key)) WEFT_RETURN_IF_ERROR(GetBool(body, key, where).status());
    }
    for (const char* key : {"user", "cache_salt", "request_id"}) {
      if (Has(body, key)) WEFT_RETURN_IF_ERROR(GetText(body, key, where).status());
    }
    const std::string served = ServedName();
    if (Has(body, "model")) {
      WEFT_ASSIGN_OR_RETURN(std::string model, GetText(body, "model", where));
      if (model != served) {
        *not_found = true;
        return NotFound("The model `" + model + "` does not exist.");
      }
    }
    // The prompts.
    if (!Has(body, "prompt") || (body["prompt"].is_string() && body["prompt"].empty()))
      return InvalidArgument("Either prompt or prompt_embeds must be provided and non-empty.");
    const bool special = !Has(body, "add_special_tokens") || body["add_special_tokens"].get<bool>();
    const json& prompt = body["prompt"];
    std::vector<std::vector<int>> prompts;
    auto encode = [&](const json& text) -> Status {
      WEFT_ASSIGN_OR_RETURN(std::vector<int> ids, Tokenize(text.get<std::string>()));
      if (!special) ids.erase(ids.begin());
      prompts.push_back(std::move(ids));
      return Status::Ok();
    };
    if (prompt.is_string()) {
      WEFT_RETURN_IF_ERROR(encode(prompt));
    } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_string()) {
      for (const json& p : prompt) {
        if (!p.is_string()) return InvalidArgument("prompt must not mix text and token ids");
        WEFT_RETURN_IF_ERROR(encode(p));
      }
    } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_array()) {
      for (const json& p : prompt) {
        WEFT_ASSIGN_OR_RETURN(std::vector<int> ids, GetIds(p, "prompt"));
        prompts.push_back(std::move(ids));
      }
    } else if (prompt.is_array() && !prompt.empty()) {
      WEFT_ASSIGN_OR_RETURN(std::vector<int> ids, GetIds(prompt, "prompt"));
      prompts.push_back(std::move(ids));
    } else {
      return InvalidArgument(
          "prompt must be a string, a list of strings, a list of token ids or a list of lists of "
          "token ids");
    }
    for (const std::vector<int>& p : prompts) WEFT_RETURN_IF_ERROR(CheckPrompt(p));
    // Sampling.
    Sample base;
    base.max_tokens = 16;
    if (body.contains("max_tokens")) {
      if (body["max_tokens"].is_null()) {
        base.max_tokens.reset();
      } else {
        WEFT_ASSIGN_OR_RETURN(int64_t v, GetInt(body, "max_tokens", where, 1, 1 << 30));
        base.max_tokens = static_cast<int>(v);
      }
    }
    for (const std::vector<int>& p : prompts)
      WEFT_RETURN_IF_ERROR(CheckContext(p, base.max_tokens));
    int n = 1;
    if (Has(body, "n")) {
      WEFT_ASSIGN_OR_RETURN(int64_t v, GetInt(body, "n", where, 1, 1024));
      n = static_cast<int>(v);
    }
    if (Has(body, "temperature")) {
      WEFT_ASSIGN_OR_RETURN(double v, GetNumber(body, "temperature", where));
      if (v < 0)
        return InvalidArgument("temperature must be non-negative, got " + std::to_string(v));
      // vLLM samples greedily below this temperature.
      base.temperature = v < 1e-5 ? 0.0f : static_cast<float>(v);
    }
    if (Has(body, "top_p")) {
      WEFT_ASSIGN_OR_RETURN(double v, GetNumber(body, "top_p", where));
      if (!(v > 0 && v <= 1))
        return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(v));
      base.top_p = static_cast<float>(v);
    }
    if (Has(body, "top_k")) {
      WEFT_ASSIGN_OR_RETURN(int64_t k, GetInt(body, "top_k", where, -1, 1 << 30));
      if (k > 0 && k < layout.config().vocab) {
        return InvalidArgument("top_k = " + std::to_string(k) +
                               " is not supported by the test server (only 0, -1 or at least the "
                               "vocabulary, " +
                               std::to_string(layout.config().vocab) + ")");
      }
    }
    if (Has(body, "stop_token_ids")) {
      WEFT_ASSIGN_OR_RETURN(base.stop_ids, GetIds(body["stop_token_ids"], "stop_token_ids"));
    }
    std::optional<uint64_t> seed;
    if (Has(body, "seed")) {
      WEFT_ASSIGN_OR_RETURN(seed, GetSeed(body, "seed", where));
    }
    VllmChoiceOptions choice;
    if (Has(body, "logprobs")) {
      if (!body["logprobs"].is_number_integer() || body["logprobs"].get<int64_t>() < 0)
        return InvalidArgument("`logprobs` must be a positive value.");
      if (body["logprobs"].get<int64_t>() > 20) {
        return InvalidArgument("Requested sample logprobs of " + body["logprobs"].dump() +
                               ", which is greater than max allowed: 20");
      }
      choice.logprobs = body["logprobs"].get<int>();
      base.top_n = choice.logprobs;
    }
    if (Has(body, "prompt_logprobs")) {
      const json& k = body["prompt_logprobs"];
      if (!k.is_number_integer() || k.get<int64_t>() < -1)
        return InvalidArgument("`prompt_logprobs` must be a positive value or -1.");
      if (k.get<int64_t>() > 20) {
        return InvalidArgument("Requested prompt logprobs of " + k.dump() +
                               ", which is greater than max allowed: 20");
      }
      // -1: every token of the vocabulary.
      base.prompt_logprobs = k.get<int>() == -1 ? layout.config().vocab : k.get<int>();
    }
    choice.token_ids_as_text =
        Has(body, "return_tokens_as_token_ids") && body["return_tokens_as_token_ids"].get<bool>();
    choice.return_token_ids = Has(body, "return_token_ids") && body["return_token_ids"].get<bool>();
    choice.include_stop =
        Has(body, "include_stop_str_in_output") && body["include_stop_str_in_output"].get<bool>();
    const std::string request_id =
        Has(body, "request_id") ? body["request_id"].get<std::string>() : RandomHex();

    Job job;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (int k = 0; k < n; ++k) {
        Sample s = base;
        s.prompt = prompts[i];
        s.prompt_index = i;
        s.id = request_id;
        // Sample k of a seeded request draws from seed + k, as vLLM's parallel sampling does.
        s.seed = seed ? *seed + k : RandomSeed();
        job.samples.push_back(std::move(s));
      }
    }
    RunJob(job);

    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (const std::vector<int>& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
    for (const Sample& s : job.samples) {
      completion_tokens += static_cast<int64_t>(s.tokens.size());
      choices.push_back(VllmChoice(s, choices.size(), choice));
    }
    Release(job);
    Reply(c, bhttp::status::ok,
          {{"id", "cmpl-" + request_id},
           {"object", "text_completion"},
           {"created", static_cast<int64_t>(std::time(nullptr))},
           {"model", served},
           {"choices", choices},
           {"usage",
            {{"prompt_tokens", prompt_tokens},
             {"completion_tokens", completion_tokens},
             {"total_tokens", prompt_tokens + completion_tokens},
             {"prompt_tokens_details", nullptr}}},
           {"service_tier", nullptr},
           {"system_fingerprint", nullptr},
           {"kv_transfer_params", nullptr}});
    return Status::Ok();
  }

  static std::string VllmTokenText(int id, bool as_id) {
    return as_id ? "token_id:" + std::to_string(id) : examples::ArithmeticTask::Decode({id});
  }

  // choices[i].prompt_logprobs: null when not asked; else per prompt position null (the first) or
  // {"<token id>": {"logprob", "rank", "decoded_token"}}, -inf clamped to -9999 as vLLM does.
  static json PromptLogprobsJson(const Sample& s, const VllmChoiceOptions& o) {
    if (s.prompt_logprobs < 0) return nullptr;
    json positions = json::array();
    for (size_t i = 0; i < s.prompt_ranked.size(); ++i) {
      if (i == 0) {
        positions.push_back(nullptr);
        continue;
      }
      json at = json::object();
      for (const Sample::Ranked& r : s.prompt_ranked[i]) {
        at[std::to_string(r.id)] = {{"logprob", std::max(static_cast<double>(r.logprob), -9999.0)},
                                    {"rank", r.rank},
                                    {"decoded_token", VllmTokenText(r.id, o.token_ids_as_text)}};
      }
      positions.push_back(at);
    }
    return positions;
  }

  json VllmChoice(const Sample& s, size_t index, const VllmChoiceOptions& o) const {
    std::vector<int> shown = s.tokens;
    if (s.finish == Finish::kStop && !o.include_stop && !shown.empty()) shown.pop_back();
    json logprobs = nullptr;
    if (o.logprobs >= 0) {
      json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
           offsets = json::array();
      size_t offset = 0;
      for (size_t t = 0; t < s.tokens.size(); ++t) {
        const std::string text = VllmTokenText(s.tokens[t], o.token_ids_as_text);
        tokens.push_back(text);
        token_logprobs.push_back(std::max(static_cast<double>(s.logprobs[t]), -9999.0));
        // The sampled token, then the best `logprobs` alternatives.
        json entry = json::object();
        entry[text] = std::max(static_cast<double>(s.logprobs[t]), -9999.0);
        // (Alternatives are kept only when asked for: logprobs > 0.)
        for (const auto& alternative : t < s.top.size() ? s.top[t] : decltype(s.top[0]){}) {
          const std::string key = VllmTokenText(alternative.first, o.token_ids_as_text);
          if (!entry.contains(key))
            entry[key] = std::max(static_cast<double>(alternative.second), -9999.0);
        }
        top.push_back(entry);
        offsets.push_back(offset);
        offset += examples::ArithmeticTask::Decode({s.tokens[t]}).size();
      }
      logprobs = {{"tokens", tokens},
                  {"token_logprobs", token_logprobs},
                  {"top_logprobs", top},
                  {"text_offset", offsets}};
    }
    const char* finish = s.finish == Finish::kStop     ? "stop"
                         : s.finish == Finish::kLength ? "length"
                                                       : "abort";
    return {{"index", index},
            {"text", examples::ArithmeticTask::Decode(shown)},
            {"logprobs", logprobs},
            {"finish_reason", finish},
            {"stop_reason", s.finish == Finish::kStop ? json(s.matched) : json(nullptr)},
            {"token_ids", o.return_token_ids ? json(s.tokens) : json(nullptr)},
            {"prompt_logprobs", PromptLogprobsJson(s, o)},
            {"prompt_token_ids", o.return_token_ids ? json(s.prompt) : json(nullptr)}};
  }

  // ---- test control

  void HandleTest(Call& c) {
    if (c.path == "/_test/faults" && c.method == "POST") return TestFaults(c);
    if (c.path == "/_test/calls" && c.method == "GET") {
      json list = json::array();
      std::lock_guard<std::mutex> lock(mutex);
      for (const RecordedCall& call : calls) {
        list.push_back(
            {{"method", call.method},
             {"target", call.target},
             {"body", call.body},
             {"at_ms",
              std::chrono::duration_cast<std::chrono::milliseconds>(call.at - launched).count()}});
      }
      return c.respond(http::JsonResponse(*c.request, bhttp::status::ok, list));
    }
    if (c.path == "/_test/calls" && c.method == "DELETE") {
      {
        std::lock_guard<std::mutex> lock(mutex);
        calls.clear();
      }
      return ReplyEmpty(c, bhttp::status::ok);
    }
    if (c.path == "/_test/state" && c.method == "GET") {
      const FakeEngineState s = State();
      return c.respond(http::JsonResponse(*c.request, bhttp::status::ok,
                                          {{"weight_version", s.weight_version},
                                           {"model_path", s.model_path},
                                           {"paused", s.paused},
                                           {"frozen", s.frozen},
                                           {"in_flight", s.in_flight},
                                           {"held", s.held},
                                           {"tokens", s.tokens},
                                           {"loads", s.loads}}));
    }
    if (c.path == "/_test/restart" && c.method == "POST") return TestRestart(c);
    c.respond(http::ErrorResponse(*c.request, bhttp::status::not_found,
                                  "test routes: POST /_test/faults, GET|DELETE /_test/calls, GET "
                                  "/_test/state, POST /_test/restart"));
  }

  void TestFaults(Call& c) {
    auto refuse = [&](const std::string& message) {
      c.respond(http::ErrorResponse(*c.request, bhttp::status::bad_request, message));
    };
    Result<json> body = Body(c, false);
    if (!body.ok()) return refuse(body.status().message());
    const json& b = *body;
    const std::string where = "/_test/faults";
    Status checked = CheckKnown(b,
                                {"token_delay_ms", "load_delay_ms", "fail_next", "disconnect_next",
                                 "healthy", "report_weight_versions", "dev_mode"},
                                where);
    std::optional<Injection> fail, disconnect;
    auto injection = [&](const char* key, bool with_status) -> Result<Injection> {
      const json& v = b[key];
      WEFT_RETURN_IF_ERROR(CheckKnown(v,
                                      with_status ? std::set<std::string>{"count", "status", "path"}
                                                  : std::set<std::string>{"count", "path"},
                                      where + "." + key));
      Injection out;
      if (!Has(v, "count")) return InvalidArgument(where + "." + key + ".count is required");
      WEFT_ASSIGN_OR_RETURN(int64_t count, GetInt(v, "count", where + "." + key, 0, 1 << 20));
      out.count = static_cast<int>(count);
      if (with_status && Has(v, "status")) {
        WEFT_ASSIGN_OR_RETURN(int64_t status, GetInt(v, "status", where + "." + key, 500, 599));
        out.status = static_cast<int>(status);
      }
      if (Has(v, "path")) {
        WEFT_ASSIGN_OR_RETURN(out.path, GetText(v, "path", where + "." + key));
      }
      return out;
    };
    if (checked.ok() && Has(b, "fail_next")) {
      Result<Injection> v = b["fail_next"].is_object()
                                ? injection("fail_next", true)
                                : Result<Injection>(InvalidArgument("fail_next must be an object"));
      checked = v.status();
      if (v.ok()) fail = *v;
    }
    if (checked.ok() && Has(b, "disconnect_next")) {
      Result<Injection> v =
          b["disconnect_next"].is_object()
              ? injection("disconnect_next", false)
              : Result<Injection>(InvalidArgument("disconnect_next must be an object"));
      checked = v.status();
      if (v.ok()) disconnect = *v;
    }
    for (const char* key : {"token_delay_ms", "load_delay_ms"}) {
      if (checked.ok() && Has(b, key)) checked = GetInt(b, key, where, 0, 600000).status();
    }
    for (const char* key : {"healthy", "report_weight_versions", "dev_mode"}) {
      if (checked.ok() && Has(b, key)) checked = GetBool(b, key, where).status();
    }
    if (!checked.ok()) return refuse(checked.message());
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (Has(b, "token_delay_ms")) token_delay_ms = b["token_delay_ms"].get<int>();
      if (Has(b, "load_delay_ms")) load_delay_ms = b["load_delay_ms"].get<int>();
      if (fail) fail_next = *fail;
      if (disconnect) disconnect_next = *disconnect;
      if (Has(b, "healthy")) healthy = b["healthy"].get<bool>();
      if (Has(b, "report_weight_versions"))
        report_weight_versions = b["report_weight_versions"].get<bool>();
      if (Has(b, "dev_mode")) dev_mode = b["dev_mode"].get<bool>();
    }
    changed.notify_all();  // (a load under way reads its delay again)
    ReplyEmpty(c, bhttp::status::ok);
  }

  // Answers, then the engine dies for `down_ms` and comes back as launched.
  void TestRestart(Call& c) {
    Result<json> body = Body(c, true);
    Status checked = body.ok() ? CheckKnown(*body, {"down_ms"}, "/_test/restart") : body.status();
    int down_ms = 0;
    if (checked.ok() && Has(*body, "down_ms")) {
      Result<int64_t> v = GetInt(*body, "down_ms", "/_test/restart", 0, 600000);
      checked = v.status();
      if (v.ok()) down_ms = static_cast<int>(*v);
    }
    if (!checked.ok())
      return c.respond(
          http::ErrorResponse(*c.request, bhttp::status::bad_request, checked.message()));
    ReplyEmpty(c, bhttp::status::ok);
    // Time for the answer to leave before every connection closes.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Stop();
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait_for(lock, std::chrono::milliseconds(down_ms), [&] { return shutting_down; });
      if (shutting_down) return;
    }
    Status started = Start();
    if (!started.ok()) {
      WEFT_LOG(kError) << "fake engine: cannot start again: " << started.message();
    }
  }

  FakeEngineState State() const {
    std::lock_guard<std::mutex> lock(mutex);
    FakeEngineState s;
    s.weight_version = weight_version;
    s.model_path = model_path;
    s.running = running;
    s.paused = paused;
    s.frozen = frozen;
    s.in_flight = static_cast<int>(jobs.size());
    s.held = held;
    s.tokens = tokens;
    s.loads = loads;
    return s;
  }
};

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<FakeEngine>> FakeEngine::Create(Api api, FakeEngineOptions options) {
  WEFT_ASSIGN_OR_RETURN(examples::TinyLmConfig config, ReadModelConfig(options.model_path));
  const std::string& mode = options.logprobs_mode;
  if (mode != "raw_logprobs" && mode != "processed_logprobs" && mode != "raw_logits") {
    return InvalidArgument("logprobs_mode '" + mode +
                           "' is none of raw_logprobs, processed_logprobs, raw_logits");
  }
  auto impl = std::make_unique<Impl>(api, std::move(options), config);
  WEFT_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<FakeEngine>(new FakeEngine(std::move(impl)));
}

FakeEngine::FakeEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FakeEngine::~FakeEngine() { impl_->Shutdown(); }

Api FakeEngine::api() const { return impl_->api; }

uint16_t FakeEngine::port() const { return impl_->port.load(); }

std::string FakeEngine::url() const {
  return "http://" + impl_->options.host + ":" + std::to_string(port());
}

const examples::TinyLmLayout& FakeEngine::layout() const { return impl_->layout; }

std::shared_ptr<const std::vector<float>> FakeEngine::weights() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->weights;
}

FakeEngineState FakeEngine::state() const { return impl_->State(); }

void FakeEngine::Stop() { impl_->Stop(); }

Status FakeEngine::Start() { return impl_->Start(); }

std::vector<RecordedCall> FakeEngine::calls() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->calls;
}

void FakeEngine::ClearCalls() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->calls.clear();
}

void FakeEngine::SetTokenDelay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->token_delay_ms = static_cast<int>(delay.count());
}

void FakeEngine::SetLoadDelay(std::chrono::milliseconds delay) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->load_delay_ms = static_cast<int>(delay.count());
  }
  impl_->changed.notify_all();
}

void FakeEngine::FailNext(int count, int status, std::string path) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->fail_next = {count, status, std::move(path)};
}

void FakeEngine::DisconnectNext(int count, std::string path) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->disconnect_next = {count, 0, std::move(path)};
}

void FakeEngine::SetHealthy(bool healthy) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->healthy = healthy;
}

void FakeEngine::SetReportWeightVersions(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->report_weight_versions = on;
}

void FakeEngine::SetDevMode(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->dev_mode = on;
}

}  // namespace weft::fake_engine
