// ReplicaApi: one serving-engine replica's HTTP API, as the HttpEngine (http_engine.h) drives it.
// Two implementations speak the engines' own routes, unmodified (docs/engines.md):
//   - SGLang: POST /generate (also to score given tokens), /pause_generation,
//     /update_weights_from_disk, /continue_generation, GET /model_info, /health.
//   - vLLM (OpenAI-compatible server with VLLM_SERVER_DEV_MODE=1): POST /v1/completions (also to
//     score given tokens, with prompt_logprobs), /pause, /collective_rpc (reload_weights),
//     /reset_prefix_cache, /update_weight_version, /resume, GET /weight_info, /v1/models, /health.
// Weight versions are the decimal version numbers as strings. Calls are thread-safe; errors say
// which replica and route failed: kUnavailable when the replica cannot be reached or answers 5xx,
// kInvalidArgument when it refuses a request.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "rollout_worker/engine.h"

namespace weft::rollout_worker {

// One sample as the replica returned it.
struct ReplicaOutput {
  std::vector<int> tokens;
  std::vector<float> logprobs;  // one per token
  std::string text;
  // Cut short by a pause in abort mode: `tokens` are those generated before it.
  bool aborted = false;
  // (version, first token) as the engine reported them (SGLang's meta_info.weight_versions);
  // empty when it reports none.
  std::vector<std::pair<std::string, uint64_t>> spans;
  // The prompt's token ids, when the engine returned them (vLLM's prompt_token_ids).
  std::vector<int> prompt_tokens;
  // The weight version the engine reported when it assembled the answer (SGLang's
  // meta_info.weight_version); empty when it reports none.
  std::string version;
};

// What a replica says of itself (ReplicaApi::Info), read before its first load.
// What the logprobs a replica returns are. The trainer needs each token's log-probability at
// temperature 1 (SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB=1, vLLM's raw_logprobs); by default
// SGLang returns them after temperature, and vLLM can be set to return logits.
enum class LogprobsKind {
  kUnknown,           // the probe could not tell (it was refused, or the distribution is too flat)
  kTemperatureOne,    // as the trainer computes them
  kAfterTemperature,  // the sampling distribution's at the request's temperature
  kNotLogprobs,       // not log-probabilities at all (logits)
};
const char* LogprobsKindName(LogprobsKind kind);

// Tells what the engine's logprobs are from the best few alternatives it gave for the first token
// after one prompt, asked at temperature 1 (`at_one`) and at temperature 1/2 (`at_half`). Gaps
// between log-probabilities are the same at any temperature when they are taken at temperature 1,
// and twice as wide at 1/2 when taken after it; log-probabilities of alternatives add up to at
// most 1 in probability, logits need not.
LogprobsKind ClassifyLogprobs(std::vector<float> at_one, std::vector<float> at_half);

struct ReplicaInfo {
  std::string version;         // the engine's release ("0.5.6"); empty where it gives none
  bool deterministic = false;  // SGLang --enable-deterministic-inference: sampling_seed is read
  int64_t context_length = 0;  // the model's context in tokens (max_model_len); 0: unknown
  bool control_routes = true;  // vLLM: the dev-mode routes weft drives it by exist
  LogprobsKind logprobs = LogprobsKind::kUnknown;
  std::string logprobs_probe;  // why logprobs is kUnknown, when the probe was refused
};

struct ReplicaOptions {
  std::string url;                                    // http://HOST:PORT
  std::string api_key;                                // sent as a bearer token when not empty
  std::chrono::milliseconds request_timeout{600000};  // a generation
  std::chrono::milliseconds control_timeout{600000};  // a pause or resume
  std::chrono::milliseconds load_timeout{300000};     // the load of a checkpoint directory
  std::chrono::milliseconds health_timeout{5000};
};

class ReplicaApi {
 public:
  virtual ~ReplicaApi() = default;
  virtual const std::string& url() const = 0;
  // Ok when the replica answers its health route with 200.
  virtual Status Health() = 0;
  // The directory the replica loaded its current weights from.
  virtual Result<std::string> ModelPath() = 0;
  // The weight version the replica reports serving.
  virtual Result<std::string> WeightVersion() = 0;
  // The engine's release and the settings that shape requests (SGLang: GET /server_info, or
  // /get_server_info on older builds; vLLM: GET /version; both: max_model_len of /v1/models),
  // and what its logprobs are, probed by two one-token generations (after a resume: a replica is
  // read only while it serves no request of weft's, and one left paused would hold the probe).
  // Read once and kept (until ForgetInfo); Generate reads it first if it was not. Whether the
  // engine can work with weft is EngineApi::check's to say.
  virtual Result<ReplicaInfo> Info() = 0;
  // Forgets what Info read: the replica went away, and what answers next may be another build.
  virtual void ForgetInfo() = 0;
  // Pauses generation in `mode` (SGLang: abort, retract or in_place; vLLM: abort, wait or keep).
  virtual Status Pause(const std::string& mode) = 0;
  // Loads the checkpoint directory `dir` as `version` (while paused).
  virtual Status Load(const std::string& dir, const std::string& version) = 0;
  // `quick`: within the health timeout (the monitor's attempt to unstick a replica).
  virtual Status Resume(bool quick = false) = 0;
  // `n` samples of `prompt` in one request (the engine draws them; with n > 1 the seed is not
  // sent, as one seed would give SGLang n equal samples). The seed goes only where the engine
  // reads it (vLLM's seed; SGLang's sampling_seed under deterministic inference, within int32),
  // and the token limit is cut to what the context leaves after a prompt of token ids.
  virtual Result<std::vector<ReplicaOutput>> Generate(const Prompt& prompt,
                                                      const Sampling& sampling, int n) = 0;
  // The log-probability at temperature 1 of each token of `target` after `prompt` and the target's
  // tokens before it, in one prefill of prompt + target that generates nothing of use (SGLang:
  // /generate with max_new_tokens 0, return_logprob and logprob_start_len at the prompt's last
  // token, read from meta_info.input_token_logprobs; vLLM: /v1/completions with prompt_logprobs 0
  // and one token, read from choices[0].prompt_logprobs). The output's tokens are `target`, its
  // logprobs one per token; `aborted` (and no logprobs) when a pause ended the request, `version`
  // what SGLang reported. `prompt` must not be empty (its first token has no log-probability to
  // condition on), and prompt + target must leave one position in the context (kInvalidArgument
  // naming the lengths otherwise).
  virtual Result<ReplicaOutput> Score(const std::vector<int>& prompt,
                                      const std::vector<int>& target) = 0;
};

// One HTTP engine API, declared once: its name, its pause modes, how to reach a replica of it, and
// what it needs of a replica's release and settings. Adding an engine is one ReplicaApi class and
// one entry in EngineApis() (replica_api.cc); the worker's engine names, the configuration's pause
// modes and the checks before a load all come from here.
struct EngineApi {
  std::string name;                      // the run's `worker.engine`
  std::vector<std::string> pause_modes;  // engine.pause; the first is the default
  std::function<std::unique_ptr<ReplicaApi>(const ReplicaOptions&)> make;
  // Ok when a replica that says `info` of itself can serve weft with pause `mode`; else
  // kInvalidArgument naming the release or the setting it lacks.
  std::function<Status(const std::string& url, const ReplicaInfo& info, const std::string& mode)>
      check;

  // Ok when `mode` is one of pause_modes; else kInvalidArgument "<key>: 'x' is not a pause mode of
  // <name> (<modes>)".
  Status CheckPauseModeName(const std::string& mode, const std::string& key) const;
};

// Every HTTP engine API (sglang, vllm).
const std::vector<EngineApi>& EngineApis();
// The API named `name`: kInvalidArgument naming the known ones when there is none.
Result<const EngineApi*> FindEngineApi(const std::string& name);
// A replica of `api` at options.url (which must be http:// or https://).
Result<std::unique_ptr<ReplicaApi>> MakeReplicaApi(const EngineApi& api,
                                                   const ReplicaOptions& options);

// A release "0.5.6rc1" as (0, 5, 6); nullopt when it does not start with numbers.
std::optional<std::array<int, 3>> ParseRelease(const std::string& version);

}  // namespace weft::rollout_worker
