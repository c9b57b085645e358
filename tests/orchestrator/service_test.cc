#include "orchestrator/service.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "orchestrator/client.h"
#include "orchestrator/wire.h"
#include "tests/http_test_util.h"
#include "tests/orchestrator_test_util.h"
#include "tests/temp_path.h"
#include "tests/tls_test_util.h"

namespace weft::orchestrator {
namespace {

using Json = nlohmann::json;
using Running = testing::RunningOrchestrator;
using testing::Raw;

TEST_CASE("orchestrator API: the whole loop over loopback, as documented") {
  Running o;
  auto [code, body] = o.Post("t-token", "/v1/versions", {{"version", 0}});
  REQUIRE(code == 200);
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c1"}, {"region", "eu"}, {"capacity", 2}})
              .first == 200);
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 200);
  // Sync counters ride on heartbeats and show per cluster and per region.
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat",
                 {{"ready_version", 0},
                  {"sync",
                   {{"bytes_downloaded", 123456789012},
                    {"pulls", 1},
                    {"keyframe_pulls", 1},
                    {"max_pause_ms", 0.5},
                    {"loading_replicas", 1},
                    {"paused_ms_total", 2500.0},
                    {"replicas",
                     {{{"url", "http://10.0.0.1:30000"},
                       {"state", "loading"},
                       {"version", 0},
                       {"loads", 3},
                       {"failures", 1},
                       {"last_pause_ms", 12.5},
                       {"paused_ms_total", 2000.0}},
                      {{"url", "http://10.0.0.2:30000"},
                       {"state", "ready"},
                       {"version", 0},
                       {"loads", 4},
                       {"paused_ms_total", 500.0}}}}}}})
              .first == 200);
  // A replica's report that is wrong is refused, naming the field.
  const Json bad_replica = {{"ready_version", 0},
                            {"sync", {{"replicas", {{{"url", "http://a:1"}, {"state", "lost"}}}}}}};
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", bad_replica).second["error"] ==
        "heartbeat.sync.replicas[0].state is not ready, loading or down");
  const Json no_url = {{"ready_version", 0},
                       {"sync", {{"replicas", {{{"url", ""}, {"state", "down"}}}}}}};
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", no_url)
            .second["error"]
            .get<std::string>()
            .find("heartbeat.sync.replicas[0].url must be 1 to 1024 bytes") != std::string::npos);
  const Json negative = {
      {"ready_version", 0},
      {"sync",
       {{"replicas", {{{"url", "http://a:1"}, {"state", "down"}, {"last_pause_ms", -2}}}}}}};
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", negative).second["error"] ==
        "heartbeat.sync.replicas[0].last_pause_ms is not a non-negative number");
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat",
               {{"ready_version", 0}, {"sync", {{"paused_ms_total", -1}}}})
            .second["error"] == "heartbeat.sync.paused_ms_total is not a non-negative number");
  {
    // The pause state per cluster in /metrics.
    const std::string metrics = Raw(o.url + "/metrics", "GET").text();
    CHECK(metrics.find("weft_orchestrator_cluster_loading_replicas{cluster=\"c1\"} 1\n") !=
          std::string::npos);
    CHECK(metrics.find("weft_orchestrator_cluster_paused_seconds_total{cluster=\"c1\"} 2.5\n") !=
          std::string::npos);
    // Large counters as integers.
    CHECK(
        metrics.find("weft_orchestrator_cluster_sync_bytes_total{cluster=\"c1\"} 123456789012\n") !=
        std::string::npos);
    // And per replica.
    const std::string first = "{cluster=\"c1\",replica=\"http://10.0.0.1:30000\"} ";
    const std::string second = "{cluster=\"c1\",replica=\"http://10.0.0.2:30000\"} ";
    for (const std::string& line :
         {"weft_orchestrator_replica_loading" + first + "1\n",
          "weft_orchestrator_replica_ready" + first + "0\n",
          "weft_orchestrator_replica_ready" + second + "1\n",
          "weft_orchestrator_replica_version" + second + "0\n",
          "weft_orchestrator_replica_loads_total" + first + "3\n",
          "weft_orchestrator_replica_failures_total" + first + "1\n",
          "weft_orchestrator_replica_paused_seconds_total" + first + "2\n",
          "weft_orchestrator_replica_paused_seconds_total" + second + "0.5\n"}) {
      CAPTURE(line);
      CHECK(metrics.find(line) != std::string::npos);
    }
  }
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat",
               {{"ready_version", 0}, {"sync", {{"pulls", -1}}}})
            .second["error"] == "heartbeat.sync.pulls is not a non-negative integer");
  {
    const Json status = o.Post("a-token", "/v1/status", {}, "GET").second;
    CHECK(status["regions"]["eu"]["sync"]["bytes_downloaded"] == 123456789012);
    CHECK(status["regions"]["eu"]["sync"]["digest_mismatches"] == 0);
    CHECK(status["clusters"][0]["sync"]["keyframe_pulls"] == 1);
    CHECK(status["clusters"][0]["sync"]["loading_replicas"] == 1);
    CHECK(status["clusters"][0]["sync"]["paused_ms_total"] == 2500.0);
    CHECK(status["regions"]["eu"]["sync"]["paused_ms_total"] == 2500.0);
    const Json& replicas = status["clusters"][0]["sync"]["replicas"];
    REQUIRE(replicas.size() == 2);
    CHECK(replicas[0]["url"] == "http://10.0.0.1:30000");
    CHECK(replicas[0]["state"] == "loading");
    CHECK(replicas[0]["version"] == 0);
    CHECK(replicas[0]["last_pause_ms"] == 12.5);
    CHECK(replicas[1]["state"] == "ready");
    CHECK(replicas[1]["failures"] == 0);
    CHECK(!status["regions"]["eu"]["sync"].contains("replicas"));  // a region sums, not lists
    Result<wire::StatusPage> page = wire::DecodeStatusPage(status.dump(), "status");
    REQUIRE_MESSAGE(page.ok(), page.status().ToString());
    CHECK(page->clusters.at(0).sync->replicas.size() == 2);
    CHECK(page->regions.at("eu").sync.paused_ms_total == 2500.0);
  }
  // Two clusters proving the same version with different state digests: an alert names them.
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c2"}, {"region", "us"}, {"capacity", 1}})
              .first == 200);
  REQUIRE(o.Post(o.As("c2"), "/v1/clusters/c2/heartbeat",
                 {{"ready_version", 0}, {"sync", {{"newest_version", 0}, {"digest", "bb"}}}})
              .first == 200);
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat",
                 {{"ready_version", 0}, {"sync", {{"newest_version", 0}, {"digest", "aa"}}}})
              .first == 200);
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat",
               {{"ready_version", 0}, {"sync", {{"digest", "XYZ"}}}})
            .second["error"] == "heartbeat.sync.digest is not a hex digest of at most 64 digits");
  {
    const Json alerts = o.Post("a-token", "/v1/status", {}, "GET").second["alerts"];
    bool named = false;
    for (const Json& a : alerts)
      named |=
          a.get<std::string>() == "clusters ready at version 0 serve different states: c1 aa c2 bb";
    CHECK(named);
  }
  REQUIRE(o.Post(o.As("c2"), "/v1/clusters/c2/heartbeat",
                 {{"ready_version", 0}, {"sync", {{"newest_version", 0}, {"digest", "aa"}}}})
              .first == 200);
  REQUIRE(o.Post(o.As("c2"), "/v1/clusters/c2", {}, "DELETE").first == 200);
  // A long poll for leases waits until the trainer adds jobs.
  auto waiting = std::async(std::launch::async, [&] {
    return o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 2}, {"wait_ms", 5000}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto added =
      o.Post("t-token", "/v1/jobs",
             {{"prompts", {{{"prompt", "2+2="}, {"samples", 4}}, {{"prompt", {1, 2, 3}}}}}});
  REQUIRE(added.first == 200);
  REQUIRE(added.second["jobs"].size() == 2);
  auto [lease_code, leases] = waiting.get();
  REQUIRE(lease_code == 200);
  REQUIRE(leases["leases"].size() >= 1);
  const Json lease = leases["leases"][0];
  CHECK(lease["prompt"] == "\"2+2=\"");
  CHECK(lease["samples"] == 4);
  Json submission = {{"job", lease["job"]}, {"attempt", lease["attempt"]},
                     {"cluster", "c1"},     {"version_start", 0},
                     {"version_end", 0},    {"segments", {{0, 0}}},
                     {"tokens", 12},        {"trajectories", {{"text", "4"}, {"reward", 1.0}}}};
  auto [submit_code, submitted] = o.Post(o.As("c1"), "/v1/clusters/c1/submissions", submission);
  REQUIRE(submit_code == 200);
  CHECK(submitted["result"] == "accepted");
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/submissions", submission).second["result"] ==
        "duplicate");
  // Calls naming a cluster need its own token: the shared worker token, or another cluster's
  // token, may not act for it.
  CHECK(o.Post("w-token", "/v1/submissions", submission).first == 403);
  CHECK(o.Post("w-token", "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 403);
  CHECK(o.Post("w-token", "/v1/clusters/c1/drain", Json::object()).first == 403);
  CHECK(o.Post("w-token", "/v1/clusters/c1", {}, "DELETE").first == 403);
  CHECK(o.Post(o.As("c2"), "/v1/clusters/c1/leases", {{"max", 1}}).first == 401);
  CHECK(o.Post("not-a-token", "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 401);
  CHECK(o.Post("a-token", "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 200);
  auto [batch_code, batch] = o.Post("t-token", "/v1/batches", {{"max", 8}});
  REQUIRE(batch_code == 200);
  REQUIRE(batch["trajectories"].size() == 1);
  CHECK(batch["trajectories"][0]["trajectories"]["reward"] == 1.0);
  CHECK(batch["trajectories"][0]["stale"] == false);
  // Status and metrics show it.
  auto status = Raw(o.url + "/v1/status", "GET", {"Authorization: Bearer a-token"});
  REQUIRE(status.status == 200);
  Json s = Json::parse(status.text());
  CHECK(s["latest_version"] == 0);
  CHECK(s["trajectories"]["accepted"] == 1);
  CHECK(s["trajectories"]["duplicate"] == 1);
  CHECK(s["clusters"][0]["state"] == "ready");
  CHECK(s["regions"]["eu"]["ready"] == 1);
  // The body is the wire layer's status page: it decodes, and encodes again to the same text.
  Result<wire::StatusPage> page = wire::DecodeStatusPage(status.text(), "status");
  REQUIRE_MESSAGE(page.ok(), page.status().ToString());
  CHECK(wire::Encode(*page) == status.text());
  CHECK(page->trajectories.accepted == 1);
  REQUIRE(page->clusters.size() == 2);
  CHECK(page->clusters[0].id == "c1");
  REQUIRE(page->clusters[0].sync.has_value());
  CHECK(page->clusters[0].sync->digest == "aa");  // its last report
  CHECK(page->clusters[1].state == "gone");
  CHECK(page->regions.at("us").clusters == 1);
  CHECK(page->regions.at("us").ready == 0);
  // As the client reads it.
  Result<wire::StatusPage> read = OrchestratorClient(o.url, "a-token").GetStatus();
  REQUIRE_MESSAGE(read.ok(), read.status().ToString());
  CHECK(read->trajectories.duplicate == 1);
  auto metrics = Raw(o.url + "/metrics", "GET");
  CHECK(metrics.status == 200);
  CHECK(metrics.text().find("weft_orchestrator_submissions_accepted_total 1") != std::string::npos);
  CHECK(metrics.text().find(
            "weft_orchestrator_cluster_ready_version{cluster=\"c1\",region=\"eu\"} 0") !=
        std::string::npos);
  CHECK(Raw(o.url + "/livez", "GET").status == 200);
  CHECK(Raw(o.url + "/readyz", "GET").status == 200);
}

TEST_CASE("orchestrator API over TLS: a client trusting the certificate works; the job loop runs") {
  const std::string dir = testing::TempPath("orchestrator_tls");
  std::filesystem::create_directories(dir);
  const testing::TestCertificate cert = testing::MakeCertificate(dir, "orchestrator");
  Running o({}, 0, &cert);
  HttpClientOptions options;
  options.ca_file = cert.cert;
  options.deadline = std::chrono::milliseconds(5000);
  OrchestratorClient trainer(o.url, "t-token", options), worker(o.url, "w-token", options);
  REQUIRE(trainer.AnnounceVersion(0).ok());
  REQUIRE(worker.Register("c1", "eu", 2).ok());
  REQUIRE(worker.Heartbeat("c1", 0).ok());
  REQUIRE(trainer.AddJobs({{Json("1+1="), 1}}).ok());
  auto leases = worker.RequestLeases("c1", 2, std::chrono::milliseconds(2000));
  REQUIRE_MESSAGE(leases.ok(), leases.status().ToString());
  CHECK(leases->leases.size() == 1);
  auto status = trainer.GetStatus();
  REQUIRE(status.ok());
  CHECK(status->jobs.leased == 1);
  // Without the certificate the client refuses the server, at once and saying why.
  HttpClientOptions untrusting;
  untrusting.deadline = std::chrono::milliseconds(5000);
  auto refused = OrchestratorClient(o.url, "t-token", untrusting).GetStatus();
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("certificate") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("orchestrator API: a lease request repeated with its id gets the same leases") {
  Running o;
  REQUIRE(o.Post("t-token", "/v1/versions", {{"version", 0}}).first == 200);
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c1"}, {"region", "eu"}, {"capacity", 4}})
              .first == 200);
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 200);
  REQUIRE(o.Post("t-token", "/v1/jobs",
                 {{"prompts", {{{"prompt", "a"}}, {{"prompt", "b"}}, {{"prompt", "c"}}}}})
              .first == 200);
  auto first = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 2}, {"request", 9}});
  auto again = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 2}, {"request", 9}});
  REQUIRE(first.first == 200);
  REQUIRE(first.second["leases"].size() == 2);
  CHECK(again.second["leases"] == first.second["leases"]);
  CHECK(o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 2}, {"request", "x"}}).first == 400);
  auto status = o.Post("a-token", "/v1/status", {}, "GET");
  CHECK(status.second["jobs"]["leased"] == 2);
}

