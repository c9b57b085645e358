#include "policy_store/s3_store.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <cctype>
#include <cstring>
#include <ctime>
#include <sstream>
#include <thread>

#include "common/byte_io.h"
#include "common/concurrent.h"
#include "common/hex.h"
#include "common/logging.h"
#include "policy_store/http_store.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

using Tree = boost::property_tree::ptree;

constexpr char kEmptyHash[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// An XML answer as a tree (empty on malformed XML: callers then report what they missed).
Tree ParseXml(const std::vector<uint8_t>& body) {
  Tree tree;
  try {
    std::istringstream in(std::string(body.begin(), body.end()));
    boost::property_tree::read_xml(in, tree, boost::property_tree::xml_parser::trim_whitespace);
  } catch (const std::exception&) {
    return Tree();
  }
  return tree;
}

// The S3 error code and message of an answer's body (empty when it has none).
std::pair<std::string, std::string> ErrorOf(const std::vector<uint8_t>& body) {
  if (body.empty()) return {};
  Tree tree = ParseXml(body);
  return {tree.get<std::string>("Error.Code", ""), tree.get<std::string>("Error.Message", "")};
}

std::string Unquote(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  return etag;
}

bool SameBytes(const std::vector<uint8_t>& stored, std::span<const uint8_t> bytes) {
  return stored.size() == bytes.size() &&
         (bytes.empty() || std::memcmp(stored.data(), bytes.data(), bytes.size()) == 0);
}

// "2026-12-01T10:00:00.000Z" as a time (the epoch when malformed).
std::chrono::system_clock::time_point ParseIsoTime(const std::string& text) {
  std::tm tm{};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

// The ETag S3 gives an object completed from parts with these ETags: the MD5 of their binary MD5s,
// "-", their count. None when a part's ETag is no plain MD5 (encrypted objects, other services).
std::optional<std::string> MultipartEtag(const std::vector<std::string>& part_etags) {
  std::string digests;
  for (const std::string& quoted : part_etags) {
    const std::string etag = Unquote(quoted);
    if (etag.size() != 32) return std::nullopt;
    for (size_t i = 0; i < 32; i += 2) {
      const int high = std::isxdigit(static_cast<unsigned char>(etag[i]))
                           ? std::stoi(etag.substr(i, 1), nullptr, 16)
                           : -1;
      const int low = std::isxdigit(static_cast<unsigned char>(etag[i + 1]))
                          ? std::stoi(etag.substr(i + 1, 1), nullptr, 16)
                          : -1;
      if (high < 0 || low < 0) return std::nullopt;
      digests.push_back(static_cast<char>(high * 16 + low));
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(digests.data(), digests.size(), digest, &length, EVP_md5(), nullptr);
  return HexEncode({digest, length}) + "-" + std::to_string(part_etags.size());
}

void Backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20 << std::min(attempt, 8)));
}

}  // namespace

S3Store::S3Store(s3::Settings settings, S3StoreOptions options)
    : settings_(std::move(settings)),
      client_(
          [&] {
            if (settings_.path_style) return settings_.endpoint;
            const size_t host = settings_.endpoint.find("://") + 3;
            return settings_.endpoint.substr(0, host) + settings_.bucket + "." +
                   settings_.endpoint.substr(host);
          }(),
          [&] {
            HttpClientOptions client = options;
            if (!settings_.ca_file.empty()) client.ca_file = settings_.ca_file;
            return client;
          }()) {
  const std::string& base = client_.base_url();
  host_ = base.substr(base.find("://") + 3);
  // The Host header carries a port only when it is not the scheme's default.
  if (base.rfind("http://", 0) == 0 && host_.size() > 3 && host_.ends_with(":80"))
    host_.resize(host_.size() - 3);
  if (base.rfind("https://", 0) == 0 && host_.size() > 4 && host_.ends_with(":443"))
    host_.resize(host_.size() - 4);
  base_path_ = settings_.path_style ? "/" + settings_.bucket : "";
}

std::string S3Store::FullKey(const std::string& key) const {
  return settings_.prefix.empty() ? key : settings_.prefix + "/" + key;
}

std::string S3Store::What(const std::string& method, const std::string& key) const {
  return method + " " + settings_.Uri() + "/" + key;
}

