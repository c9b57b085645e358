#include "orchestrator/config.h"

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/json_fields.h"
#include "common/json_text.h"
#include "common/yaml_fields.h"
#include "orchestrator/core_config.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {

Result<OrchestratorConfig> LoadOrchestratorConfig(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  Status status = CheckKeys(root, "(top level)", {"orchestrator"});
  if (!status.ok()) return status.WithContext(path);
  return ParseOrchestratorConfig(root, path);
}

Result<OrchestratorConfig> ParseOrchestratorConfig(const YAML::Node& root, const std::string& path,
                                                   bool all_tokens) {
  OrchestratorConfig config;
  const std::string file = path + ": ";
  const YAML::Node o = root["orchestrator"];
  if (!o) return InvalidArgument(file + "no 'orchestrator:' section");
  const std::string where = "orchestrator";
  auto check = [&](const Status& s) { return s.ok() ? s : s.WithContext(path); };
  WEFT_RETURN_IF_ERROR(check(CheckKeys(o, where, [] {
    std::set<std::string> keys = {"listen",
                                  "journal",
                                  "run",
                                  "dataset",
                                  "threads",
                                  "max_request_bytes",
                                  "tokens",
                                  "tick",
                                  "max_wait",
                                  "tls",
                                  "compact_after",
                                  "max_connections",
                                  "dataset_max_line",
                                  "metrics_cluster_limit",
                                  "dataset_max_bytes"};
    keys.insert(CoreConfigKeys().begin(), CoreConfigKeys().end());
    return keys;
  }())));
  std::string listen = "127.0.0.1:8090";
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "listen", &listen)));
  const size_t colon = listen.rfind(':');
  char* end = nullptr;
  const unsigned long port =
      colon == std::string::npos ? 70000 : std::strtoul(listen.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || port > 65535 || *end != '\0' || colon + 1 == listen.size()) {
    return InvalidArgument(file + "orchestrator.listen: '" + listen + "' is not ADDRESS:PORT");
  }
  config.service.server.address = listen.substr(0, colon);
  config.service.server.port = static_cast<uint16_t>(port);
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "journal", &config.journal)));
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "run", &config.service.run_id)));
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "dataset", &config.dataset)));
  WEFT_RETURN_IF_ERROR(
      check(ReadBytes(o, where, "dataset_max_line", &config.dataset_limits.max_line_bytes)));
  WEFT_RETURN_IF_ERROR(
      check(ReadBytes(o, where, "dataset_max_bytes", &config.dataset_limits.max_total_bytes)));
  if (config.dataset_limits.max_line_bytes < 1024 || config.dataset_limits.max_total_bytes < 1024)
    return InvalidArgument(file +
                           "orchestrator.dataset_max_line and dataset_max_bytes must be "
                           "at least 1KiB");
  WEFT_RETURN_IF_ERROR(ParseCoreConfig(o, where, path, &config.core));
  config.service.max_staleness = config.core.max_staleness;
  std::chrono::microseconds tick(config.service.tick_interval), max_wait(config.service.max_wait);
  WEFT_RETURN_IF_ERROR(check(ReadDuration(o, where, "tick", &tick)));
  WEFT_RETURN_IF_ERROR(check(ReadDuration(o, where, "max_wait", &max_wait)));
  const std::chrono::microseconds year = std::chrono::hours(24 * 365);
  if (max_wait.count() <= 0 || tick.count() < 1000 || max_wait > year || tick > year) {
    return InvalidArgument(file +
                           "orchestrator: max_wait must be positive and tick at least 1ms, both "
                           "at most a year");
  }
  config.service.tick_interval = std::chrono::duration_cast<std::chrono::milliseconds>(tick);
  config.service.max_wait = std::chrono::duration_cast<std::chrono::milliseconds>(max_wait);
  uint64_t threads = 8;
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "threads", &threads)));
  if (threads < 1 || threads > 1024)
    return InvalidArgument(file + "orchestrator.threads must be 1 to 1024");
  config.service.server.threads = static_cast<int>(threads);
  uint64_t connections = 0;
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "max_connections", &connections)));
  if (connections > 1000000)
    return InvalidArgument(file + "orchestrator.max_connections must be at most 1000000");
  config.service.server.max_connections = static_cast<uint32_t>(connections);
  config.service.server.max_body_bytes = kDefaultMaxRequestBytes;
  WEFT_RETURN_IF_ERROR(
      check(ReadBytes(o, where, "max_request_bytes", &config.service.server.max_body_bytes)));
  if (config.service.server.max_body_bytes < (64 << 10) ||
      config.service.server.max_body_bytes > kMaxRequestBytes) {
    // A request the server takes must fit in one journal record, even with its prompts escaped
    // to twice their size.
    return InvalidArgument(file + "orchestrator.max_request_bytes must be 64KiB to " +
                           std::to_string(kMaxRequestBytes >> 20) +
                           "MiB (a journal record holds at most " +
                           std::to_string(Journal::kMaxRecordBytes >> 20) + "MiB)");
  }
  WEFT_RETURN_IF_ERROR(check(
      ReadUnsigned(o, where, "metrics_cluster_limit", &config.service.metrics_cluster_limit)));
  WEFT_RETURN_IF_ERROR(
      check(ReadBytes(o, where, "compact_after", &config.durable.compact_after_bytes)));
  if (config.durable.compact_after_bytes < 4096)
    return InvalidArgument(file + "orchestrator.compact_after must be at least 4KiB");
  if (const YAML::Node tls = o["tls"]) {
    WEFT_RETURN_IF_ERROR(check(CheckKeys(tls, where + ".tls", {"cert", "key"})));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tls, where + ".tls", "cert", &config.service.server.tls_cert_file)));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tls, where + ".tls", "key", &config.service.server.tls_key_file)));
    if (config.service.server.tls_cert_file.empty() || config.service.server.tls_key_file.empty()) {
      return InvalidArgument(file + "orchestrator.tls: both cert and key are needed");
    }
  }
  if (const YAML::Node tokens = o["tokens"]) {
    WEFT_RETURN_IF_ERROR(
        check(CheckKeys(tokens, where + ".tokens", {"worker", "trainer", "admin", "viewer"})));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tokens, where + ".tokens", "viewer", &config.service.viewer_token)));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tokens, where + ".tokens", "worker", &config.service.worker_token)));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tokens, where + ".tokens", "trainer", &config.service.trainer_token)));
    WEFT_RETURN_IF_ERROR(
        check(ReadString(tokens, where + ".tokens", "admin", &config.service.admin_token)));
  }
  for (auto [variable, token] : {std::pair{"WEFT_WORKER_TOKEN", &config.service.worker_token},
                                 std::pair{"WEFT_TRAINER_TOKEN", &config.service.trainer_token},
                                 std::pair{"WEFT_ADMIN_TOKEN", &config.service.admin_token},
                                 std::pair{"WEFT_VIEWER_TOKEN", &config.service.viewer_token}}) {
    if (const char* value = std::getenv(variable)) *token = value;
  }
  if (!all_tokens) {
    const std::string* tokens[] = {&config.service.worker_token, &config.service.trainer_token,
                                   &config.service.admin_token, &config.service.viewer_token};
    for (int i = 0; i < 4; ++i) {
      for (int j = i + 1; j < 4; ++j) {
        if (!tokens[i]->empty() && *tokens[i] == *tokens[j]) {
          return InvalidArgument(
              file +
              "orchestrator.tokens: the worker, trainer, admin and viewer "
              "tokens must all be different (a role whose token is another's would have "
              "that role's rights)");
        }
      }
    }
    return config;
  }
  if (config.service.worker_token.empty() || config.service.trainer_token.empty() ||
      config.service.admin_token.empty()) {
    return InvalidArgument(
        file +
        "orchestrator.tokens: the worker, trainer and admin tokens are all needed (in the file or "
        "WEFT_WORKER_TOKEN, WEFT_TRAINER_TOKEN, WEFT_ADMIN_TOKEN)");
  }
  WEFT_RETURN_IF_ERROR(CheckTokens(config.service).WithContext(file + "orchestrator.tokens"));
  return config;
}

