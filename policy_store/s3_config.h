// Where an s3:// store is and how to reach it: the bucket and prefix of its URI, the endpoint,
// region, addressing style and credentials, resolved by the conventions of AWS's own tools.
//
// URI: s3://BUCKET[/PREFIX][?OPTION=VALUE&...], options:
//   - endpoint=URL: the service (http://127.0.0.1:7480, https://ACCOUNT.r2.cloudflarestorage.com)
//   - region=NAME: the signing region
//   - profile=NAME: the profile of ~/.aws/config and ~/.aws/credentials to read (its credentials
//     then win over the environment's)
//   - addressing=path|virtual: path-style https://ENDPOINT/BUCKET/KEY or BUCKET.ENDPOINT/KEY
//   - part_size=SIZE: multipart upload part size (default 16MiB, at least 5MiB)
//   - multipart_threshold=SIZE: objects at least this large are uploaded in parts (default 64MiB)
//   - range_size=SIZE: blobs are read in ranges of this size (default 16MiB, at least 4KiB)
//   - parallel=N: ranges of blob reads, and parts of one upload, in flight at once (default 16)
//   - ca_file=PATH: PEM certificates to trust for an https endpoint
// Otherwise, in order: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN; AWS_REGION, AWS_DEFAULT_REGION; AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, both
// ignored with AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true; AWS_PROFILE), then the profile (default
// "default") of the credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) and the
// config file (AWS_CONFIG_FILE, ~/.aws/config: region, endpoint_url, a nested `s3 =` block with
// endpoint_url and addressing_style, or `services = NAME` naming a [services NAME] section), then
// the defaults: region us-east-1, endpoint https://s3.REGION.amazonaws.com, virtual-hosted
// addressing on AWS and path-style on any endpoint set. Errors name the option or file and line;
// no message ever holds the secret key or session token.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "policy_store/object_store.h"
#include "policy_store/s3_signer.h"

namespace weft::policy_store::s3 {

struct Settings {
  std::string bucket;
  std::string prefix;    // without a trailing '/'; empty: the bucket's root
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  bool path_style = true;
  std::string region = "us-east-1";
  Credentials credentials;
  std::string credentials_from;  // where they came from, for messages ("the environment", a file)
  uint64_t part_size = uint64_t{16} << 20;
  uint64_t multipart_threshold = uint64_t{64} << 20;
  uint64_t range_size = uint64_t{16} << 20;
  int parallel = 16;
  std::string ca_file;
  int list_page = 1000;  // keys per ListObjectsV2 page (S3's maximum; tests use fewer)

  // The URI without options: "s3://bucket/prefix".
  std::string Uri() const;
  // For messages and status: the URI, endpoint and region (never a secret).
  std::string Describe() const;
};

// The environment as a lookup (tests pass their own).
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment ProcessEnvironment();

Result<Settings> ResolveSettings(const std::string& uri, const Environment& environment);

}  // namespace weft::policy_store::s3