Result<HttpReply> S3Store::Send(const Call& call) {
  const std::string key = call.raw_key ? call.key : (call.key.empty() ? "" : FullKey(call.key));
  std::string path = base_path_;
  if (!key.empty()) {
    path += "/" + s3::UriEncode(key, true);
  } else if (path.empty()) {
    path = "/";
  }
  HttpRequest request;
  request.method = call.method;
  const std::string query = s3::CanonicalQuery(call.query);
  request.path = query.empty() ? path : path + "?" + query;
  request.body = call.body;
  request.range = call.range;
  request.target = call.target;
  request.idempotent = call.idempotent;
  request.retry_server_errors = call.retry_server_errors;
  std::vector<std::pair<std::string, std::string>> signed_headers = call.headers;
  if ((call.method == "PUT" || call.method == "POST") && !call.body.empty()) {
    bool typed = false;
    for (const auto& [name, value] : signed_headers) {
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
      typed = typed || lower == "content-type";
    }
    if (!typed) signed_headers.emplace_back("Content-Type", "application/octet-stream");
  }
  for (const auto& [name, value] : signed_headers) request.headers.push_back(name + ": " + value);
  // The payload hash is computed once per operation; the signature afresh for every try.
  const std::string payload = call.body.empty() ? kEmptyHash : Sha256Hex(call.body);
  request.sign = [this, method = call.method, path, query_items = call.query, signed_headers,
                  payload]() {
    s3::SigningInput input;
    input.method = method;
    input.path = path;
    input.query = query_items;
    input.headers = signed_headers;
    input.headers.emplace_back("host", host_);
    input.headers.emplace_back("x-amz-content-sha256", payload);
    if (!settings_.credentials.session_token.empty())
      input.headers.emplace_back("x-amz-security-token", settings_.credentials.session_token);
    input.payload_hash = payload;
    input.amz_date = s3::AmzDate(std::chrono::system_clock::now());
    input.region = settings_.region;
    const s3::Signature signature = s3::SignV4(input, settings_.credentials);
    std::vector<std::string> headers = {"Host: " + host_, "x-amz-date: " + input.amz_date,
                                        "x-amz-content-sha256: " + payload,
                                        "Authorization: " + signature.authorization};
    if (!settings_.credentials.session_token.empty())
      headers.push_back("x-amz-security-token: " + settings_.credentials.session_token);
    return headers;
  };
  return client_.Request(request);
}

Status S3Store::StatusOf(const HttpReply& reply, const std::string& what) const {
  if (reply.status >= 200 && reply.status < 300) return Status::Ok();
  auto [code, message] = ErrorOf(reply.body);
  std::string text = what + ": HTTP " + std::to_string(reply.status);
  if (!code.empty()) text += " " + code;
  if (!message.empty()) text += ": " + message;
  if (code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId" ||
      code == "RequestTimeTooSkewed") {
    text += " (check the credentials from " + settings_.credentials_from +
            ", the region and the clock)";
  } else if (code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed") {
    text += " (the bucket may be in another region than " + settings_.region + ")";
  }
  // A failed condition is a writer that came first.
  if (reply.status == 412) return Conflict(text);
  return StatusOfHttpCode(reply.status, text);
}

Result<std::pair<std::vector<uint8_t>, std::string>> S3Store::GetWithEtag(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const uint64_t range = settings_.range_size;
  for (int attempt = 0;; ++attempt) {
    Call first;
    first.key = key;
    first.range = std::pair<uint64_t, uint64_t>{0, range};
    WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(first));
    if (reply.status == 404) return NotFound(key + ": no such object");
    if (reply.status == 416) {
      // An empty object has no byte 0 to start a range at.
      first.range.reset();
      WEFT_ASSIGN_OR_RETURN(reply, Send(first));
      if (reply.status == 404) return NotFound(key + ": no such object");
    }
    WEFT_RETURN_IF_ERROR(StatusOf(reply, What("GET", key)));
    const std::string etag = reply.Header("etag");
    if (reply.status == 200) return std::pair{std::move(reply.body), etag};
    // 206: "bytes 0-N/TOTAL".
    const std::optional<uint64_t> size = reply.object_size;
    if (!size || *size < reply.body.size()) {
      return DataLoss(What("GET", key) + ": malformed Content-Range '" +
                      reply.Header("content-range") + "'");
    }
    const uint64_t total = *size;
    if (total == reply.body.size()) return std::pair{std::move(reply.body), etag};
    // The rest in parallel ranges, each checked to come from the same object (its ETag).
    std::vector<uint8_t> bytes(total);
    std::memcpy(bytes.data(), reply.body.data(), reply.body.size());
    reply.body = {};
    const uint64_t ranges = (total + range - 1) / range;
    const Status read =
        ForEachConcurrently(ranges - 1, settings_.parallel, [&](size_t i) -> Status {
          Call part;
          part.key = key;
          const uint64_t offset = (i + 1) * range;
          const uint64_t length = std::min<uint64_t>(range, total - offset);
          part.range = std::pair<uint64_t, uint64_t>{offset, length};
          WEFT_ASSIGN_OR_RETURN(HttpReply got, Send(part));
          WEFT_RETURN_IF_ERROR(StatusOf(got, What("GET", key)));
          if (got.Header("etag") != etag || got.status != 206 || got.body.size() != length)
            return Conflict(What("GET", key) + ": the object changed while it was read");
          std::memcpy(bytes.data() + offset, got.body.data(), length);
          return Status::Ok();
        });
    if (read.ok()) return std::pair{std::move(bytes), etag};
    if (read.code() != StatusCode::kConflict) return read;
    if (attempt >= 3)
      return Unavailable(What("GET", key) + ": the object changed while it was read, 4 times");
  }
}

