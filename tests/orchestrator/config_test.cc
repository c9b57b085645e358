#include "orchestrator/config.h"
#include "tests/source_dir.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace weft::orchestrator {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  auto path =
      std::filesystem::temp_directory_path() / ("weft_" + name + "_" + std::to_string(getpid()));
  std::ofstream(path) << text;
  return path.string();
}

TEST_CASE("orchestrator config: the shipped example loads; values land where they belong") {
  auto config = LoadOrchestratorConfig(weft::testing::SourceDir() + "/configs/orchestrator.yaml");
  REQUIRE_MESSAGE(config.ok(), config.status().message());
  CHECK(config->service.server.port == 8090);
  CHECK(config->core.max_staleness == 2);
  CHECK(config->core.lease_duration == 60'000'000);
  CHECK(config->service.max_wait == std::chrono::milliseconds(30000));
  CHECK(config->service.server.max_body_bytes == uint64_t{16} << 20);
  setenv("WEFT_ADMIN_TOKEN", "from-the-environment", 1);
  CHECK(LoadOrchestratorConfig(weft::testing::SourceDir() + "/configs/orchestrator.yaml")
            ->service.admin_token == "from-the-environment");
  unsetenv("WEFT_ADMIN_TOKEN");
}

TEST_CASE(
    "orchestrator config: unknown keys, bad values and missing tokens are errors naming the key") {
  const std::string tokens = "  tokens: {worker: w, trainer: t, admin: a}\n";
  auto error = [&](const std::string& body) {
    const std::string path = Write("config", "orchestrator:\n" + body);
    auto config = LoadOrchestratorConfig(path);
    std::filesystem::remove(path);
    return config.ok() ? std::string("ok") : config.status().message();
  };
  CHECK(error(tokens) == "ok");
  CHECK(error(tokens + "  leases: 5s\n").find("orchestrator.leases: unknown key (line 3)") !=
        std::string::npos);
  CHECK(error(tokens + "  lease: soon\n")
            .find("orchestrator.lease (line 3): 'soon' is not a duration") != std::string::npos);
  CHECK(error(tokens + "  max_staleness: -1\n")
            .find("orchestrator.max_staleness: '-1' is not a non-negative integer") !=
        std::string::npos);
  CHECK(error(tokens + "  stale_policy: keep\n").find("not drop or deliver_flagged") !=
        std::string::npos);
  CHECK(error(tokens + "  listen: nowhere\n").find("is not ADDRESS:PORT") != std::string::npos);
  CHECK(error(tokens + "  dispatch: random\n")
            .find("orchestrator.dispatch: 'random' is not weighted or first_come") !=
        std::string::npos);
  CHECK(error(tokens + "  dispatch: first_come\n") == "ok");
  // A key given twice: an error naming both lines, so that rotating tokens by appending a block
  // never leaves the old ones valid.
  CHECK(error(tokens + "  tick: 1s\n" + "  tokens: {worker: w2, trainer: t2, admin: a2}\n")
            .find("orchestrator.tokens is given twice (lines 2 and 4)") != std::string::npos);
  CHECK(error("  tokens:\n    worker: w\n    trainer: t\n    admin: a\n    admin: b\n")
            .find("orchestrator.tokens.admin is given twice (lines 5 and 6)") != std::string::npos);
  CHECK(error(tokens + "  max_connections: 100\n") == "ok");
  CHECK(error("  run: x\n").find("tokens are all needed") != std::string::npos);
  CHECK(error(tokens + "  compact_after: 1KiB\n").find("compact_after must be at least 4KiB") !=
        std::string::npos);
  CHECK(error(tokens + "  compact_after: lots\n").find("orchestrator.compact_after") !=
        std::string::npos);
  CHECK(error(tokens + "  remember_done: 0\n").find("remember_done must be at least 1") !=
        std::string::npos);
  // Limits that would disable the server, and role tokens that would merge roles, are refused.
  CHECK(
      error(tokens + "  max_request_bytes: 0\n").find("max_request_bytes must be 64KiB to 31MiB") !=
      std::string::npos);
  CHECK(error(tokens + "  max_request_bytes: 64MiB\n").find("max_request_bytes must be") !=
        std::string::npos);
  CHECK(error(tokens + "  max_in_flight: 0\n").find("max_in_flight must be at least 1") !=
        std::string::npos);
  CHECK(error(tokens + "  max_wait: 0s\n").find("must be positive") != std::string::npos);
  CHECK(error(tokens + "  stall_after: 0s\n").find("must be positive") != std::string::npos);
  CHECK(error(tokens + "  lease: -5s\n") != "ok");
  CHECK(
      error("  tokens: {worker: same, trainer: t, admin: same}\n")
          .find(
              "orchestrator.tokens: the worker, trainer and admin tokens must all be different") !=
      std::string::npos);
  CHECK(error("  tokens: {worker: w, trainer: w, admin: a}\n").find("must all be different") !=
        std::string::npos);
  CHECK(error(tokens + "  tls: {cert: a.pem}\n")
            .find("orchestrator.tls: both cert and key are needed") != std::string::npos);
  CHECK(error(tokens + "  tls: {cert: a.pem, key: b.pem, ca: c}\n")
            .find("orchestrator.tls.ca: unknown key") != std::string::npos);
  {
    const std::string path =
        Write("config_tls", "orchestrator:\n" + tokens +
                                "  tls: {cert: a.pem, key: b.pem}\n  compact_after: 1MiB\n");
    auto config = LoadOrchestratorConfig(path);
    std::filesystem::remove(path);
    REQUIRE(config.ok());
    CHECK(config->service.server.tls_cert_file == "a.pem");
    CHECK(config->service.server.tls_key_file == "b.pem");
    CHECK(config->durable.compact_after_bytes == (1u << 20));
  }
  const std::string other = Write("config_other", "trainer:\n  lr: 1\n");
  CHECK(LoadOrchestratorConfig(other).status().message().find("trainer: unknown key") !=
        std::string::npos);
  std::filesystem::remove(other);
}

