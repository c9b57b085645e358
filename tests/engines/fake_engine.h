// Test servers that speak the HTTP APIs of SGLang and vLLM, serving the example policy (TinyLm,
// examples/tiny_lm.h) on the CPU, so that engine adapters can be tested end to end without a GPU.
//
// Each server answers exactly the routes and payloads of its engine that an RL rollout worker uses
// (generation with token ids and logprobs, the logprobs of a prompt's own tokens for scoring:
// SGLang's logprob_start_len with input_token_logprobs, vLLM's prompt_logprobs; loading weights
// from a directory, pausing and resuming generation, model information, health), with the semantics
// of the engine around in-flight requests, and refuses what it does not implement instead of
// ignoring it:
//
//   SGLang: POST /generate, /update_weights_from_disk, /pause_generation, /continue_generation,
//   /update_weight_version, /abort_request, GET|POST /flush_cache, GET /model_info (and its old
//   name /get_model_info), /health, /health_generate, /v1/models.
//   vLLM: POST /v1/completions, GET /health, /v1/models, and in dev mode (vLLM's
//   VLLM_SERVER_DEV_MODE=1) POST /pause?mode=abort|wait|keep, /resume, /collective_rpc (method
//   reload_weights), /reset_prefix_cache, /update_weight_version, /abort_requests, GET /is_paused,
//   /weight_info.
//
// Generation is token by token over the whole sequence (prompt and tokens so far) with the weights
// current at that token, so that a pause, an abort or a weight update lands between two tokens.
// The logprob of a token is the model's log-probability at temperature 1 before top-p, which is
// SGLang's with SGLANG_RETURN_ORIGINAL_LOGPROB=1 and vLLM's default raw_logprobs (the other modes
// are FakeEngineOptions::logprobs_mode's). Sampling is
// deterministic for a given seed (SGLang's sampling_seed, vLLM's seed): each step draws from the
// seed and the position, as SGLang's seeded sampler does, so n seeded SGLang samples of one prompt
// are the same, while vLLM gives sample k the seed + k. The tokenizer is the example task's
// (examples/arithmetic_task.h): a problem encodes as the task encodes it, other text character by
// character over the same vocabulary (digits, '+', '=', '$' for the end token, '^' for the begin
// token), always after the begin token; output text decodes every token.
// The model has no end-of-sequence token of its own: generation stops at a stop token id, at the
// token limit, or at the model's context (max_seq), the last two finishing with "length".
//
// Weight versions: every token is tagged with the weight version string current when it was
// computed; SGLang responses carry meta_info.weight_version (the version when the response is
// assembled) and, when `report_weight_versions` is on (newer SGLang builds), meta_info.
// weight_versions, the half-open spans of output positions per version. vLLM reports none.
//
// Unknown request fields are refused (400), as is any documented field set to a value whose effect
// is not implemented (a stop string, a penalty, streaming, echo): the engines themselves ignore
// unknown top-level fields (vLLM logs them), so a misspelt field that would silently do nothing
// against a real engine fails loudly here.
//
// Test switches, settable from the test or over HTTP (POST /_test/faults, for the executable):
// a delay per generated token and per weight load, failing the next requests with a 5xx,
// disconnecting the next requests without an answer, forcing the health routes to 503. Stop() and
// Start() make the engine die (every connection closed, every generation ended) and come back on
// the same port as freshly launched: the launch model directory reloaded, version reset, unpaused.
// A disconnect drops the request unanswered and restarts the listener, keeping the engine's state
// (HttpServer cannot close one connection alone, so every open connection closes with it). A
// client that sent the request on a connection it reused may repeat it unasked (libcurl does,
// once, when such a connection closes before any answer): DisconnectNext(2) drops both.
//
// Model directories: config.json ({"architectures": ["WeftTinyLm"], "model_type":
// "weft_tiny_lm", "vocab_size", "d_model", "layers", "heads", "d_ff", "max_seq"}) and one or more
// *.safetensors files holding every TinyLm parameter by name, in BF16, F16 or F32. A weight load
// reads only the safetensors files and checks them against the served model's layout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "examples/tiny_lm.h"
#include "sync/dtype.h"