Result<std::vector<JobSpec>> LoadPrompts(const std::string& path, const LineLimits& limits) {
  WEFT_ASSIGN_OR_RETURN(LineReader in, LineReader::Open(path, limits, "the dataset"));
  std::vector<JobSpec> prompts;
  while (true) {
    WEFT_ASSIGN_OR_RETURN(std::optional<std::string> next, in.Next());
    if (!next) break;
    std::string& line = *next;
    if (in.line() == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);  // a BOM
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(in.line());
    // As strict as the trainers' reader (trainer_adapter/dataset.h): no repeated keys, well-formed
    // UTF-8, nesting at most 62 deep (the line goes into a jobs body, bounded at 64).
    if (const std::string fault = json_text::Validate(line, 62); !fault.empty())
      return InvalidArgument(where + ": not valid JSON: " + fault);
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object())
      return InvalidArgument(where + ": not a JSON object");
    WEFT_RETURN_IF_ERROR(CheckFields(row, where, {"prompt"}, {"samples", "metadata"}));
    const nlohmann::json& prompt = row["prompt"];
    bool tokens = prompt.is_array();
    for (const auto& t : prompt.is_array() ? prompt : nlohmann::json::array())
      tokens = tokens && t.is_number_unsigned();
    if (!prompt.is_string() && !tokens)
      return InvalidArgument(where + ".prompt must be text or an array of token ids");
    uint64_t samples = 1;
    if (row.contains("samples")) {
      WEFT_ASSIGN_OR_RETURN(samples, GetUnsigned(row, "samples", where));
      if (samples < 1 || samples > 4096)
        return InvalidArgument(where + ".samples must be 1 to 4096");
    }
    JobSpec job{prompt.dump(), static_cast<uint32_t>(samples)};
    if (row.contains("metadata") && !row["metadata"].is_null()) {
      // Kept as the line has it, as the jobs route keeps what a trainer sends.
      std::optional<std::string_view> metadata = json_text::Member(line, 0, "metadata");
      if (!metadata) return InvalidArgument(where + ".metadata could not be read");
      WEFT_RETURN_IF_ERROR(wire::CheckMetadata(*metadata, where + ".metadata"));
      job.metadata = std::string(*metadata);
    }
    prompts.push_back(std::move(job));
  }
  return prompts;
}

}  // namespace weft::orchestrator