TEST_CASE("orchestrator dataset: JSONL prompts, errors with the line") {
  const std::string good =
      Write("prompts", "{\"prompt\": \"2+2=\", \"samples\": 4}\n\n{\"prompt\": [1, 2, 3]}\n");
  auto prompts = LoadPrompts(good);
  REQUIRE(prompts.ok());
  REQUIRE(prompts->size() == 2);
  CHECK((*prompts)[0].prompt == "\"2+2=\"");
  CHECK((*prompts)[0].samples == 4);
  CHECK((*prompts)[1].prompt == "[1,2,3]");
  const std::string bad = Write("prompts_bad", "{\"prompt\": \"a\"}\n{\"prompt\": [1, -2]}\n");
  CHECK(LoadPrompts(bad).status().message().find(
            ":2.prompt must be text or an array of token ids") != std::string::npos);
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
  // As strict as the trainers' reader: a key given twice is refused.
  const std::string twice = Write("prompts_twice", "{\"prompt\": \"a\", \"prompt\": \"b\"}\n");
  CHECK(LoadPrompts(twice).status().message().find(":1: not valid JSON: ") != std::string::npos);
  std::filesystem::remove(twice);
  // Bounded: /dev/zero is refused at the line limit, not read without end.
  CHECK(LoadPrompts("/dev/zero", LineLimits{4096, 1 << 20}).status().message() ==
        "/dev/zero:1: a line longer than 4096 bytes, the limit for the dataset");
  const std::string config = Write("config_limits",
                                   "orchestrator:\n  tokens: {worker: w, trainer: t, admin: a}\n"
                                   "  dataset_max_line: 64KiB\n  dataset_max_bytes: 1GiB\n");
  auto loaded = LoadOrchestratorConfig(config);
  REQUIRE(loaded.ok());
  CHECK(loaded->dataset_limits.max_line_bytes == 64 << 10);
  CHECK(loaded->dataset_limits.max_total_bytes == uint64_t{1} << 30);
  std::filesystem::remove(config);
}

TEST_CASE("orchestrator dataset: a row's metadata is kept as the line has it") {
  const std::string path = Write(
      "prompts_metadata",
      "{\"prompt\": \"2+2=\", \"metadata\": {\"answer\" : 4.0, \"row\": 1}}\n"
      "{\"metadata\": null, \"prompt\": \"x\"}\n{\"prompt\": \"y\", \"metadata\": [\"a\", 2]}\n");
  auto prompts = LoadPrompts(path);
  REQUIRE_MESSAGE(prompts.ok(), prompts.status().ToString());
  REQUIRE(prompts->size() == 3);
  CHECK((*prompts)[0].metadata == "{\"answer\" : 4.0, \"row\": 1}");
  CHECK((*prompts)[1].metadata.empty());
  CHECK((*prompts)[2].metadata == "[\"a\", 2]");
  const std::string big = Write("prompts_metadata_big", "{\"prompt\": \"a\", \"metadata\": \"" +
                                                            std::string(70000, 'm') + "\"}\n");
  CHECK(LoadPrompts(big).status().message().find(
            ":1.metadata is 70002 bytes of JSON text; at most 65536") != std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(big);
}

}  // namespace
}  // namespace weft::orchestrator
