// Strict reading of YAML config files: every key is checked against what the section allows, and
// a wrong key or value is an error naming its path ("orchestrator.lease: unknown key") and the
// file position.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include "common/status.h"

namespace weft {

// The document in `path`, or an error naming the file and the line of a syntax error, or the path
// and both lines of a key given twice in a map (anywhere in the document). A file larger than
// kMaxConfigBytes is refused having read no more.
inline constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
Result<YAML::Node> LoadYamlFile(const std::string& path);

// " (line N)" for a node read from a file; empty for one made in code.
std::string LineOf(const YAML::Node& node);

// `node` (at `where`) must be a map whose keys are all in `allowed`.
Status CheckKeys(const YAML::Node& node, const std::string& where,
                 const std::set<std::string>& allowed);

// Reads `node[key]` into `*out` when present (absent keys leave `*out` as it is).
Status ReadString(const YAML::Node& node, const std::string& where, const std::string& key,
                  std::string* out);
Status ReadUnsigned(const YAML::Node& node, const std::string& where, const std::string& key,
                    uint64_t* out);
Status ReadDouble(const YAML::Node& node, const std::string& where, const std::string& key,
                  double* out);
Status ReadBytes(const YAML::Node& node, const std::string& where, const std::string& key,
                 uint64_t* out);  // "64MiB"
Status ReadDuration(const YAML::Node& node, const std::string& where, const std::string& key,
                    std::chrono::microseconds* out);  // "30s"
// An integer from `low` to `high`.
Status ReadInt(const YAML::Node& node, const std::string& where, const std::string& key, int* out,
               int low, int high);

}  // namespace weft