Result<std::vector<uint8_t>> S3Store::Get(const std::string& key) {
  WEFT_ASSIGN_OR_RETURN(auto got, GetWithEtag(key));
  return std::move(got.first);
}

Result<ObjectRange> S3Store::GetRange(const std::string& key, uint64_t first, uint64_t length) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  Call call;
  call.key = key;
  call.range = std::pair<uint64_t, uint64_t>{first, length};
  WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
  if (reply.status == 404) return NotFound(key + ": no such object");
  if (reply.status != 416) WEFT_RETURN_IF_ERROR(StatusOf(reply, What("GET", key)));
  return RangeOfReply(std::move(reply), first, length, What("GET", key));
}

Result<RangeRead> S3Store::GetRangeInto(const std::string& key, uint64_t first,
                                        std::span<uint8_t> out) {
  return ReadInto(key, first, out);
}

Result<uint64_t> S3Store::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                 BodyTarget& target) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  Call call;
  call.key = key;
  // Always a range: an empty object answers 416 with its size, where a plain GET of a missing
  // range would not say it.
  call.range = std::pair<uint64_t, uint64_t>{first, std::min(length, UINT64_MAX - first)};
  call.target = &target;
  WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
  if (reply.status == 404) return NotFound(key + ": no such object");
  if (reply.status != 416) WEFT_RETURN_IF_ERROR(StatusOf(reply, What("GET", key)));
  return DeliveredRange(reply, first, call.range->second, What("GET", key));
}

Result<bool> S3Store::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  Call call;
  call.method = "HEAD";
  call.key = key;
  WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
  if (reply.status == 404) return false;
  WEFT_RETURN_IF_ERROR(StatusOf(reply, What("HEAD", key)));
  return true;
}

Result<std::vector<std::string>> S3Store::List(const std::string& prefix) {
  WEFT_ASSIGN_OR_RETURN(auto listed, ListModified(prefix));
  std::vector<std::string> keys;
  keys.reserve(listed.size());
  for (auto& [key, modified] : listed) keys.push_back(std::move(key));
  return keys;
}

