#include "policy_store/s3_config.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store::s3 {
namespace {

Environment Env(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

const std::map<std::string, std::string> kKeys = {{"AWS_ACCESS_KEY_ID", "AKIDENV"},
                                                  {"AWS_SECRET_ACCESS_KEY", "secret-env"}};

TEST_CASE("S3 settings: URI, environment and defaults") {
  Result<Settings> aws = ResolveSettings("s3://my-bucket/runs/prod/", Env(kKeys));
  REQUIRE(aws.ok());
  CHECK(aws->bucket == "my-bucket");
  CHECK(aws->prefix == "runs/prod");
  CHECK(aws->region == "us-east-1");
  CHECK(aws->endpoint == "https://s3.us-east-1.amazonaws.com");
  CHECK(!aws->path_style);  // virtual-hosted on AWS
  CHECK(aws->credentials.access_key == "AKIDENV");
  CHECK(aws->credentials.secret_key == "secret-env");
  CHECK(aws->credentials.session_token.empty());
  CHECK(aws->Uri() == "s3://my-bucket/runs/prod");

  auto env = kKeys;
  env["AWS_DEFAULT_REGION"] = "eu-west-1";
  env["AWS_SESSION_TOKEN"] = "token";
  CHECK(ResolveSettings("s3://b-1", Env(env))->region == "eu-west-1");
  env["AWS_REGION"] = "ap-south-1";  // wins over AWS_DEFAULT_REGION
  Result<Settings> regional = ResolveSettings("s3://b-1", Env(env));
  CHECK(regional->region == "ap-south-1");
  CHECK(regional->endpoint == "https://s3.ap-south-1.amazonaws.com");
  CHECK(regional->credentials.session_token == "token");
  CHECK(regional->prefix.empty());

  env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:7480/";
  Result<Settings> local = ResolveSettings("s3://b-1/p", Env(env));
  CHECK(local->endpoint == "http://127.0.0.1:7480");
  CHECK(local->path_style);                              // path-style on any endpoint set
  env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:9000";  // the service's own wins
  CHECK(ResolveSettings("s3://b-1/p", Env(env))->endpoint == "http://127.0.0.1:9000");
  // The URI's options win over everything.
  Result<Settings> options = ResolveSettings(
      "s3://b-1/p?endpoint=https%3A%2F%2Fminio.example:9443&region=local&addressing=virtual"
      "&part_size=8MiB&multipart_threshold=32MiB&range_size=4MiB&parallel=3",
      Env(env));
  REQUIRE(options.ok());
  CHECK(options->endpoint == "https://minio.example:9443");
  CHECK(options->region == "local");
  CHECK(!options->path_style);
  CHECK(options->part_size == (uint64_t{8} << 20));
  CHECK(options->multipart_threshold == (uint64_t{32} << 20));
  CHECK(options->range_size == (uint64_t{4} << 20));
  CHECK(options->parallel == 3);
  env["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"] = "true";
  CHECK(ResolveSettings("s3://b-1/p", Env(env))->endpoint == "https://s3.ap-south-1.amazonaws.com");
  // Dotted bucket names do not fit the service's certificate as a host name.
  CHECK(ResolveSettings("s3://my.bucket", Env(kKeys))->path_style);
}

TEST_CASE("S3 settings: profiles from the shared config and credentials files") {
  const std::string root = TempRoot("aws_profiles");
  std::filesystem::create_directories(root + "/.aws");
  std::ofstream(root + "/.aws/credentials") << "[default]\n"
                                               "aws_access_key_id = AKIDDEFAULT\n"
                                               "aws_secret_access_key = secret-default\n"
                                               "# a comment\n"
                                               "[ceph]\n"
                                               "aws_access_key_id=AKIDCEPH\n"
                                               "aws_secret_access_key=secret-ceph\n";
  std::ofstream(root + "/.aws/config") << "[default]\n"
                                          "region = eu-north-1\n"
                                          "[profile ceph]\n"
                                          "region = local\n"
                                          "services = rgw\n"
                                          "[profile nested]\n"
                                          "aws_access_key_id = AKIDNESTED\n"
                                          "aws_secret_access_key = secret-nested\n"
                                          "s3 =\n"
                                          "  endpoint_url = http://10.0.0.5:9000\n"
                                          "  addressing_style = virtual\n"
                                          "[services rgw]\n"
                                          "s3 =\n"
                                          "  endpoint_url = http://127.0.0.1:7480\n";
  Result<Settings> plain = ResolveSettings("s3://bucket/p", Env({{"HOME", root}}));
  REQUIRE(plain.ok());
  CHECK(plain->credentials.access_key == "AKIDDEFAULT");
  CHECK(plain->region == "eu-north-1");
  CHECK(plain->credentials_from == root + "/.aws/credentials [default]");

  Result<Settings> ceph =
      ResolveSettings("s3://bucket/p", Env({{"HOME", root}, {"AWS_PROFILE", "ceph"}}));
  REQUIRE(ceph.ok());
  CHECK(ceph->credentials.access_key == "AKIDCEPH");
  CHECK(ceph->region == "local");
  CHECK(ceph->endpoint == "http://127.0.0.1:7480");
  CHECK(ceph->path_style);

  Result<Settings> nested = ResolveSettings("s3://bucket/p?profile=nested", Env({{"HOME", root}}));
  REQUIRE(nested.ok());
  CHECK(nested->credentials.access_key == "AKIDNESTED");  // from the config file
  CHECK(nested->endpoint == "http://10.0.0.5:9000");
  CHECK(!nested->path_style);

  // The environment's keys win over a profile named by AWS_PROFILE, not over one the URI names.
  auto env = kKeys;
  env["HOME"] = root;
  env["AWS_PROFILE"] = "ceph";
  CHECK(ResolveSettings("s3://bucket", Env(env))->credentials.access_key == "AKIDENV");
  CHECK(ResolveSettings("s3://bucket?profile=ceph", Env(env))->credentials.access_key ==
        "AKIDCEPH");
  // Other file locations.
  std::filesystem::rename(root + "/.aws/credentials", root + "/creds");
  Result<Settings> moved = ResolveSettings(
      "s3://bucket", Env({{"HOME", root}, {"AWS_SHARED_CREDENTIALS_FILE", root + "/creds"}}));
  REQUIRE(moved.ok());
  CHECK(moved->credentials.access_key == "AKIDDEFAULT");
  std::filesystem::remove_all(root);
}

TEST_CASE("S3 settings: bad URIs, options and files are refused, naming what is wrong") {
  auto error = [](const std::string& uri, Environment env = Env(kKeys)) {
    Result<Settings> settings = ResolveSettings(uri, env);
    REQUIRE(!settings.ok());
    CHECK(settings.status().code() == StatusCode::kInvalidArgument);
    return settings.status().message();
  };
  CHECK(error("s3://Bad_Bucket/x").find("not a valid bucket name") != std::string::npos);
  CHECK(error("s3://ab").find("not a valid bucket name") != std::string::npos);
  CHECK(error("s3://bucket/../x").find("prefix") != std::string::npos);
  CHECK(error("s3://bucket/x?colour=red").find("unknown option 'colour'") != std::string::npos);
  CHECK(error("s3://bucket/x?part_size=1MiB").find("part_size must be 5MiB to 5GiB") !=
        std::string::npos);
  CHECK(error("s3://bucket/x?part_size=lots").find("part_size") != std::string::npos);
  CHECK(error("s3://bucket/x?parallel=0").find("parallel must be") != std::string::npos);
  CHECK(error("s3://bucket/x?addressing=sideways").find("addressing") != std::string::npos);
  CHECK(error("s3://bucket/x?endpoint=ftp://host").find("must be http(s)://HOST[:PORT]") !=
        std::string::npos);
  CHECK(error("s3://bucket/x?endpoint=http://host/path").find("without a path") !=
        std::string::npos);
  const std::string none = error("s3://bucket/x", Env({{"HOME", "/nonexistent"}}));
  CHECK(none.find("no S3 credentials") != std::string::npos);
  CHECK(error("s3://bucket/x?profile=missing", Env({{"HOME", "/nonexistent"}}))
            .find("no profile 'missing'") != std::string::npos);

  const std::string root = TempRoot("aws_bad");
  std::filesystem::create_directories(root + "/.aws");
  std::ofstream(root + "/.aws/config") << "[default]\nregion eu-west-1\n";
  CHECK(error("s3://bucket", Env({{"HOME", root}})) ==
        root + "/.aws/config:2: expected 'key = value' or '[section]'");
  // A setting or a section given twice: an error naming both lines, never a silent choice.
  std::ofstream(root + "/.aws/config") << "[default]\nregion = a\nregion = b\n";
  CHECK(error("s3://bucket", Env({{"HOME", root}})) ==
        root + "/.aws/config: [default] region is given twice (lines 2 and 3): keep one of them");
  std::ofstream(root + "/.aws/config") << "[default]\nregion = a\n[default]\n";
  CHECK(error("s3://bucket", Env({{"HOME", root}})) ==
        root + "/.aws/config: [default] is given twice (lines 1 and 3): keep one of them");
  CHECK(error("s3://bucket/x?region=a&region=b").find("option 'region' is given twice") !=
        std::string::npos);
  std::filesystem::remove_all(root);

  // No message carries a secret.
  auto env = kKeys;
  env["AWS_SESSION_TOKEN"] = "token-value";
  for (const std::string uri : {"s3://bucket/x?parallel=100", "s3://Bad/x", "s3://bucket/x?y=1"}) {
    const std::string message = error(uri, Env(env));
    CHECK(message.find("secret-env") == std::string::npos);
    CHECK(message.find("token-value") == std::string::npos);
  }
  Result<Settings> fine = ResolveSettings("s3://bucket/x", Env(env));
  CHECK(fine->Describe().find("secret") == std::string::npos);
  CHECK(fine->Describe() ==
        "s3://bucket/x (endpoint https://s3.us-east-1.amazonaws.com, region us-east-1, "
        "virtual-hosted)");
}

}  // namespace
}  // namespace weft::policy_store::s3