namespace weft::fake_engine {

inline constexpr std::string_view kArchitecture = "WeftTinyLm";
inline constexpr std::string_view kModelType = "weft_tiny_lm";

// Writes `dir`/config.json and `dir`/model.safetensors (every parameter of `weights`, laid out as
// TinyLmLayout(config) says, converted to `dtype`: BF16, F16 or F32). Creates `dir` if needed.
Status WriteModelDirectory(const std::string& dir, const examples::TinyLmConfig& config,
                           std::span<const float> weights, sync::DType dtype);
// The model configuration in `dir`/config.json.
Result<examples::TinyLmConfig> ReadModelConfig(const std::string& dir);
// The weights in the *.safetensors files of `dir`, widened to FP32 in `layout`'s order: every
// parameter present exactly once with its shape, no other tensor; errors name the tensor.
Result<std::vector<float>> ReadModelWeights(const std::string& dir,
                                            const examples::TinyLmLayout& layout);

enum class Api { kSglang, kVllm };
std::string_view ApiName(Api api);  // "sglang", "vllm"

struct FakeEngineOptions {
  std::string model_path;  // the model directory served at launch
  std::string host = "127.0.0.1";
  uint16_t port = 0;    // 0: any free port (see FakeEngine::port)
  std::string api_key;  // "": none; else "Authorization: Bearer <key>" on all but /health*
  std::string weight_version = "default";  // the version string at launch
  std::string served_model_name;           // "": the model path
  bool report_weight_versions = false;     // SGLang: meta_info.weight_versions
  bool dev_mode = true;                    // vLLM: the dev-mode routes exist
  std::chrono::milliseconds token_delay{0};
  // The release the engine reports (SGLang /server_info, vLLM /version); "": the default, a
  // release with every route weft uses (SGLang 0.5.6, vLLM 0.16.0). vLLM before 0.15 refuses
  // reload_weights' weights_path (a TypeError, 500), as its workers do.
  std::string engine_version;
  // SGLang --enable-deterministic-inference: sampling_seed is read (and must fit the int32 it is
  // kept in); without it the seed is ignored, as SGLang ignores it.
  bool deterministic_inference = false;
  // A request whose prompt and token limit do not fit the context is refused (400), as the
  // engines refuse it (SGLang when they reach it, vLLM when they pass it); off: generation stops
  // at the context.
  bool refuse_past_context = true;
  // How vLLM's /reset_prefix_cache answers when requests in flight hold cache blocks and
  // reset_running_requests is not set: "empty" (200 with an empty body and nothing reset, as
  // current vLLM), "success" (200 {"success": false}) or "conflict" (409).
  std::string reset_answers = "empty";
  // SGLang: false makes /update_weights_from_disk under a pause that kept requests (in_place,
  // retract) wait for those requests to end, as released SGLang's disk load does (it takes the
  // model-update lock they hold), so the load finishes only after a resume lets them end.
  bool pause_aware_disk_load = true;
  // What a token's logprob (and its alternatives') is, in vLLM's --logprobs-mode names:
  // "raw_logprobs" (at temperature 1 before top-p: vLLM's default, SGLang with
  // SGLANG_RETURN_ORIGINAL_LOGPROB=1), "processed_logprobs" (after temperature: SGLang's default)
  // or "raw_logits" (the model's logits, here the logprobs shifted by a constant, as logits are
  // defined up to one).
  std::string logprobs_mode = "raw_logprobs";
};

// One request as it arrived (the /_test/ routes are not recorded).
struct RecordedCall {
  std::string method, target;  // target: path and query
  std::string body;
  std::chrono::steady_clock::time_point at;
};

// What the engine is doing now.
struct FakeEngineState {
  std::string weight_version;
  std::string model_path;  // the directory the weights were last loaded from
  bool running = true;     // false between Stop() and Start()
  bool paused = false;     // new requests wait
  bool frozen = false;     // in-flight requests wait between tokens
  int in_flight = 0;       // generation requests admitted and not finished
  int held = 0;            // generation requests waiting to be admitted
  uint64_t tokens = 0;     // tokens generated since launch
  uint64_t loads = 0;      // weight loads that succeeded since launch
};

class FakeEngine {
 public:
  // Loads the model directory and starts serving.
  static Result<std::unique_ptr<FakeEngine>> Create(Api api, FakeEngineOptions options);
  ~FakeEngine();
  FakeEngine(const FakeEngine&) = delete;
  FakeEngine& operator=(const FakeEngine&) = delete;

  Api api() const;
  uint16_t port() const;
  std::string url() const;  // "http://127.0.0.1:<port>"
  const examples::TinyLmLayout& layout() const;
  // The weights generation uses now.
  std::shared_ptr<const std::vector<float>> weights() const;
  FakeEngineState state() const;

  // The engine dies: the listener and every connection close, every generation ends, the pause
  // is lifted. Start() brings it back on the same port as launched (the launch model directory
  // read again, the launch version); it fails if that directory no longer loads.
  void Stop();
  Status Start();

  std::vector<RecordedCall> calls() const;
  void ClearCalls();

  // Test switches (thread-safe).
  void SetTokenDelay(std::chrono::milliseconds delay);
  // A load waits this long before it reads the directory (a lower value shortens one under way;
  // Stop ends one).
  void SetLoadDelay(std::chrono::milliseconds delay);
  // The next `count` requests (to `path` only, when given) are answered `status` with the API's
  // JSON error.
  void FailNext(int count, int status, std::string path = "");
  // The next `count` requests (to `path` only, when given) get no answer: their connection closes.
  void DisconnectNext(int count, std::string path = "");
  void SetHealthy(bool healthy);
  void SetReportWeightVersions(bool on);
  void SetDevMode(bool on);

  struct Impl;

 private:
  explicit FakeEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::fake_engine
