// weft_fake_engine: the SGLang and vLLM test servers of tests/engines/fake_engine.h as a program,
// for end-to-end shell tests.
//
//   weft_fake_engine init --dir D [--vocab N --d-model N --layers N --heads N --d-ff N
//                                  --max-seq N --seed S --dtype bf16|f16|f32]
//       writes a freshly initialised model directory (config.json, model.safetensors).
//   weft_fake_engine serve --api sglang|vllm --model-path D [--port P] [--host H] [--api-key K]
//                          [--weight-version V] [--served-model-name N] [--weight-versions]
//                          [--no-dev-mode] [--token-delay-ms N]
//       prints "listening on PORT" once bound and serves until SIGTERM or SIGINT. Test switches
//       are set over HTTP: POST /_test/faults, GET|DELETE /_test/calls, GET /_test/state,
//       POST /_test/restart.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tests/engines/fake_engine.h"

namespace {

using weft::fake_engine::Api;

int Fail(const weft::Status& status) {
  std::fprintf(stderr, "weft_fake_engine: error: %s\n", status.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Blocked before any thread starts, so that every thread leaves them to sigwait below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  CLI::App app{"weft_fake_engine: SGLang and vLLM test servers for the example policy"};
  app.require_subcommand(1);

  CLI::App* init = app.add_subcommand("init", "Write a freshly initialised model directory");
  std::string dir;
  weft::examples::TinyLmConfig config;
  uint64_t seed = 1;
  std::string dtype_name = "bf16";
  init->add_option("--dir", dir, "The model directory to write")->required();
  init->add_option("--vocab", config.vocab, "Vocabulary size")->check(CLI::Range(16, 65536));
  init->add_option("--d-model", config.d_model, "Model width")->check(CLI::Range(4, 4096));
  init->add_option("--layers", config.layers, "Transformer blocks")->check(CLI::Range(1, 64));
  init->add_option("--heads", config.heads, "Attention heads")->check(CLI::Range(1, 64));
  init->add_option("--d-ff", config.d_ff, "MLP width")->check(CLI::Range(4, 65536));
  init->add_option("--max-seq", config.max_seq, "Context length")->check(CLI::Range(2, 4096));
  init->add_option("--seed", seed, "Initialisation seed");
  init->add_option("--dtype", dtype_name, "Weight format")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));

  CLI::App* serve = app.add_subcommand("serve", "Serve a model directory until SIGTERM");
  std::string api_name;
  weft::fake_engine::FakeEngineOptions options;
  bool no_dev_mode = false;
  int token_delay_ms = 0;
  serve->add_option("--api", api_name, "The API to speak")
      ->required()
      ->check(CLI::IsMember({"sglang", "vllm"}));
  serve->add_option("--model-path", options.model_path, "The model directory")->required();
  serve->add_option("--port", options.port, "Port (0: any free one)");
  serve->add_option("--host", options.host, "Address to listen on");
  serve->add_option("--api-key", options.api_key, "Bearer token required on all but /health*");
  serve->add_option("--weight-version", options.weight_version, "Weight version at launch");
  serve->add_option("--served-model-name", options.served_model_name,
                    "Model name (default: the model path)");
  serve->add_flag("--weight-versions", options.report_weight_versions,
                  "SGLang: report meta_info.weight_versions");
  serve->add_flag("--no-dev-mode", no_dev_mode, "vLLM: leave out the dev-mode routes");
  serve->add_option("--token-delay-ms", token_delay_ms, "Delay per generated token")
      ->check(CLI::Range(0, 600000));
  serve->add_option("--engine-version", options.engine_version,
                    "The release to report (default: SGLang 0.5.6, vLLM 0.16.0)");
  serve->add_flag("--deterministic-inference", options.deterministic_inference,
                  "SGLang: read sampling_seed (an int32), as --enable-deterministic-inference");
  bool disk_load_waits = false;
  serve->add_flag("--disk-load-waits", disk_load_waits,
                  "SGLang: a disk load under in_place or retract waits for the requests the pause "
                  "kept, as released SGLang does");
  bool past_context = false;
  serve->add_flag("--allow-past-context", past_context,
                  "Stop at the context instead of refusing a request that does not fit it");
  serve
      ->add_option("--reset-answers", options.reset_answers,
                   "vLLM: how /reset_prefix_cache answers a failed reset (empty, success, "
                   "conflict)")
      ->check(CLI::IsMember({"empty", "success", "conflict"}));
  serve
      ->add_option("--logprobs-mode", options.logprobs_mode,
                   "What logprobs are: raw_logprobs (temperature 1), processed_logprobs (after "
                   "temperature, SGLang's default) or raw_logits")
      ->check(CLI::IsMember({"raw_logprobs", "processed_logprobs", "raw_logits"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  options.refuse_past_context = !past_context;
  options.pause_aware_disk_load = !disk_load_waits;

  if (init->parsed()) {
    if (config.d_model % config.heads != 0)
      return Fail(weft::InvalidArgument("--d-model must be a multiple of --heads"));
    const weft::examples::TinyLmLayout layout(config);
    const weft::sync::DType dtype = dtype_name == "f32"   ? weft::sync::DType::kF32
                                    : dtype_name == "f16" ? weft::sync::DType::kF16
                                                          : weft::sync::DType::kBF16;
    weft::Status written =
        weft::fake_engine::WriteModelDirectory(dir, config, layout.Initialize(seed), dtype);
    if (!written.ok()) return Fail(written);
    std::printf("wrote %s (%zu parameters)\n", dir.c_str(), layout.size());
    return 0;
  }

  options.dev_mode = !no_dev_mode;
  options.token_delay = std::chrono::milliseconds(token_delay_ms);
  auto engine = weft::fake_engine::FakeEngine::Create(
      api_name == "sglang" ? Api::kSglang : Api::kVllm, options);
  if (!engine.ok()) return Fail(engine.status());
  std::printf("listening on %u\n", static_cast<unsigned>((*engine)->port()));
  std::fflush(stdout);
  int received = 0;
  sigwait(&stop, &received);
  return 0;
}