TEST_CASE(
    "orchestrator API: lease answers tell the latest version; an announcement leaves parked polls "
    "in their place") {
  Running o;
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c1"}, {"region", "eu"}, {"capacity", 4}})
              .first == 200);
  auto none = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 1}});
  REQUIRE(none.first == 200);
  CHECK(!none.second.contains("latest_version"));  // nothing announced yet
  REQUIRE(o.Post("t-token", "/v1/versions", {{"version", 3}}).first == 200);
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", {{"ready_version", 3}}).first == 200);
  auto now = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 1}});
  REQUIRE(now.first == 200);
  CHECK(now.second["leases"].empty());
  CHECK(now.second["latest_version"] == 3);
  // A parked poll is not ended by the announcement (answering it without a lease would send its
  // worker to the back of the queue just before the step's jobs arrive); it is answered with the
  // job added later, and tells of the new version then.
  const auto t0 = std::chrono::steady_clock::now();
  std::pair<int, Json> parked;
  double answered_after = 0;
  std::thread poll([&] {
    parked = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"wait_ms", 5000}});
    answered_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(o.Post("t-token", "/v1/versions", {{"version", 4}}).first == 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(o.Post("t-token", "/v1/jobs", {{"prompts", {{{"prompt", "a"}}}}}).first == 200);
  poll.join();
  REQUIRE(parked.first == 200);
  CHECK(parked.second["leases"].size() == 1);
  CHECK(parked.second["latest_version"] == 4);
  CHECK(answered_after >= 0.55);
}

