#include "tests/fuzz/store_endpoints.h"

#include <cstdio>
#include <cstdlib>
#include <span>

#include "common/byte_io.h"
#include "policy_store/manifest.h"

namespace weft::fuzz {
namespace {

using namespace std::string_literals;

const std::string& SmallBlob() {
  static const std::string blob = "hello weft\n";
  return blob;
}

const std::string& LargeBlob() {
  static const std::string blob = [] {
    std::string bytes(100000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 % 251);
    return bytes;
  }();
  return blob;
}

std::string BlobPath(const std::string& blob) {
  return "/v1/objects/" + policy_store::BlobKey(policy_store::Sha256Hex(TextBytes(blob)));
}

[[noreturn]] void Fail(const std::string& what, const Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.message().c_str());
  std::abort();
}

}  // namespace

std::unique_ptr<policy_store::DirectoryStore> OpenSeededStore(const std::string& root) {
  auto opened = policy_store::DirectoryStore::Open(root);
  if (!opened.ok()) Fail("cannot open the store " + root, opened.status());
  std::unique_ptr<policy_store::DirectoryStore> store = std::move(opened).value();
  const std::string manifest = R"({"run": "r", "version": 0, "tensors": []})";
  for (const std::string* blob : {&SmallBlob(), &LargeBlob()}) {
    const std::string key = policy_store::BlobKey(policy_store::Sha256Hex(TextBytes(*blob)));
    Status put = store->PutImmutable(key, TextBytes(*blob));
    if (!put.ok()) Fail("cannot seed the store", put);
  }
  Status put = store->PutImmutable(policy_store::ManifestKey("r", 0), TextBytes(manifest));
  if (put.ok()) put = store->CompareAndSwap(policy_store::LatestKey("r"), std::nullopt, "0");
  if (!put.ok()) Fail("cannot seed the store", put);
  return store;
}

std::vector<Endpoint> StoreEndpoints(int read_server, int write_server) {
  const std::string small = BlobPath(SmallBlob()), large = BlobPath(LargeBlob());
  const std::string etag = "\"" + policy_store::Sha256Hex(TextBytes(LargeBlob())) + "\"";
  const int r = read_server, w = write_server;
  return {
      {"GET", small, "", r, {"", "Range: bytes=0-3\0"s}},
      {"GET",
       large,
       "",
       r,
       {"Range: bytes=100-2000\0"s, "Range: bytes=-10\0"s,
        "Range: bytes=99990-\nIf-Range: " + etag + "\0"s, "If-None-Match: " + etag + "\0"s,
        "Range: bytes=5-1\0"s}},
      {"HEAD", large, "", r, {"", "Range: bytes=0-0\0"s}},
      {"GET", "/v1/objects/runs/r/latest", "", r, {""}},
      {"GET", "/v1/objects/" + policy_store::ManifestKey("r", 0), "", r, {""}},
      {"GET",
       "/v1/objects/",
       "",
       r,
       {"runs/r/latest\0\0"s, "runs/r\0\0"s, "../etc/passwd\0\0"s, "runs/.lock\0\0"s,
        "blobs/abc\0\0"s, "blobs/$H\0\0hello"s}},
      {"PUT",
       "/v1/objects/",
       "writer",
       w,
       {"fuzz/a\0\0x"s, "blobs/$H\0\0some bytes"s, "blobs/$H\0If-None-Match: *\0more bytes"s,
        "blobs/$H\0Expect: 100-continue\0hello"s}},
      {"PUT", small, "writer", w, {SmallBlob()}},
      {"DELETE", "/v1/objects/", "writer", w, {"fuzz/a\0\0"s}},
      {"POST",
       "/v1/cas/runs/r/latest",
       "writer",
       w,
       {R"({"expected": "0", "desired": "1"})", R"({"expected": "1", "desired": "0"})"}},
      {"POST",
       "/v1/cas/",
       "writer",
       w,
       {"runs/fuzz/latest\0\0{\"expected\": null, \"desired\": \"a\"}"s}},
      {"GET", "/v1/list/", "", r, {"runs/\0\0"s, "blobs/\0\0"s, "\0\0"s, "runs/r/\0\0"s}},
      {"HEAD", "/livez", "", r, {""}},
      {"GET", "/v1/stats", "", r, {""}},
      {"PUT", "/v1/objects/blobs/$H", "writer", r, {"written to the server read from"}},
      {"GET", "/v1/objects/blobs/$H", "", r, {"some bytes", "hello"}},
  };
}

std::vector<std::string> StoreRawSeeds() {
  const std::string auth = "Authorization: Bearer "s + kWriterToken + "\r\n";
  const std::string cas = R"({"expected": null, "desired": ""})";
  return {
      "GET /v1/objects/runs/r/latest HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET " + BlobPath(LargeBlob()) + " HTTP/1.1\r\nHost: x\r\nRange: bytes=10-20\r\n\r\nGET " +
          BlobPath(SmallBlob()) + " HTTP/1.0\r\n\r\n",
      "PUT /v1/objects/fuzz/raw HTTP/1.1\r\nHost: x\r\n" + auth +
          "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
      "POST /v1/cas/runs/fuzz/pins/raw HTTP/1.1\r\nHost: x\r\n" + auth +
          "Content-Length: " + std::to_string(cas.size()) + "\r\n\r\n" + cas,
      "GET /v1/list/runs/ HTTP/1.1\r\nHost: x\r\n\r\n",
  };
}

void ExpandBlobHash(const Endpoint&, std::string* path, std::string* body) {
  const size_t at = path->find("$H");
  if (at != std::string::npos) path->replace(at, 2, policy_store::Sha256Hex(TextBytes(*body)));
}

}  // namespace weft::fuzz