Result<std::vector<std::pair<std::string, std::chrono::system_clock::time_point>>>
S3Store::ListModified(const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("list prefix must end in '/'");
  WEFT_RETURN_IF_ERROR(ValidateKey(prefix.substr(0, prefix.size() - 1)));
  const std::string base = settings_.prefix.empty() ? "" : settings_.prefix + "/";
  std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> keys;
  std::string token;
  for (int page = 0;; ++page) {
    Call call;
    call.query = {{"list-type", "2"},
                  {"prefix", base + prefix},
                  {"encoding-type", "url"},
                  {"max-keys", std::to_string(settings_.list_page)}};
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
    WEFT_RETURN_IF_ERROR(StatusOf(reply, What("LIST", prefix)));
    Tree tree = ParseXml(reply.body);
    const auto result = tree.get_child_optional("ListBucketResult");
    if (!result) return DataLoss(What("LIST", prefix) + ": the answer is no ListBucketResult");
    for (const auto& [name, child] : *result) {
      if (name != "Contents") continue;
      const std::string key = s3::UriDecode(child.get<std::string>("Key", ""));
      if (key.rfind(base, 0) != 0) continue;
      std::string relative = key.substr(base.size());
      // Objects other tools put there, under names no store key has, are not the store's.
      if (!ValidateKey(relative).ok()) continue;
      keys.emplace_back(std::move(relative),
                        ParseIsoTime(child.get<std::string>("LastModified", "")));
    }
    if (result->get<std::string>("IsTruncated", "false") != "true") break;
    token = result->get<std::string>("NextContinuationToken", "");
    if (token.empty())
      return DataLoss(What("LIST", prefix) + ": a truncated listing without a continuation token");
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status S3Store::CompareExisting(const std::string& key, std::span<const uint8_t> bytes) {
  Result<std::vector<uint8_t>> stored = Get(key);
  if (!stored.ok()) return stored.status();
  if (SameBytes(*stored, bytes)) return Status::Ok();
  return Conflict(key + ": already holds other bytes (" + std::to_string(stored->size()) +
                  " stored, " + std::to_string(bytes.size()) + " written)");
}

Status S3Store::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(const bool conditional_completion, CheckConditionalWrites());
  if (bytes.size() >= settings_.multipart_threshold && bytes.size() > settings_.part_size)
    return PutMultipart(key, bytes, conditional_completion);
  return PutSingle(key, bytes);
}

Status S3Store::PutSingle(const std::string& key, std::span<const uint8_t> bytes) {
  for (int attempt = 0;; ++attempt) {
    Call call;
    call.method = "PUT";
    call.key = key;
    call.headers = {{"If-None-Match", "*"}};
    call.body = bytes;
    // Repeating it is harmless: a repeat of a write that landed finds the same bytes.
    Result<HttpReply> sent = Send(call);
    if (!sent.ok()) {
      // Given up on (5xx answers, no answers): the key may hold these bytes all the same (a try
      // that landed, or another writer of them), or others (Ceph RGW answers 500 to the loser of
      // a race on the condition).
      Status existing = CompareExisting(key, bytes);
      return existing.code() == StatusCode::kNotFound || existing.code() == StatusCode::kUnavailable
                 ? sent.status()
                 : existing;
    }
    HttpReply& reply = *sent;
    if (reply.status == 412) {
      Status existing = CompareExisting(key, bytes);
      if (existing.code() != StatusCode::kNotFound) return existing;
    } else if (reply.status != 409) {
      return StatusOf(reply, What("PUT", key));
    }
    // 409: a concurrent operation on the key (S3 asks to retry); 412 then gone: deleted meanwhile.
    if (attempt >= 8) return StatusOf(reply, What("PUT", key));
    Backoff(attempt);
  }
}

Result<std::string> S3Store::StartUpload(const std::string& key) {
  Call create;
  create.method = "POST";
  create.key = key;
  create.query = {{"uploads", ""}};
  create.headers = {{"Content-Type", "application/octet-stream"}};
  create.idempotent = false;  // a repeat would start a second upload
  WEFT_ASSIGN_OR_RETURN(HttpReply created, Send(create));
  WEFT_RETURN_IF_ERROR(StatusOf(created, What("POST", key) + "?uploads"));
  const std::string upload =
      ParseXml(created.body).get<std::string>("InitiateMultipartUploadResult.UploadId", "");
  if (upload.empty()) return DataLoss(What("POST", key) + "?uploads: the answer holds no UploadId");
  return upload;
}

Result<std::string> S3Store::UploadPart(const std::string& key, const std::string& upload,
                                        int number, std::span<const uint8_t> bytes) {
  Call call;
  call.method = "PUT";
  call.key = key;
  call.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload}};
  call.body = bytes;
  const std::string what = What("PUT", key) + " part " + std::to_string(number);
  WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
  WEFT_RETURN_IF_ERROR(StatusOf(reply, what));
  if (reply.Header("etag").empty()) return DataLoss(what + ": the answer holds no ETag");
  return reply.Header("etag");
}

Result<HttpReply> S3Store::CompleteUpload(const std::string& key, const std::string& upload,
                                          const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] +
           "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Call complete;
  complete.method = "POST";
  complete.key = key;
  complete.query = {{"uploadId", upload}};
  complete.headers = {{"Content-Type", "application/xml"}, {"If-None-Match", "*"}};
  complete.body = TextBytes(xml);
  return Send(complete);
}

void S3Store::AbortUpload(const std::string& key, const std::string& upload) {
  Call call;
  call.method = "DELETE";
  call.key = key;
  call.query = {{"uploadId", upload}};
  (void)Send(call);  // what it leaves, `store gc` aborts
}