TEST_CASE("orchestrator API: tokens and roles, malformed and oversized requests") {
  Running o;
  CHECK(o.Post("", "/v1/versions", {{"version", 1}}).first == 401);
  CHECK(o.Post("guess", "/v1/versions", {{"version", 1}}).first == 401);
  CHECK(o.Post("w-token", "/v1/versions", {{"version", 1}}).first ==
        403);  // a worker cannot announce
  CHECK(o.Post("t-token", "/v1/clusters", {{"cluster", "x"}, {"region", "r"}, {"capacity", 1}})
            .first == 403);
  CHECK(o.Post("a-token", "/v1/versions", {{"version", 1}}).first == 200);  // admin may
  CHECK(Raw(o.url + "/v1/status", "GET").status == 401);
  auto bad = Raw(o.url + "/v1/versions", "POST", {"Authorization: Bearer t-token"}, "{not json");
  CHECK(bad.status == 400);
  CHECK(bad.text().find("not valid JSON") != std::string::npos);
  auto [code, body] = o.Post("t-token", "/v1/versions", {{"version", -3}});
  CHECK(code == 400);
  CHECK(body["error"] == "version.version is not a non-negative integer");
  CHECK(o.Post("t-token", "/v1/versions", {{"version", 1}, {"extra", 1}}).second["error"] ==
        "version has an unknown field 'extra'");
  CHECK(o.Post("t-token", "/v1/versions", {{"version", 0}}).first ==
        400);  // versions only move forward
  CHECK(o.Post("w-token", "/v1/clusters", {{"cluster", "c"}, {"region", "r"}}).second["error"] ==
        "cluster lacks the field 'capacity'");
  CHECK(o.Post("w-token", "/v1/clusters/nobody/heartbeat", {{"ready_version", nullptr}}).first ==
        404);
  Json submission = {{"job", 1},           {"attempt", 1},           {"cluster", "c"},
                     {"version_start", 0}, {"version_end", 0},       {"segments", {{0}}},
                     {"tokens", 1},        {"trajectories", nullptr}};
  CHECK(o.Post("w-token", "/v1/submissions", submission).second["error"] ==
        "submission.segments[0] is not a [version, first_token] pair");
  auto huge = Raw(o.url + "/v1/jobs", "POST", {"Authorization: Bearer t-token"},
                  std::string((1 << 20) + 100, ' '));
  CHECK(huge.status == 413);
  CHECK(Raw(o.url + "/v1/nothing", "GET", {"Authorization: Bearer a-token"}).status == 404);
  CHECK(Raw(o.url + "/v1/status?x=1", "GET", {"Authorization: Bearer a-token"}).status == 400);
  // Names: one strict rule, so nothing odd reaches a URL, a log line or /metrics.
  for (const std::string bad : {"a\"b", "x\n# TYPE evil gauge\nevil 1", "a/b", "a b", ""}) {
    CAPTURE(bad);
    CHECK(o.Post("w-token", "/v1/clusters", {{"cluster", bad}, {"region", "r"}, {"capacity", 1}})
              .first == 400);
    CHECK(o.Post("w-token", "/v1/clusters", {{"cluster", "ok"}, {"region", bad}, {"capacity", 1}})
              .first == 400);
  }
  // A cluster id in the path follows the same rule (and bytes that are not UTF-8 come back
  // replaced in the error, never as a failure of the server).
  auto odd =
      Raw(o.url + "/v1/clusters/fc1%7Bf/heartbeat", "POST", {"Authorization: Bearer a-token"});
  CHECK(odd.status == 400);
  auto bytes = Raw(o.url + "/v1/clusters/fc1{f\x81", "DELETE", {"Authorization: Bearer a-token"});
  CHECK(bytes.status == 400);
  const std::string metrics = Raw(o.url + "/metrics", "GET", {}).text();
  CHECK(metrics.find("evil") == std::string::npos);
  CHECK(Raw(o.url + "/metrics", "POST", {}).status == 405);
  CHECK(Raw(o.url + "/livez", "DELETE", {}).status == 405);
  CHECK(Raw(o.url + "/readyz", "PUT", {}).status == 405);
  // Versions: bounded, and no cluster may claim one that was never announced.
  CHECK(o.Post("t-token", "/v1/versions", {{"version", 9007199254740992ull}}).first == 400);
  CHECK(o.Post("t-token", "/v1/versions", {{"version", 18446744073709551615ull}}).first == 400);
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "v"}, {"region", "r"}, {"capacity", 1}})
              .first == 200);
  auto claim = o.Post(o.As("v"), "/v1/clusters/v/heartbeat", {{"ready_version", 2}});
  CHECK(claim.first == 409);
  CHECK(claim.second["error"].get<std::string>().find("never announced") != std::string::npos);
  // Repeated keys and deep nesting are refused, and cost nothing to refuse.
  auto repeated = Raw(o.url + "/v1/versions", "POST", {"Authorization: Bearer t-token"},
                      R"({"version": 1, "version": 5})");
  CHECK(repeated.status == 400);
  CHECK(repeated.text().find("a key repeated") != std::string::npos);
  auto deep = Raw(o.url + "/v1/submissions", "POST", {"Authorization: Bearer w-token"},
                  std::string(500000, '['));
  CHECK(deep.status == 400);
  CHECK(deep.text().find("nested more than 64 deep") != std::string::npos);
  // Bodies of the small endpoints are refused above a megabyte, before they are parsed.
  auto big_heartbeat =
      Raw(o.url + "/v1/clusters/v/heartbeat", "POST", {"Authorization: Bearer " + o.As("v")},
          "{\"ready_version\": null" + std::string(1 << 20, ' ') + "}");
  CHECK(big_heartbeat.status == 413);
  CHECK(o.core->Inspect([](const OrchestratorCore& c) { return c.latest_version(); }) ==
        std::optional<uint64_t>(1));
}

