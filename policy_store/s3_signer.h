// AWS Signature Version 4 for S3 requests: the canonical request, the string to sign and the
// Authorization header, as the S3 API reference specifies them ("Authenticating Requests: Using
// the Authorization Header").
//
// The rules S3 differs from other AWS services in are followed: the path is URI-encoded once
// (each segment, '/' kept) and never normalised; query names and values are encoded (including
// '/') and sorted by name, then value, a valueless name written "name="; header names are
// lowercased and sorted, values trimmed with inner runs of blanks collapsed, repeated names joined
// by ','. The payload hash is the hex SHA-256 of the body or "UNSIGNED-PAYLOAD". Pure functions,
// no I/O: the secret key only enters the HMAC chain and appears in no output.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::policy_store::s3 {

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty: none (sent as x-amz-security-token, and signed)
};

// RFC 3986 percent-encoding as SigV4 wants it: A-Z a-z 0-9 - . _ ~ kept, every other byte %XX
// (uppercase hex); '/' kept when `keep_slash` (a path), encoded otherwise (a query value).
std::string UriEncode(std::string_view text, bool keep_slash);
// The inverse, for paths and queries read from request lines and listings ('+' stays '+').
std::string UriDecode(std::string_view text);

struct SigningInput {
  std::string method;  // GET, PUT, ...
  std::string path;    // the canonical URI: already encoded (UriEncode(key, true)), from '/'
  // Query parameters, not encoded (they are encoded here); the order does not matter.
  std::vector<std::pair<std::string, std::string>> query;
  // Every header to sign, `host` included (with ":port" when not the scheme's default); the
  // x-amz-date header is added here when absent.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
  std::string amz_date;      // "20150830T123600Z"
  std::string region;
  std::string service = "s3";
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // hex
  std::string authorization;  // the Authorization header's value
  std::string signed_headers;
};

Signature SignV4(const SigningInput& input, const Credentials& credentials);

// The query string as sent (and as signed): encoded, sorted, joined by '&'.
std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query);
// x-amz-date's form of a time: YYYYMMDD'T'HHMMSS'Z', in UTC.
std::string AmzDate(std::chrono::system_clock::time_point time);

}  // namespace weft::policy_store::s3