Status S3Store::PutMultipart(const std::string& key, std::span<const uint8_t> bytes,
                             bool conditional) {
  if (!conditional) {
    // The service would complete over an existing object: look first.
    WEFT_ASSIGN_OR_RETURN(bool exists, Exists(key));
    if (exists) return CompareExisting(key, bytes);
  }
  // A completion that raced another write of the key is answered 409 ConditionalRequestConflict
  // by AWS, which asks for the upload to be started again: so it is, a few times.
  constexpr int kUploads = 4;
  std::vector<std::string> etags;
  Result<HttpReply> done = Unavailable("");
  std::string code;
  for (int round = 0;; ++round) {
    WEFT_ASSIGN_OR_RETURN(const std::string upload, StartUpload(key));
    const uint64_t part_size = settings_.part_size;
    const uint64_t parts = (bytes.size() + part_size - 1) / part_size;
    etags.assign(parts, "");
    const Status sent = ForEachConcurrently(parts, settings_.parallel, [&](size_t i) -> Status {
      const uint64_t offset = i * part_size;
      WEFT_ASSIGN_OR_RETURN(
          etags[i],
          UploadPart(key, upload, static_cast<int>(i + 1),
                     bytes.subspan(offset, std::min<uint64_t>(part_size, bytes.size() - offset))));
      return Status::Ok();
    });
    if (!sent.ok()) {
      AbortUpload(key, upload);
      return sent;
    }
    done = CompleteUpload(key, upload, etags);
    if (!done.ok()) {
      AbortUpload(key, upload);
      return done.status();
    }
    // Completion can fail with 200 and an error in the body.
    code = ErrorOf(done->body).first;
    const bool raced = done->status == 409 || code == "ConditionalRequestConflict";
    if (!raced) {
      if (done->status == 412 || code == "PreconditionFailed" ||
          (done->status == 404 && code == "NoSuchUpload") || !code.empty() || done->status != 200) {
        AbortUpload(key, upload);
      }
      break;
    }
    AbortUpload(key, upload);
    ++conflicts_restarted_;
    if (round + 1 >= kUploads) {
      return Unavailable(What("POST", key) +
                         " (completing the upload): " + std::to_string(kUploads) +
                         " uploads in a row met a concurrent write of the key "
                         "(ConditionalRequestConflict)");
    }
    Backoff(round);
  }
  if (done->status == 412 || code == "PreconditionFailed" ||
      (done->status == 404 && code == "NoSuchUpload")) {
    // The key exists (or a repeated completion found its upload already completed): compare.
    return CompareExisting(key, bytes);
  }
  if (!code.empty() || done->status != 200) {
    HttpReply failed = *done;
    if (failed.status == 200) failed.status = 500;
    return StatusOf(failed, What("POST", key) + " (completing the upload)");
  }
  if (!conditional) {
    // Another writer may have completed over ours: the object must be the one whose parts we
    // sent. Its ETag is the MD5 of the parts' MD5s and their count (where the parts' ETags are
    // plain MD5s; otherwise its bytes are compared).
    Call head;
    head.method = "HEAD";
    head.key = key;
    WEFT_ASSIGN_OR_RETURN(HttpReply stored, Send(head));
    WEFT_RETURN_IF_ERROR(StatusOf(stored, What("HEAD", key)));
    std::optional<std::string> expected = MultipartEtag(etags);
    if (!expected || Unquote(stored.Header("etag")) != *expected)
      return CompareExisting(key, bytes);
  }
  return Status::Ok();
}