TEST_CASE("orchestrator API: tokens are checked from the header, before any body is read") {
  Running o;
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c1"}, {"region", "r"}, {"capacity", 1}})
              .first == 200);
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c2"}, {"region", "r"}, {"capacity", 1}})
              .first == 200);
  // A header that announces 15 MiB and sends none of it: a refused token is answered at once
  // (reading the body first would wait for it until the read deadline).
  auto answered_at_once = [&](const std::string& method_path, const std::string& token) {
    testing::RawConnection connection(testing::PortOf(o.url), std::chrono::seconds(3));
    connection.Send(method_path + " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + token +
                    "\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(15 << 20) + "\r\n\r\n{");
    return testing::StatusOf(connection.ReadSome());
  };
  CHECK(answered_at_once("POST /v1/submissions", "junk") == 401);
  CHECK(answered_at_once("POST /v1/clusters/c1/submissions", "junk") == 401);
  CHECK(answered_at_once("POST /v1/clusters/c1/submissions", o.As("c2")) == 401);
  CHECK(answered_at_once("POST /v1/clusters/c1/heartbeat", "junk") == 401);
  CHECK(answered_at_once("POST /v1/clusters/c1/submissions", "w-token") == 403);
  CHECK(answered_at_once("POST /v1/jobs", "w-token") == 403);
  CHECK(answered_at_once("POST /v1/jobs", "") == 401);
  CHECK(answered_at_once("POST /v1/clusters", "t-token") == 403);
  // A cluster's own token on the shared endpoint is told where it goes.
  auto shared = o.Post(o.As("c1"), "/v1/submissions", Json::object());
  CHECK(shared.first == 401);
  CHECK(shared.second["error"].get<std::string>().find("/v1/clusters/<cluster>/submissions") !=
        std::string::npos);
  // The path's cluster is the submission's.
  Json submission = {{"job", 1},           {"attempt", 1},           {"cluster", "c2"},
                     {"version_start", 0}, {"version_end", 0},       {"segments", {{0, 0}}},
                     {"tokens", 1},        {"trajectories", nullptr}};
  auto other = o.Post(o.As("c1"), "/v1/clusters/c1/submissions", submission);
  CHECK(other.first == 400);
  CHECK(other.second["error"] == "submission.cluster is c2, but the path is for cluster c1");
  CHECK(o.core->Inspect(
            [](const OrchestratorCore& c) { return c.counters().submissions_rejected; }) == 0);
}

TEST_CASE("orchestrator API: a wrong method is 405 with the methods allowed, wherever it is") {
  Running o;
  auto answer = [&](const std::string& method_path) {
    testing::RawConnection connection(testing::PortOf(o.url), std::chrono::seconds(2));
    connection.Send(method_path +
                    " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer a-token\r\n"
                    "Connection: close\r\n\r\n");
    return connection.ReadAll();
  };
  for (const auto& [method_path, allow] : std::vector<std::pair<std::string, std::string>>{
           {"GET /v1/clusters", "POST"},
           {"PUT /v1/clusters", "POST"},
           {"DELETE /v1/clusters", "POST"},
           {"GET /v1/clusters/c1/heartbeat", "POST"},
           {"POST /v1/clusters/c1", "DELETE"},
           {"GET /v1/submissions", "POST"},
           {"GET /v1/clusters/c1/submissions", "POST"},
           {"PUT /v1/versions", "POST"},
           {"GET /v1/batches", "POST"},
           {"POST /v1/status", "GET, HEAD"},
           {"POST /metrics", "GET, HEAD"},
           {"DELETE /livez", "GET, HEAD"},
       }) {
    const std::string request = method_path;
    CAPTURE(request);
    const std::string text = answer(request);
    CHECK(testing::StatusOf(text) == 405);
    CHECK(text.find("\r\nAllow: " + allow + "\r\n") != std::string::npos);
  }
  CHECK(testing::StatusOf(answer("POST /v1/clusters/c1/unknown")) == 404);
  CHECK(testing::StatusOf(answer("GET /v1/nothing")) == 404);
}

TEST_CASE("orchestrator API: a worker that vanishes mid-lease loses it to another") {
  CoreConfig config;
  // The lease expires long before its holder is declared lost, so that its late result (below)
  // still arrives from a registered cluster however slowly this machine runs.
  config.lease_duration = 200'000;     // 0.2 s
  config.cluster_timeout = 2'000'000;  // 2 s
  Running o(config);
  REQUIRE(o.Post("t-token", "/v1/versions", {{"version", 3}}).first == 200);
  for (const char* id : {"gone", "alive"}) {
    REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", id}, {"region", "us"}, {"capacity", 1}})
                .first == 200);
    REQUIRE(
        o.Post(o.As(id), std::string("/v1/clusters/") + id + "/heartbeat", {{"ready_version", 3}})
            .first == 200);
  }
  REQUIRE(o.Post("t-token", "/v1/jobs", {{"prompts", {{{"prompt", "p"}}}}}).first == 200);
  auto first = o.Post(o.As("gone"), "/v1/clusters/gone/leases", {{"max", 1}});
  REQUIRE(first.second["leases"].size() == 1);
  // "gone" never heartbeats again; "alive" keeps heartbeating and long-polls until the lease is
  // free.
  std::atomic<bool> done{false};
  std::thread heart([&] {
    while (!done) {
      o.Post(o.As("alive"), "/v1/clusters/alive/heartbeat", {{"ready_version", 3}});
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto second = o.Post(o.As("alive"), "/v1/clusters/alive/leases", {{"max", 1}, {"wait_ms", 5000}});
  done = true;
  heart.join();
  REQUIRE(second.first == 200);
  REQUIRE(second.second["leases"].size() == 1);
  CHECK(second.second["leases"][0]["job"] == first.second["leases"][0]["job"]);
  CHECK(second.second["leases"][0]["attempt"] == 2);
  auto status =
      Json::parse(Raw(o.url + "/v1/status", "GET", {"Authorization: Bearer a-token"}).text());
  CHECK(status["leases"]["expired"] >= 1);
  // The vanished worker's late result still counts, once; the second attempt then loses cleanly.
  auto submission = [&](const char* cluster, int attempt) {
    return Json{{"job", first.second["leases"][0]["job"]},
                {"attempt", attempt},
                {"cluster", cluster},
                {"version_start", 3},
                {"version_end", 3},
                {"segments", {{3, 0}}},
                {"tokens", 5},
                {"trajectories", {"late"}}};
  };
  CHECK(o.Post(o.As("gone"), "/v1/clusters/gone/submissions", submission("gone", 1))
            .second["result"] == "accepted");
  auto loser = o.Post(o.As("alive"), "/v1/clusters/alive/submissions", submission("alive", 2));
  CHECK(loser.first == 409);
  CHECK(loser.second["error"].get<std::string>().find("already completed by attempt 1") !=
        std::string::npos);
  // Silent past cluster_timeout, it is lost: it must register again.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status =
        Json::parse(Raw(o.url + "/v1/status", "GET", {"Authorization: Bearer a-token"}).text());
  } while (status["clusters"][1]["state"] != "gone" && std::chrono::steady_clock::now() < give_up);
  CHECK(status["clusters"][1]["id"] == "gone");
  CHECK(status["clusters"][1]["state"] == "gone");
  CHECK(o.Post(o.As("gone"), "/v1/clusters/gone/leases", {{"max", 1}}).first == 404);
  // Nor may it heartbeat or drain its way back: it registers again, with a new token.
  CHECK(o.Post(o.As("gone"), "/v1/clusters/gone/heartbeat", {{"ready_version", 3}}).first == 404);
  CHECK(o.Post(o.As("gone"), "/v1/clusters/gone/drain", Json::object()).first == 404);
  const std::string old_token = o.As("gone");
  REQUIRE(
      o.Post("w-token", "/v1/clusters", {{"cluster", "gone"}, {"region", "us"}, {"capacity", 1}})
          .first == 200);
  CHECK(o.As("gone") != old_token);
  CHECK(o.Post(old_token, "/v1/clusters/gone/heartbeat", {{"ready_version", 3}}).first == 401);
  CHECK(o.Post(o.As("gone"), "/v1/clusters/gone/heartbeat", {{"ready_version", 3}}).first == 200);
}

// The groups of a batch by job, with their jobs' metadata.
std::map<uint64_t, std::string> MetadataByJob(const std::vector<Delivered>& groups) {
  std::map<uint64_t, std::string> metadata;
  for (const Delivered& d : groups) metadata[d.group.job] = d.metadata;
  return metadata;
}

TEST_CASE(
    "orchestrator API: a job's metadata comes back with its group, as the trainer sent it, also "
    "after a restart; leases carry it to the worker") {
  Running o;
  OrchestratorClient trainer(o.url, "t-token");
  REQUIRE(trainer.AnnounceVersion(0).ok());
  REQUIRE(o.Post("w-token", "/v1/clusters", {{"cluster", "c1"}, {"region", "eu"}, {"capacity", 8}})
              .first == 200);
  REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/heartbeat", {{"ready_version", 0}}).first == 200);
  // Through the client: any JSON value; null is none.
  const std::vector<NewJob> jobs = {{Json("1+1="), 2, Json{{"answer", 2}, {"row", "r-17"}}},
                                    {Json::array({1, 2}), 1},
                                    {Json("2+2="), 1, Json(nullptr)},
                                    {Json("3+3="), 1, Json("six")}};
  auto ids = trainer.AddJobs(jobs);
  REQUIRE_MESSAGE(ids.ok(), ids.status().ToString());
  REQUIRE(ids->size() == 4);
  // Over HTTP: the text as it came, white space and number spellings included.
  const std::string text = "{ \"b\" : 1.0E0,\n  \"a\" : [ ] }";
  auto raw = Raw(o.url + "/v1/jobs", "POST",
                 {"Authorization: Bearer t-token", "Content-Type: application/json"},
                 "{\"prompts\": [{\"prompt\": \"4+4=\", \"metadata\": " + text + "}]}");
  REQUIRE(raw.status == 200);
  const uint64_t raw_id = Json::parse(raw.text())["jobs"][0].get<uint64_t>();
  // Leases carry the prompt and the metadata (the same JSON value; none: no member); the worker
  // submits every job.
  auto leases = o.Post(o.As("c1"), "/v1/clusters/c1/leases", {{"max", 8}});
  REQUIRE(leases.first == 200);
  REQUIRE(leases.second["leases"].size() == 5);
  std::map<uint64_t, Json> leased_metadata;
  for (const Json& lease : leases.second["leases"]) {
    if (lease.contains("metadata"))
      leased_metadata[lease["job"].get<uint64_t>()] = lease["metadata"];
    Json submission = {{"job", lease["job"]}, {"attempt", lease["attempt"]},
                       {"cluster", "c1"},     {"version_start", 0},
                       {"version_end", 0},    {"segments", {{0, 0}}},
                       {"tokens", 1},         {"trajectories", {{"samples", Json::array()}}}};
    REQUIRE(o.Post(o.As("c1"), "/v1/clusters/c1/submissions", submission).first == 200);
  }
  CHECK(leased_metadata ==
        std::map<uint64_t, Json>{{(*ids)[0], Json{{"answer", 2}, {"row", "r-17"}}},
                                 {(*ids)[3], Json("six")},
                                 {raw_id, Json::parse(text)}});
  // The batch answer: each group with "metadata" when its job had some.
  auto batch =
      Raw(o.url + "/v1/batches", "POST",
          {"Authorization: Bearer t-token", "Content-Type: application/json"}, R"({"max": 10})");
  REQUIRE(batch.status == 200);
  CHECK(batch.text().find(text) != std::string::npos);
  std::map<uint64_t, Json> answered;
  const Json items = Json::parse(batch.text())["trajectories"];
  for (const Json& item : items)
    answered[item["job"].get<uint64_t>()] = item.value("metadata", Json("absent"));
  CHECK(answered[(*ids)[0]] == Json{{"answer", 2}, {"row", "r-17"}});
  CHECK(answered[(*ids)[1]] == "absent");
  CHECK(answered[(*ids)[2]] == "absent");
  CHECK(answered[(*ids)[3]] == "six");
  CHECK(answered[raw_id] == Json::parse(text));
  // The client hands each group its job's metadata as text (the batch, not acknowledged, comes
  // again), and so does a restarted orchestrator, from its journal.
  const std::map<uint64_t, std::string> expected = {{(*ids)[0], R"({"answer":2,"row":"r-17"})"},
                                                    {(*ids)[1], ""},
                                                    {(*ids)[2], ""},
                                                    {(*ids)[3], R"("six")"},
                                                    {raw_id, text}};
  auto delivered = trainer.TakeBatch(10, std::chrono::milliseconds(0));
  REQUIRE_MESSAGE(delivered.ok(), delivered.status().ToString());
  CHECK(MetadataByJob(*delivered) == expected);
  o.Restart();
  OrchestratorClient restarted(o.url, "t-token");
  delivered = restarted.TakeBatch(10, std::chrono::milliseconds(0));
  REQUIRE_MESSAGE(delivered.ok(), delivered.status().ToString());
  CHECK(MetadataByJob(*delivered) == expected);
  // Acknowledged: gone from the orchestrator.
  REQUIRE(restarted.AcknowledgeBatches().ok());
  CHECK(
      o.core->Inspect([](const OrchestratorCore& core) { return core.Snapshot(); }).find("r-17") ==
      std::string::npos);
}

TEST_CASE("orchestrator API: bad job metadata is refused, naming the job, and adds nothing") {
  Running o;
  OrchestratorClient trainer(o.url, "t-token");
  auto post = [&](const std::string& body) {
    auto reply = Raw(o.url + "/v1/jobs", "POST",
                     {"Authorization: Bearer t-token", "Content-Type: application/json"}, body);
    return std::make_pair(reply.status, Json::parse(reply.text(), nullptr, false));
  };
  const std::string prefix = R"({"prompts": [{"prompt": "a"}, {"prompt": "b", "metadata": )";
  const std::string over = "\"" + std::string(kMaxJobMetadataBytes - 1, 'x') + "\"";
  auto refused = post(prefix + over + "}]}");
  CHECK(refused.first == 400);
  CHECK(refused.second["error"] ==
        "jobs.prompts[1].metadata is 65537 bytes of JSON text; at most 65536 (64 KiB)");
  refused = post(prefix + R"({"a": 1,}}]})");
  CHECK(refused.first == 400);
  CHECK(refused.second["error"].get<std::string>().find(
            "the request body is not valid JSON: byte ") == 0);
  // The client's overload for metadata gets the same answer, or refuses what it cannot print.
  std::vector<NewJob> jobs = {{Json("a"), 1, Json(std::string(70000, 'y'))}};
  auto answer = trainer.AddJobs(jobs);
  CHECK(answer.status().code() == StatusCode::kInvalidArgument);
  CHECK(answer.status().message().find("jobs.prompts[0].metadata is 70002 bytes of JSON text") !=
        std::string::npos);
  jobs = {{Json("a"), 1, Json("\xff")}};
  answer = trainer.AddJobs(jobs);
  CHECK(answer.status().code() == StatusCode::kInvalidArgument);
  CHECK(answer.status().message().find("adding jobs: job 0: ") == 0);
  auto status = trainer.GetStatus();
  REQUIRE(status.ok());
  CHECK(status->jobs.added == 0);
  // At the limit it is taken.
  const std::string most = "\"" + std::string(kMaxJobMetadataBytes - 2, 'x') + "\"";
  CHECK(post(prefix + most + "}]}").first == 200);
  CHECK(trainer.GetStatus()->jobs.added == 2);
}

TEST_CASE(
    "orchestrator client: the loop for a worker and a trainer; retries while the orchestrator is "
    "away") {
  uint16_t port = 0;
  {
    Running o;
    port = o.service->port();
    OrchestratorClient trainer(o.url, "t-token");
    OrchestratorClient worker(o.url, "w-token");
    REQUIRE(trainer.AnnounceVersion(7).ok());
    REQUIRE(worker.Register("c1", "eu", 2).ok());
    REQUIRE(worker.Heartbeat("c1", 7).ok());
    auto ids = trainer.AddJobs({{Json("hello"), 2}, {Json::array({1, 2}), 1}});
    REQUIRE(ids.ok());
    CHECK(ids->size() == 2);
    auto answer = worker.RequestLeases("c1", 2, std::chrono::milliseconds(2000));
    REQUIRE(answer.ok());
    CHECK(answer->latest_version == 7u);
    const std::vector<Lease>* leases = &answer->leases;
    REQUIRE(leases->size() == 2);
    CHECK((*leases)[0].prompt == "\"hello\"");
    TrajectoryGroup s;
    s.job = (*leases)[0].job;
    s.attempt = (*leases)[0].attempt;
    s.cluster = "c1";
    s.version_start = s.version_end = 7;
    s.segments = {{7, 0}};
    s.tokens = 3;
    s.trajectories = R"({"text": "hi"})";
    CHECK(*worker.Submit(s) == SubmitResult::kAccepted);
    CHECK(*worker.Submit(s) == SubmitResult::kDuplicate);
    auto batch = trainer.TakeBatch(10, std::chrono::milliseconds(0));
    REQUIRE(batch.ok());
    REQUIRE(batch->size() == 1);
    CHECK(batch->front().group.trajectories == R"({"text": "hi"})");  // as the worker sent it
    CHECK(!batch->front().stale);
    // The orchestrator's refusals come back as Status codes with its message.
    s.trajectories = "null";
    CHECK(*worker.Submit(s) == SubmitResult::kDuplicate);  // a third repeat, whatever it carries
    CHECK(worker.Heartbeat("nobody", 1).code() == StatusCode::kNotFound);
    CHECK(OrchestratorClient(o.url, "w-token").AnnounceVersion(9).code() ==
          StatusCode::kInvalidArgument);  // 403 is a 4xx
    auto status = trainer.GetStatus();
    REQUIRE(status.ok());
    CHECK(status->trajectories.accepted == 1);
  }
  // The orchestrator is down: calls are retried until it is back on its port...
  HttpClientOptions patient;
  patient.deadline = std::chrono::milliseconds(10000);
  patient.first_backoff = std::chrono::milliseconds(20);
  OrchestratorClient trainer("http://127.0.0.1:" + std::to_string(port), "t-token", patient);
  auto announced = std::async(std::launch::async, [&] { return trainer.AnnounceVersion(1); });
  auto added = std::async(std::launch::async, [&] {
    return trainer.AddJobs({{Json("p"), 1}});
  });  // never sent: safe to repeat
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    Running back(CoreConfig{}, port);
    CHECK(announced.get().ok());
    auto ids = added.get();
    CHECK(ids.ok());
  }
  // ... and fail clearly when it does not come back in time.
  HttpClientOptions impatient;
  impatient.deadline = std::chrono::milliseconds(300);
  impatient.first_backoff = std::chrono::milliseconds(20);
  Status gone = OrchestratorClient("http://127.0.0.1:" + std::to_string(port), "t-token", impatient)
                    .AnnounceVersion(2);
  CHECK(gone.code() == StatusCode::kUnavailable);
  CHECK(gone.message().find("gave up after") != std::string::npos);
}

}  // namespace
}  // namespace weft::orchestrator
