// An orchestrator (journal, core and HTTP service) on loopback for tests, with the role tokens
// "w-token", "t-token" and "a-token".
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/service.h"
#include "tests/http_test_util.h"
#include "tests/temp_path.h"
#include "tests/tls_test_util.h"

namespace weft::testing {

struct RunningOrchestrator {
  std::string path;
  std::unique_ptr<orchestrator::DurableCore> core;
  std::unique_ptr<orchestrator::OrchestratorService> service;
  std::string url;

  explicit RunningOrchestrator(orchestrator::CoreConfig config = {}, uint16_t port = 0,
                               const TestCertificate* tls = nullptr)
      : config_(config), tls_(tls) {
    path = TempPath("orchestrator_journal");
    Open(port);
  }
  // Stops the service and the core, and starts them again from the journal (on a new port).
  void Restart() {
    service->Stop();
    service.reset();
    core.reset();
    Open(0);
  }
  ~RunningOrchestrator() {
    service->Stop();
    std::filesystem::remove(path);
  }
  // POST with a role's token; the reply's JSON (or {"status": code} when it is not JSON).
  std::pair<long, nlohmann::json> Post(const std::string& token, const std::string& path_part,
                                       const nlohmann::json& body,
                                       const std::string& method = "POST") {
    auto reply =
        Raw(url + path_part, method,
            {"Authorization: Bearer " + token, "Content-Type: application/json"}, body.dump());
    nlohmann::json answer = nlohmann::json::parse(reply.text(), nullptr, false);
    if (path_part == "/v1/clusters" && answer.contains("cluster_token"))
      cluster_tokens[answer["cluster"]] = answer["cluster_token"];
    return {reply.status, answer};
  }
  // The token the last registration of `cluster` returned (for the calls that name it).
  std::string As(const std::string& cluster) const {
    auto found = cluster_tokens.find(cluster);
    return found == cluster_tokens.end() ? "no-token-for-" + cluster : found->second;
  }
  std::map<std::string, std::string> cluster_tokens;

 private:
  void Open(uint16_t port) {
    core = std::move(orchestrator::DurableCore::Open(path, config_)).value();
    orchestrator::ServiceOptions options;
    options.worker_token = "w-token";
    options.trainer_token = "t-token";
    options.admin_token = "a-token";
    options.tick_interval = std::chrono::milliseconds(20);
    options.server.threads = 4;
    options.server.max_body_bytes = 1 << 20;
    options.server.port = port;
    if (tls_ != nullptr) {
      options.server.tls_cert_file = tls_->cert;
      options.server.tls_key_file = tls_->key;
    }
    service = std::move(orchestrator::OrchestratorService::Start(*core, options)).value();
    url = std::string(tls_ != nullptr ? "https" : "http") +
          "://127.0.0.1:" + std::to_string(service->port());
  }

  orchestrator::CoreConfig config_;
  const TestCertificate* tls_;
};

}  // namespace weft::testing