Status S3Store::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                               const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_RETURN_IF_ERROR(CheckConditionalWrites().status());
  const std::span<const uint8_t> wanted = TextBytes(desired);
  for (int attempt = 0;; ++attempt) {
    Call call;
    call.method = "PUT";
    call.key = key;
    call.body = wanted;
    // Not repeated by the client: after a lost answer the write may have landed (checked below);
    // an answer of 5xx comes back here too.
    call.idempotent = false;
    call.retry_server_errors = false;
    if (expected) {
      Result<std::pair<std::vector<uint8_t>, std::string>> current = GetWithEtag(key);
      if (current.status().code() == StatusCode::kNotFound)
        return Conflict(key + ": compare-and-swap expected an object, there is none");
      if (!current.ok()) return current.status();
      if (!SameBytes(current->first, TextBytes(*expected)))
        return Conflict(key + ": compare-and-swap lost: it holds other bytes than expected");
      // Unquoted: Ceph RGW compares the header with the stored ETag byte for byte; AWS and the
      // others accept both forms.
      call.headers = {{"If-Match", Unquote(current->second)}};
    } else {
      call.headers = {{"If-None-Match", "*"}};
    }
    Result<HttpReply> reply = Send(call);
    // What the object holds now, after a write that was refused or whose answer was lost.
    auto unchanged = [&](const Result<std::vector<uint8_t>>& now) {
      return expected ? now.ok() && SameBytes(*now, TextBytes(*expected))
                      : now.status().code() == StatusCode::kNotFound;
    };
    if (reply.ok()) {
      if (reply->status == 412 || reply->status == 404)
        return Conflict(key + ": compare-and-swap lost: another writer changed it first");
      if (reply->status / 100 == 2) return Status::Ok();
      if (reply->status != 409 && reply->status < 500) return StatusOf(*reply, What("PUT", key));
      // 409 or 5xx: refused, not applied (Ceph RGW answers 500 to the loser of a race on the
      // condition). Tried again while the object still holds what was expected.
      Result<std::vector<uint8_t>> now = Get(key);
      if (!unchanged(now)) {
        if (!now.ok() && now.status().code() != StatusCode::kNotFound) return now.status();
        return Conflict(key + ": compare-and-swap lost: another writer changed it first");
      }
      if (attempt >= 8) return StatusOf(*reply, What("PUT", key));
    } else {
      // No answer: the write may or may not have landed. Look at what the object holds now.
      Result<std::vector<uint8_t>> now = Get(key);
      WEFT_LOG(kWarning) << What("PUT", key) << ": compare-and-swap without an answer ("
                         << reply.status().message() << "); it now holds "
                         << (now.ok() ? (SameBytes(*now, wanted) ? "the new bytes" : "other bytes")
                                      : now.status().message());
      if (now.ok() && SameBytes(*now, wanted)) return Status::Ok();
      if (!unchanged(now))
        return now.ok() ? Conflict(key + ": compare-and-swap lost") : now.status();
      if (attempt >= 4) return reply.status();
    }
    if (attempt >= 8) return Conflict(key + ": compare-and-swap kept meeting concurrent writes");
    Backoff(attempt);
  }
}

Status S3Store::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  Call call;
  call.method = "DELETE";
  call.key = key;
  WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
  if (reply.status == 404) return Status::Ok();  // already gone
  return StatusOf(reply, What("DELETE", key));
}

Result<bool> S3Store::CheckConditionalWrites() {
  MutexLock lock(probe_mutex_);
  if (multipart_conditional_) return *multipart_conditional_;
  uint8_t random[8];
  RAND_bytes(random, sizeof(random));
  const std::string key = kProbePrefix + HexEncode(random);
  const std::string refuse =
      settings_.Describe() + ": the service does not honour conditional writes (";
  const std::string why =
      "); weft keeps immutable objects and the `latest` pointer safe from concurrent writers "
      "with them, and does not write to a store without them";
  auto put = [&](const std::string& header, const std::string& value,
                 const std::string& body) -> Result<HttpReply> {
    Call call;
    call.method = "PUT";
    call.key = key;
    call.headers = {{header, value}};
    call.body = TextBytes(body);
    return Send(call);
  };
  // The probe object goes again however the check ends.
  struct Cleanup {
    std::function<void()> run;
    ~Cleanup() { run(); }
  } cleanup{[&] {
    Call call;
    call.method = "DELETE";
    call.key = key;
    (void)Send(call);
  }};
  WEFT_ASSIGN_OR_RETURN(HttpReply created, put("If-None-Match", "*", "1"));
  WEFT_RETURN_IF_ERROR(StatusOf(created, What("PUT", key) + " (checking conditional writes)"));
  WEFT_ASSIGN_OR_RETURN(HttpReply again, put("If-None-Match", "*", "2"));
  if (again.status != 412) {
    if (again.status / 100 == 2)
      return InvalidArgument(refuse + "a second PUT with If-None-Match: * replaced the object" +
                             why);
    return StatusOf(again, What("PUT", key) + " (checking conditional writes)");
  }
  WEFT_ASSIGN_OR_RETURN(HttpReply mismatched, put("If-Match", "0123456789abcdef", "3"));
  if (mismatched.status != 412) {
    if (mismatched.status / 100 == 2)
      return InvalidArgument(refuse + "a PUT with a wrong If-Match ETag replaced the object" + why);
    return StatusOf(mismatched, What("PUT", key) + " (checking conditional writes)");
  }
  // Completing a multipart upload over the existing probe with If-None-Match: *.
  WEFT_ASSIGN_OR_RETURN(const std::string upload, StartUpload(key));
  Result<std::string> part = UploadPart(key, upload, 1, TextBytes("4"));
  Result<HttpReply> done = part.ok() ? CompleteUpload(key, upload, {*part}) : part.status();
  AbortUpload(key, upload);
  if (!done.ok()) return done.status();
  const bool multipart = done->status == 412 || ErrorOf(done->body).first == "PreconditionFailed";
  multipart_conditional_ = multipart;
  return multipart;
}

