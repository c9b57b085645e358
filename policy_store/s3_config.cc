#include "policy_store/s3_config.h"

#include <cstdlib>
#include <map>
#include <sstream>

#include "common/file_util.h"
#include "common/units.h"
#include "policy_store/object_store.h"

namespace weft::policy_store::s3 {
namespace {

std::string Trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && (text[begin] == ' ' || text[begin] == '\t' || text[begin] == '\r')) ++begin;
  while (end > begin && (text[end - 1] == ' ' || text[end - 1] == '\t' || text[end - 1] == '\r'))
    --end;
  return text.substr(begin, end - begin);
}

// An AWS shared config or credentials file: sections of `key = value` lines, where a key with an
// empty value may own indented `sub = value` lines (stored as "key.sub").
using Section = std::map<std::string, std::string>;
using IniFile = std::map<std::string, Section>;

Result<IniFile> ReadIni(const std::string& path, bool* found) {
  IniFile file;
  Result<std::string> text = ReadTextFile(path, uint64_t{1} << 20, "an AWS config file");
  *found = text.ok();
  if (text.status().code() == StatusCode::kNotFound) return file;
  WEFT_RETURN_IF_ERROR(text.status());
  std::istringstream in(*text);
  std::string line, section, parent;
  bool in_section = false;
  // Where each section and setting was first given: one given twice is an error naming both
  // lines (as the AWS CLI refuses it), never a silent choice of one.
  std::map<std::string, int> section_lines, setting_lines;
  auto once = [&](std::map<std::string, int>& lines, const std::string& name, int number,
                  const std::string& what) -> Status {
    const auto [found, fresh] = lines.emplace(name, number);
    if (fresh) return Status::Ok();
    return InvalidArgument(path + ": " + what + " is given twice (lines " +
                           std::to_string(found->second) + " and " + std::to_string(number) +
                           "): keep one of them");
  };
  for (int number = 1; std::getline(in, line); ++number) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    const std::string text = Trim(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    const std::string where = path + ":" + std::to_string(number);
    if (text[0] == '[') {
      if (text.back() != ']') return InvalidArgument(where + ": a section header must end in ']'");
      section = Trim(text.substr(1, text.size() - 2));
      WEFT_RETURN_IF_ERROR(once(section_lines, section, number, "[" + section + "]"));
      in_section = true;
      parent.clear();
      file[section];
      continue;
    }
    const size_t equals = text.find('=');
    if (equals == std::string::npos)
      return InvalidArgument(where + ": expected 'key = value' or '[section]'");
    if (!in_section) return InvalidArgument(where + ": a setting before any [section]");
    const std::string key = Trim(text.substr(0, equals));
    const std::string value = Trim(text.substr(equals + 1));
    if (indented && !parent.empty()) {
      WEFT_RETURN_IF_ERROR(once(setting_lines, section + "\n" + parent + "." + key, number,
                                "[" + section + "] " + parent + "." + key));
      file[section][parent + "." + key] = value;
      continue;
    }
    WEFT_RETURN_IF_ERROR(
        once(setting_lines, section + "\n" + key, number, "[" + section + "] " + key));
    file[section][key] = value;
    parent = value.empty() ? key : "";
  }
  return file;
}

std::optional<std::string> Lookup(const Section* section, const std::string& key) {
  if (section == nullptr) return std::nullopt;
  auto it = section->find(key);
  if (it == section->end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool ValidBucket(const std::string& bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  return bucket.front() != '.' && bucket.front() != '-' && bucket.back() != '.' &&
         bucket.back() != '-';
}

Status CheckEndpoint(const std::string& endpoint, const std::string& from) {
  const bool http = endpoint.rfind("http://", 0) == 0, https = endpoint.rfind("https://", 0) == 0;
  const size_t host = http ? 7 : 8;
  if ((!http && !https) || endpoint.size() <= host ||
      endpoint.find_first_of("/?#@ ", host) != std::string::npos) {
    return InvalidArgument(from + ": the S3 endpoint '" + endpoint +
                           "' must be http(s)://HOST[:PORT], without a path");
  }
  return Status::Ok();
}

}  // namespace

std::string Settings::Uri() const {
  return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix);
}

std::string Settings::Describe() const {
  return Uri() + " (endpoint " + endpoint + ", region " + region + ", " +
         (path_style ? "path-style" : "virtual-hosted") + ")";
}

Environment ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

