#include "policy_store/s3_signer.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <ctime>
#include <map>

#include "common/byte_io.h"
#include "common/hex.h"
#include "policy_store/manifest.h"

namespace weft::policy_store::s3 {
namespace {

std::string Hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &length);
  return std::string(reinterpret_cast<char*>(out), length);
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// A header value as signed: trimmed, inner runs of blanks (spaces, tabs, line breaks of a folded
// value) collapsed to one space.
std::string CanonicalValue(std::string_view value) {
  std::string out;
  bool blank = false;
  for (char c : value) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      blank = !out.empty();
      continue;
    }
    if (blank) out.push_back(' ');
    blank = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string UriEncode(std::string_view text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 15]);
    }
  }
  return out;
}

std::string UriDecode(std::string_view text) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && digit(text[i + 1]) >= 0 &&
        digit(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(digit(text[i + 1]) * 16 + digit(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query)
    encoded.emplace_back(UriEncode(name, false), UriEncode(value, false));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out.push_back('&');
    out += name + "=" + value;
  }
  return out;
}

std::string AmzDate(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

Signature SignV4(const SigningInput& input, const Credentials& credentials) {
  // Lowercased names, values joined in the order given when a name repeats.
  std::map<std::string, std::string> headers;
  for (const auto& [name, value] : input.headers) {
    std::string& joined = headers[Lower(name)];
    if (!joined.empty()) joined.push_back(',');
    joined += CanonicalValue(value);
  }
  if (headers.count("x-amz-date") == 0) headers["x-amz-date"] = input.amz_date;
  Signature out;
  std::string canonical_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += name + ":" + value + "\n";
    if (!out.signed_headers.empty()) out.signed_headers.push_back(';');
    out.signed_headers += name;
  }
  out.canonical_request = input.method + "\n" + input.path + "\n" + CanonicalQuery(input.query) +
                          "\n" + canonical_headers + "\n" + out.signed_headers + "\n" +
                          input.payload_hash;
  const std::string day = input.amz_date.substr(0, 8);
  const std::string scope = day + "/" + input.region + "/" + input.service + "/aws4_request";
  out.string_to_sign = "AWS4-HMAC-SHA256\n" + input.amz_date + "\n" + scope + "\n" +
                       Sha256Hex(TextBytes(out.canonical_request));
  std::string key = Hmac("AWS4" + credentials.secret_key, day);
  key = Hmac(key, input.region);
  key = Hmac(key, input.service);
  key = Hmac(key, "aws4_request");
  out.signature = HexEncode(TextBytes(Hmac(key, out.string_to_sign)));
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + scope +
                      ", SignedHeaders=" + out.signed_headers + ", Signature=" + out.signature;
  return out;
}

}  // namespace weft::policy_store::s3