Status S3Store::ForEachUpload(
    const std::function<void(const std::string&, const std::string&,
                             std::chrono::system_clock::time_point)>& fn) {
  const std::string base = settings_.prefix.empty() ? "" : settings_.prefix + "/";
  std::string key_marker, id_marker;
  while (true) {
    Call call;
    call.query = {{"uploads", ""}, {"encoding-type", "url"}};
    if (!base.empty()) call.query.emplace_back("prefix", base);
    if (!key_marker.empty()) call.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) call.query.emplace_back("upload-id-marker", id_marker);
    WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
    WEFT_RETURN_IF_ERROR(StatusOf(reply, "GET " + settings_.Uri() + "/?uploads"));
    Tree tree = ParseXml(reply.body);
    const auto result = tree.get_child_optional("ListMultipartUploadsResult");
    if (!result) return DataLoss(settings_.Uri() + ": the upload listing is malformed");
    for (const auto& [name, child] : *result) {
      if (name != "Upload") continue;
      const std::string key = s3::UriDecode(child.get<std::string>("Key", ""));
      if (key.rfind(base, 0) != 0) continue;
      fn(key.substr(base.size()), child.get<std::string>("UploadId", ""),
         ParseIsoTime(child.get<std::string>("Initiated", "")));
    }
    if (result->get<std::string>("IsTruncated", "false") != "true") return Status::Ok();
    key_marker = s3::UriDecode(result->get<std::string>("NextKeyMarker", ""));
    id_marker = result->get<std::string>("NextUploadIdMarker", "");
    if (key_marker.empty() && id_marker.empty())
      return DataLoss(settings_.Uri() + ": a truncated upload listing without markers");
  }
}

Result<size_t> S3Store::AbortUploadsBefore(std::chrono::system_clock::time_point cutoff,
                                           const std::function<bool(const std::string&)>& which) {
  std::vector<std::pair<std::string, std::string>> stale;
  WEFT_RETURN_IF_ERROR(ForEachUpload([&](const std::string& key, const std::string& id,
                                         std::chrono::system_clock::time_point started) {
    if (started < cutoff && (!which || which(key))) stale.emplace_back(key, id);
  }));
  for (const auto& [key, id] : stale) {
    Call call;
    call.method = "DELETE";
    call.key = key;
    call.query = {{"uploadId", id}};
    WEFT_ASSIGN_OR_RETURN(HttpReply reply, Send(call));
    if (reply.status != 404)
      WEFT_RETURN_IF_ERROR(StatusOf(reply, What("DELETE", key) + "?uploadId (abandoned upload)"));
  }
  return stale.size();
}

Result<size_t> S3Store::DeleteProbesBefore(std::chrono::system_clock::time_point cutoff) {
  const std::string prefix = kProbePrefix;
  WEFT_ASSIGN_OR_RETURN(auto probes, ListModified(prefix));
  size_t deleted = 0;
  for (const auto& [key, modified] : probes) {
    // A check under way (a probe lives for a second or two), or a time the listing did not give.
    if (modified == std::chrono::system_clock::time_point{} || modified >= cutoff) continue;
    WEFT_RETURN_IF_ERROR(Delete(key));
    ++deleted;
  }
  return deleted;
}

Result<std::vector<std::string>> S3Store::ListUploads() {
  std::vector<std::string> keys;
  WEFT_RETURN_IF_ERROR(
      ForEachUpload([&](const std::string& key, const std::string&,
                        std::chrono::system_clock::time_point) { keys.push_back(key); }));
  return keys;
}

}  // namespace weft::policy_store