Result<Settings> ResolveSettings(const std::string& uri, const Environment& environment) {
  auto env = [&](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> value = environment(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  };
  if (uri.rfind("s3://", 0) != 0) return InvalidArgument("'" + uri + "' is not an s3:// URI");
  Settings s;
  std::string rest = uri.substr(5);
  std::map<std::string, std::string> options;
  if (const size_t question = rest.find('?'); question != std::string::npos) {
    std::string query = rest.substr(question + 1);
    rest.resize(question);
    size_t start = 0;
    while (start <= query.size()) {
      size_t end = query.find('&', start);
      if (end == std::string::npos) end = query.size();
      const std::string item = query.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      const size_t equals = item.find('=');
      const std::string name = UriDecode(item.substr(0, equals));
      const std::string value =
          equals == std::string::npos ? "" : UriDecode(item.substr(equals + 1));
      static const char* kKnown[] = {"endpoint",   "region",    "profile",
                                     "addressing", "part_size", "multipart_threshold",
                                     "range_size", "parallel",  "ca_file"};
      bool known = false;
      for (const char* k : kKnown) known = known || name == k;
      if (!known) {
        return InvalidArgument("store '" + s.Uri() + "': unknown option '" + name +
                               "' (known: endpoint, region, profile, addressing, part_size, "
                               "multipart_threshold, range_size, parallel, ca_file)");
      }
      if (!options.emplace(name, value).second) {
        return InvalidArgument("store '" + s.Uri() + "': option '" + name + "' is given twice");
      }
    }
  }
  const size_t slash = rest.find('/');
  s.bucket = rest.substr(0, slash);
  s.prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!s.prefix.empty() && s.prefix.back() == '/') s.prefix.pop_back();
  if (!ValidBucket(s.bucket)) {
    return InvalidArgument("store 's3://" + rest + "': the bucket '" + s.bucket +
                           "' is not a valid bucket name (3 to 63 of a-z 0-9 . -)");
  }
  if (!s.prefix.empty()) {
    if (Status key = ValidateKey(s.prefix); !key.ok())
      return InvalidArgument("store '" + s.Uri() + "': the prefix: " + key.message());
  }
  const std::string where = "store '" + s.Uri() + "'";

  // The profile's files.
  const bool explicit_profile = options.count("profile") > 0;
  const std::string profile =
      explicit_profile ? options["profile"] : env("AWS_PROFILE").value_or("default");
  const std::string home = env("HOME").value_or("");
  const std::string config_path =
      env("AWS_CONFIG_FILE").value_or(home.empty() ? "" : home + "/.aws/config");
  const std::string credentials_path =
      env("AWS_SHARED_CREDENTIALS_FILE").value_or(home.empty() ? "" : home + "/.aws/credentials");
  IniFile config, credentials;
  bool config_found = false, credentials_found = false;
  if (!config_path.empty()) {
    WEFT_ASSIGN_OR_RETURN(config, ReadIni(config_path, &config_found));
  }
  if (!credentials_path.empty()) {
    WEFT_ASSIGN_OR_RETURN(credentials, ReadIni(credentials_path, &credentials_found));
  }
  auto find = [](const IniFile& file, const std::string& name) -> const Section* {
    auto it = file.find(name);
    return it == file.end() ? nullptr : &it->second;
  };
  const Section* config_profile =
      find(config, profile == "default" ? "default" : "profile " + profile);
  if (config_profile == nullptr && profile == "default")
    config_profile = find(config, "profile default");
  const Section* credentials_profile = find(credentials, profile);
  if (explicit_profile && config_profile == nullptr && credentials_profile == nullptr) {
    return InvalidArgument(where + ": no profile '" + profile + "' in " +
                           (config_path.empty() ? "~/.aws/config" : config_path) + " or " +
                           (credentials_path.empty() ? "~/.aws/credentials" : credentials_path));
  }
  const Section* services = nullptr;
  if (std::optional<std::string> name = Lookup(config_profile, "services"))
    services = find(config, "services " + *name);

  // Region.
  if (options.count("region")) {
    s.region = options["region"];
  } else if (auto region = env("AWS_REGION")) {
    s.region = *region;
  } else if (auto fallback = env("AWS_DEFAULT_REGION")) {
    s.region = *fallback;
  } else if (auto configured = Lookup(config_profile, "region")) {
    s.region = *configured;
  }
  if (s.region.empty()) return InvalidArgument(where + ": the region is empty");

  // Endpoint and addressing.
  const bool ignore_configured = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").value_or("") == "true";
  std::optional<std::string> endpoint;
  std::string endpoint_from;
  auto take = [&](std::optional<std::string> value, const std::string& from) {
    if (!endpoint && value) {
      endpoint = value;
      endpoint_from = from;
    }
  };
  if (options.count("endpoint")) take(options["endpoint"], where + ", option endpoint");
  if (!ignore_configured) {
    take(env("AWS_ENDPOINT_URL_S3"), "AWS_ENDPOINT_URL_S3");
    take(env("AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL");
    take(Lookup(services, "s3.endpoint_url"), config_path + " [services]");
    take(Lookup(config_profile, "s3.endpoint_url"), config_path + " [" + profile + "]");
    take(Lookup(config_profile, "endpoint_url"), config_path + " [" + profile + "]");
  }
  if (endpoint) {
    while (!endpoint->empty() && endpoint->back() == '/') endpoint->pop_back();
    WEFT_RETURN_IF_ERROR(CheckEndpoint(*endpoint, endpoint_from));
    s.endpoint = *endpoint;
    s.path_style = true;
  } else {
    s.endpoint = "https://s3." + s.region + ".amazonaws.com";
    // Bucket names with dots do not match the service's wildcard certificate.
    s.path_style = s.bucket.find('.') != std::string::npos;
  }
  std::optional<std::string> addressing;
  if (options.count("addressing")) {
    addressing = options["addressing"];
  } else if (auto style = Lookup(services, "s3.addressing_style")) {
    addressing = style;
  } else if (auto profile_style = Lookup(config_profile, "s3.addressing_style")) {
    addressing = profile_style;
  }
  if (addressing && *addressing != "auto") {
    if (*addressing != "path" && *addressing != "virtual")
      return InvalidArgument(where + ": addressing must be path, virtual or auto, not '" +
                             *addressing + "'");
    s.path_style = *addressing == "path";
  }

  // Credentials: an explicit profile first, else the environment, else the profile's files.
  auto from_profile = [&]() -> bool {
    for (const auto& [section, path] : {std::pair{credentials_profile, credentials_path},
                                        std::pair{config_profile, config_path}}) {
      auto key = Lookup(section, "aws_access_key_id");
      auto secret = Lookup(section, "aws_secret_access_key");
      if (key && secret) {
        s.credentials = {*key, *secret, Lookup(section, "aws_session_token").value_or("")};
        s.credentials_from = path + " [" + profile + "]";
        return true;
      }
    }
    return false;
  };
  auto from_environment = [&]() -> bool {
    auto key = env("AWS_ACCESS_KEY_ID");
    auto secret = env("AWS_SECRET_ACCESS_KEY");
    if (!key || !secret) return false;
    s.credentials = {*key, *secret, env("AWS_SESSION_TOKEN").value_or("")};
    s.credentials_from = "the environment";
    return true;
  };
  const bool found = explicit_profile ? (from_profile() || from_environment())
                                      : (from_environment() || from_profile());
  if (!found) {
    return InvalidArgument(where +
                           ": no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                           "or a profile (AWS_PROFILE, default 'default') with aws_access_key_id "
                           "and aws_secret_access_key in " +
                           (credentials_path.empty() ? "~/.aws/credentials" : credentials_path));
  }

  // Transfer settings.
  for (const char* name : {"part_size", "multipart_threshold"}) {
    if (!options.count(name)) continue;
    Result<uint64_t> size = ParseByteSize(options[name]);
    if (!size.ok())
      return InvalidArgument(where + ", option " + name + ": " + size.status().message());
    uint64_t& field = std::string(name) == "part_size" ? s.part_size : s.multipart_threshold;
    field = *size;
  }
  if (s.part_size < (uint64_t{5} << 20) || s.part_size > (uint64_t{5} << 30))
    return InvalidArgument(where + ": part_size must be 5MiB to 5GiB (S3's limits for a part)");
  if (s.multipart_threshold > (uint64_t{5} << 30))
    return InvalidArgument(where + ": multipart_threshold must be at most 5GiB (one PUT's limit)");
  BlobReads reads{s.range_size, s.parallel};
  WEFT_RETURN_IF_ERROR(ParseBlobReads(options, where, &reads));
  s.range_size = reads.part_bytes;
  s.parallel = reads.parallel;
  if (options.count("ca_file")) s.ca_file = options["ca_file"];
  return s;
}

}  // namespace weft::policy_store::s3
