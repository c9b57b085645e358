// libFuzzer target: the orchestrator's HTTP API (docs/api.md, "Orchestrator API"), in-process.
//
// One OrchestratorService over a DurableCore on a journal in a fresh directory, started once per
// process on 127.0.0.1 port 0 with the three role tokens; two clusters (fc0, fc1) registered at
// start-up, version 0 announced, both ready at it and a few jobs queued, so that leases and
// submissions are reachable. Inputs are sent as tests/fuzz/http_fuzz.h describes, over the
// endpoint table below. Structured bodies may hold placeholders the harness fills in from earlier
// answers: $J and $A the job and attempt of the last lease of the endpoint's cluster, $L the
// latest announced version, $N the one after it, $B the last batch handed out; a registration's
// answer replaces the token of its cluster.
//
// Besides what the harness checks (no 500, no silent close, /livez alive), every kRestartEvery
// inputs the service is stopped and the core's state compared with a core opened afresh from its
// journal and snapshots: replay must give exactly the state that was acknowledged (but the counts
// of refused and duplicate submissions, which are not journaled: durable_core.h). Then the
// orchestrator starts again from an empty directory, which also bounds the memory a run takes.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/logging.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/service.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/http_fuzz.h"

namespace weft::fuzz {
namespace {

using namespace std::string_literals;
using Json = nlohmann::json;
using orchestrator::CoreConfig;
using orchestrator::DurableCore;
using orchestrator::OrchestratorCore;
using orchestrator::OrchestratorService;

constexpr uint64_t kRestartEvery = 1024;
constexpr char kWorkerToken[] = "fuzz-worker-token";
constexpr char kTrainerToken[] = "fuzz-trainer-token";
constexpr char kAdminToken[] = "fuzz-admin-token";

const std::string kSamples =
    R"({"prompt": "1+1=", "samples": [{"tokens": [1, 2, 3], "logprobs": [-0.1, -0.2, -0.3], )"
    R"("reward": 1.0}]})";

std::string Submission(const std::string& cluster, const std::string& versions) {
  return R"({"job": $J, "attempt": $A, "cluster": ")" + cluster + "\", " + versions +
         R"(, "tokens": 3, "trajectories": )" + kSamples + "}";
}

std::vector<Endpoint> Endpoints() {
  const std::string sync =
      R"("sync": {"bytes_downloaded": 10, "pulls": 1, "keyframe_pulls": 1, "digest_mismatches": )"
      R"(0, "commits": 1, "max_pause_ms": 0.5, "first_version": 0, "newest_version": 1, )"
      R"("digest": "0123456789abcdef0123456789abcdef"})";
  const std::string one_version =
      R"("version_start": $L, "version_end": $L, "segments": [[$L, 0]])";
  const std::string two_versions =
      R"("version_start": 0, "version_end": $L, "segments": [[0, 0], [$L, 2]])";
  return {
      {"POST",
       "/v1/clusters",
       "worker",
       0,
       {R"({"cluster": "fc0", "region": "r0", "capacity": 4})",
        R"({"cluster": "fc1", "region": "r1", "capacity": 2})",
        R"({"cluster": "fc2", "region": "r0", "capacity": 1000000})"}},
      {"POST",
       "/v1/clusters/fc0/heartbeat",
       "fc0",
       0,
       {R"({"ready_version": $L})", R"({"ready_version": null})",
        R"({"ready_version": $L, )" + sync + "}"}},
      {"POST", "/v1/clusters/fc1/heartbeat", "fc1", 0, {R"({"ready_version": $L})"}},
      {"POST",
       "/v1/clusters/fc0/leases",
       "fc0",
       0,
       {"{}", R"({"max": 4})", R"({"max": 2, "wait_ms": 20, "request": 7})"}},
      {"POST", "/v1/clusters/fc1/leases", "fc1", 0, {R"({"max": 1, "request": 3})"}},
      {"POST", "/v1/clusters/fc0/drain", "fc0", 0, {"{}", R"({"jobs": [$J]})"}},
      {"DELETE", "/v1/clusters/fc1", "fc1", 0, {""}},
      {"POST",
       "/v1/clusters/fc0/submissions",
       "fc0",
       0,
       {Submission("fc0", one_version), Submission("fc0", two_versions)}},
      {"POST", "/v1/clusters/fc1/submissions", "fc1", 0, {Submission("fc1", one_version)}},
      {"POST", "/v1/submissions", "worker", 0, {Submission("fc1", one_version)}},
      {"POST", "/v1/versions", "trainer", 0, {R"({"version": $N})", R"({"version": $L})"}},
      {"POST",
       "/v1/jobs",
       "trainer",
       0,
       {R"({"prompts": [{"prompt": "12+34=", "samples": 2}]})",
        R"({"prompts": [{"prompt": [1, 2, 3]}, {"prompt": "x", "samples": 1}]})"}},
      {"POST",
       "/v1/batches",
       "trainer",
       0,
       {"{}", R"({"max": 4, "ack": null})", R"({"max": 0, "ack": $B})",
        R"({"max": 8, "wait_ms": 20, "ack": $B})"}},
      {"GET", "/v1/status", "trainer", 0, {""}},
      {"GET", "/metrics", "", 0, {""}},
      {"GET", "/readyz", "", 0, {""}},
      {"DELETE", "/v1/clusters/fc0", "fc0", 0, {""}},
      {"POST", "/v1/clusters/", "fc0", 0, {"fc0/heartbeat\0\0{}"s, "fc0/x\0\0{}"s}},
  };
}

std::vector<std::string> RawSeeds() {
  auto request = [](const std::string& head, const std::string& body) {
    return head + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  return {
      "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kAdminToken) +
          "\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
      request("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                  std::string(kTrainerToken),
              R"({"prompts": [{"prompt": "1+2="}]})"),
      "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kTrainerToken) +
          "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n0\r\n\r\n",
      "POST /v1/versions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
          std::string(kTrainerToken) + "\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
  };
}

// The orchestrator under test and what the harness learnt from its answers.
struct Orchestrator {
  std::string dir, journal;
  CoreConfig config;
  DurableCore::Options durable;
  std::unique_ptr<DurableCore> core;
  std::unique_ptr<OrchestratorService> service;
  std::map<std::string, std::string> cluster_tokens;
  std::map<std::string, std::pair<uint64_t, uint32_t>> last_lease;  // per cluster
  uint64_t latest = 0, last_batch = 0;
  uint64_t inputs = 0;
};

Orchestrator& The() {
  static Orchestrator* orchestrator = new Orchestrator();  // outlives the exit handlers
  return *orchestrator;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "\n==== weft fuzz finding: %s\n", what.c_str());
  std::abort();
}

Target& TheTarget();

void StartService() {
  Orchestrator& o = The();
  orchestrator::ServiceOptions options;
  options.worker_token = kWorkerToken;
  options.trainer_token = kTrainerToken;
  options.admin_token = kAdminToken;
  options.tick_interval = std::chrono::milliseconds(50);
  options.max_wait = std::chrono::milliseconds(100);
  options.server.threads = 2;
  options.server.read_timeout = std::chrono::seconds(5);
  Result<std::unique_ptr<OrchestratorService>> service =
      OrchestratorService::Start(*o.core, options);
  if (!service.ok()) Fail("the orchestrator does not start: " + service.status().message());
  o.service = std::move(service).value();
}

// A fresh orchestrator in an empty directory, with two clusters ready at version 0 and jobs.
void StartFresh() {
  Orchestrator& o = The();
  o.dir = FreshDirectory("orchestrator_http");
  o.journal = o.dir + "/journal";
  o.durable.compact_after_bytes = 256 << 10;  // compactions happen within a run
  Result<std::unique_ptr<DurableCore>> core = DurableCore::Open(o.journal, o.config, o.durable);
  if (!core.ok()) Fail("the journal does not open: " + core.status().message());
  o.core = std::move(core).value();
  StartService();
  o.cluster_tokens.clear();
  o.last_lease.clear();
  o.latest = o.last_batch = 0;
  const Target& target = TheTarget();
  auto send = [&](size_t endpoint, const std::string& body) {
    const std::string input = StructuredInput(endpoint, body);
    RunInput(target, reinterpret_cast<const uint8_t*>(input.data()), input.size());
  };
  send(0, R"({"cluster": "fc0", "region": "r0", "capacity": 4})");
  send(0, R"({"cluster": "fc1", "region": "r1", "capacity": 2})");
  send(9, R"({"version": 0})");
  send(1, R"({"ready_version": 0})");
  send(2, R"({"ready_version": 0})");
  send(10, R"({"prompts": [{"prompt": "1+1=", "samples": 1}, {"prompt": [5, 6], "samples": 2}]})");
  if (o.cluster_tokens.size() != 2) Fail("the clusters could not register at start-up");
}

// The snapshot's state document without the counters that are not journaled, and its samples.
std::pair<Json, std::string> Journaled(const std::string& snapshot) {
  const size_t newline = snapshot.find('\n');
  Json doc = Json::parse(snapshot.substr(0, newline));
  doc["counters"].erase("submissions_rejected");
  doc["counters"].erase("submissions_duplicate");
  return {doc, snapshot.substr(newline + 1)};
}

// Stops the service, checks that replaying the journal gives the state it left, and starts again
// from nothing.
void CheckReplayAndRestart() {
  Orchestrator& o = The();
  o.service->Stop();
  o.service.reset();
  const std::string before =
      o.core->Inspect([](const OrchestratorCore& core) { return core.Snapshot(); });
  const uint64_t generation = o.core->generation();
  o.core.reset();
  Result<std::unique_ptr<DurableCore>> reopened = DurableCore::Open(o.journal, o.config, o.durable);
  if (!reopened.ok())
    Fail("the orchestrator's own journal (generation " + std::to_string(generation) +
         ") does not open again: " + reopened.status().message());
  const std::string after =
      (*reopened)->Inspect([](const OrchestratorCore& core) { return core.Snapshot(); });
  if (Journaled(before) != Journaled(after)) {
    Fail("replaying the journal (generation " + std::to_string(generation) +
         ") does not give the state acknowledged before the stop:\n---- before:\n" +
         before.substr(0, 8192) + "\n---- after:\n" + after.substr(0, 8192));
  }
  reopened->reset();
  std::filesystem::remove_all(o.dir);
  StartFresh();
}

void Expand(const Endpoint& endpoint, std::string* path, std::string* body) {
  const Orchestrator& o = The();
  auto lease = o.last_lease.find(endpoint.token);
  const std::pair<uint64_t, uint32_t> job =
      lease == o.last_lease.end() ? std::pair<uint64_t, uint32_t>{1, 1} : lease->second;
  const std::pair<const char*, std::string> values[] = {
      {"$J", std::to_string(job.first)},    {"$A", std::to_string(job.second)},
      {"$L", std::to_string(o.latest)},     {"$N", std::to_string(o.latest + 1)},
      {"$B", std::to_string(o.last_batch)},
  };
  for (std::string* text : {path, body}) {
    for (const auto& [name, value] : values) {
      for (size_t at = text->find(name); at != std::string::npos; at = text->find(name, at))
        text->replace(at, 2, value);
    }
  }
}

// Learns tokens, leases, the latest version and batch ids from successful answers (only tokens
// from the answers to raw requests, whose endpoint is unknown).
void Observe(const Endpoint* endpoint, const Answer& answer) {
  if (answer.status != 200) return;
  Orchestrator& o = The();
  const Json body = Json::parse(answer.Body(), nullptr, false);
  if (!body.is_object()) return;
  if (body.contains("cluster_token") && body["cluster_token"].is_string() &&
      body.contains("cluster") && body["cluster"].is_string()) {
    o.cluster_tokens[body["cluster"].get<std::string>()] = body["cluster_token"];
  }
  if (endpoint == nullptr) return;
  if (endpoint->path.ends_with("/leases") && body.contains("leases") && body["leases"].is_array() &&
      !body["leases"].empty()) {
    const Json& first = body["leases"][0];
    if (first.contains("job") && first["job"].is_number_unsigned() && first.contains("attempt") &&
        first["attempt"].is_number_unsigned())
      o.last_lease[endpoint->token] = {first["job"].get<uint64_t>(),
                                       first["attempt"].get<uint32_t>()};
  }
  if (endpoint->path == "/v1/versions" && body.contains("version") &&
      body["version"].is_number_unsigned())
    o.latest = body["version"].get<uint64_t>();
  if (body.contains("batch") && body["batch"].is_number_unsigned() && body["batch"] != 0)
    o.last_batch = body["batch"].get<uint64_t>();
}

std::string Token(const std::string& role) {
  if (role == "worker") return kWorkerToken;
  if (role == "trainer") return kTrainerToken;
  if (role == "admin") return kAdminToken;
  auto found = The().cluster_tokens.find(role);
  return found == The().cluster_tokens.end() ? "" : found->second;
}

Target& TheTarget() {
  static Target* target = new Target{
      "orchestrator_http_fuzz",
      Endpoints(),
      [](int) { return The().service->port(); },
      Token,
      Expand,
      Observe,
      [] { CheckAlive(The().service->port(), "the orchestrator"); },
      RawSeeds(),
  };
  return *target;
}

void StopAtExit() {
  Orchestrator& o = The();
  if (o.service) o.service->Stop();
  o.service.reset();
  o.core.reset();
  std::filesystem::remove_all(o.dir);
}

}  // namespace
}  // namespace weft::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace weft::fuzz;
  const std::string seeds = SeedDirectoryArgument(*argc, *argv);
  if (!seeds.empty()) WriteSeedsAndExit(seeds, SeedsOf(TheTarget()));
  weft::SetLogLevel(weft::LogLevel::kError);
  StartFresh();
  std::atexit(StopAtExit);
  CountAnswersAtExit("orchestrator_http_fuzz");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::fuzz;
  if (++The().inputs % kRestartEvery == 0) CheckReplayAndRestart();
  RunInput(TheTarget(), data, size);
  return 0;
}
