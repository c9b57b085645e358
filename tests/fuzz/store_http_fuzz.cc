// libFuzzer target: the store server's HTTP API (docs/api.md, "Store API"), in-process.
//
// One StoreServer over a DirectoryStore in a fresh directory, with a writer token, started once per
// process on 127.0.0.1 port 0 and holding a small run (two blobs, a manifest, `latest`). Inputs are
// sent as tests/fuzz/http_fuzz.h describes, over the endpoint table of store_endpoints.h; in a
// structured request, $H in the path is the SHA-256 of the body, so blob uploads of any body can
// succeed.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/logging.h"
#include "policy_store/directory_store.h"
#include "policy_store/store_server.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/http_fuzz.h"
#include "tests/fuzz/store_endpoints.h"

namespace weft::fuzz {
namespace {

struct Store {
  std::string dir;
  std::unique_ptr<policy_store::DirectoryStore> store;
  std::unique_ptr<policy_store::StoreServer> server;
};

Store& The() {
  static Store* store = new Store();  // outlives the exit handlers
  return *store;
}

Target& TheTarget() {
  static Target* target = new Target{
      "store_http_fuzz",
      StoreEndpoints(/*server=*/0, /*writable=*/true),
      [](int) { return The().server->port(); },
      [](const std::string& role) { return role == "writer" ? kWriterToken : ""; },
      ExpandBlobHash,
      nullptr,
      [] { CheckAlive(The().server->port(), "the store server"); },
      StoreRawSeeds(),
  };
  return *target;
}

void StopAtExit() {
  Store& s = The();
  if (s.server) s.server->Stop();
  s.server.reset();
  std::filesystem::remove_all(s.dir);
}

}  // namespace
}  // namespace weft::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace weft::fuzz;
  const std::string seeds = SeedDirectoryArgument(*argc, *argv);
  if (!seeds.empty()) WriteSeedsAndExit(seeds, SeedsOf(TheTarget()));
  weft::SetLogLevel(weft::LogLevel::kError);
  Store& s = The();
  s.dir = FreshDirectory("store_http");
  s.store = OpenSeededStore(s.dir + "/store");
  weft::policy_store::StoreServerOptions options;
  options.writer_token = kWriterToken;
  options.threads = 2;
  options.read_timeout = std::chrono::seconds(5);
  auto server = weft::policy_store::StoreServer::Start(*s.store, options);
  if (!server.ok()) {
    std::fprintf(stderr, "the store server does not start: %s\n",
                 server.status().message().c_str());
    std::abort();
  }
  s.server = std::move(server).value();
  std::atexit(StopAtExit);
  CountAnswersAtExit("store_http_fuzz");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::fuzz::RunInput(weft::fuzz::TheTarget(), data, size);
  return 0;
}
