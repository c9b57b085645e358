// ReplicaApi: one serving-engine replica's HTTP API, as the HttpEngine (http_engine.h) drives it.
// Two implementations speak the engines' own routes, unmodified (docs/engines.md):
//   - SGLang: POST /generate, /pause_generation, /update_weights_from_disk, /continue_generation,
//     GET /model_info, /health.
//   - vLLM (OpenAI-compatible server with VLLM_SERVER_DEV_MODE=1): POST /v1/completions, /pause,
//     /collective_rpc (reload_weights), /reset_prefix_cache, /update_weight_version, /resume,
//     GET /weight_info, /v1/models, /health.
// Weight versions are the decimal version numbers as strings. Calls are thread-safe; errors say
// which replica and route failed: kUnavailable when the replica cannot be reached or answers 5xx,
// kInvalidArgument when it refuses a request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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

struct ReplicaOptions {
  std::string url;                                    // http://HOST:PORT
  std::string api_key;                                // sent as a bearer token when not empty
  std::chrono::milliseconds request_timeout{600000};  // a generation
  std::chrono::milliseconds control_timeout{600000};  // a pause, load or resume
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
  // Pauses generation in `mode` (SGLang: abort, retract or in_place; vLLM: abort, wait or keep).
  virtual Status Pause(const std::string& mode) = 0;
  // Loads the checkpoint directory `dir` as `version` (while paused).
  virtual Status Load(const std::string& dir, const std::string& version) = 0;
  // `quick`: within the health timeout (the monitor's attempt to unstick a replica).
  virtual Status Resume(bool quick = false) = 0;
  // `n` samples of `prompt` in one request (the engine draws them; with n > 1 the seed is not
  // sent, as one seed would give SGLang n equal samples).
  virtual Result<std::vector<ReplicaOutput>> Generate(const Prompt& prompt,
                                                      const Sampling& sampling, int n) = 0;
};

// The pause modes each API offers, first the default.
const std::vector<std::string>& PauseModes(const std::string& api);

// `api` is "sglang" or "vllm".
Result<std::unique_ptr<ReplicaApi>> MakeReplicaApi(const std::string& api,
                                                   const ReplicaOptions& options);

}  // namespace weft::rollout_worker
