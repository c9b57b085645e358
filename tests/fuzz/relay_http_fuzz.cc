// libFuzzer target: a relay's HTTP API (docs/api.md, "Relay"), in-process.
//
// A Relay (its cache in a fresh directory, bounded to 1 MiB so that eviction happens) in front of a
// StoreServer over a DirectoryStore holding a small run, both started once per process on
// 127.0.0.1 port 0. Inputs are sent as tests/fuzz/http_fuzz.h describes, over the endpoint table
// of store_endpoints.h: reads go to the relay, writes to the store behind it (the relay is
// read-only; one endpoint sends it a write anyway), so that blobs the fuzzer puts upstream ($H:
// the SHA-256 of the body) are then fetched, checked and cached by the relay. Both servers must
// keep answering GET /livez.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/logging.h"
#include "policy_store/directory_store.h"
#include "policy_store/relay.h"
#include "policy_store/store_server.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/http_fuzz.h"
#include "tests/fuzz/store_endpoints.h"

namespace weft::fuzz {
namespace {

struct Servers {
  std::string dir;
  std::unique_ptr<policy_store::DirectoryStore> store;
  std::unique_ptr<policy_store::StoreServer> upstream;
  std::unique_ptr<policy_store::Relay> relay;
};

Servers& The() {
  static Servers* servers = new Servers();  // outlives the exit handlers
  return *servers;
}

Target& TheTarget() {
  static Target* target = new Target{
      "relay_http_fuzz",
      StoreEndpoints(/*read_server=*/0, /*write_server=*/1),
      [](int server) { return server == 0 ? The().relay->port() : The().upstream->port(); },
      [](const std::string& role) { return role == "writer" ? kWriterToken : ""; },
      ExpandBlobHash,
      nullptr,
      [] {
        CheckAlive(The().relay->port(), "the relay");
        CheckAlive(The().upstream->port(), "the store server behind the relay");
      },
      StoreRawSeeds(),
  };
  return *target;
}

[[noreturn]] void Fail(const std::string& what, const Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.message().c_str());
  std::abort();
}

void StopAtExit() {
  Servers& s = The();
  if (s.relay) s.relay->Stop();
  if (s.upstream) s.upstream->Stop();
  s.relay.reset();
  s.upstream.reset();
  std::filesystem::remove_all(s.dir);
}

}  // namespace
}  // namespace weft::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace weft::fuzz;
  const std::string seeds = SeedDirectoryArgument(*argc, *argv);
  if (!seeds.empty()) WriteSeedsAndExit(seeds, SeedsOf(TheTarget()));
  weft::SetLogLevel(weft::LogLevel::kError);
  Servers& s = The();
  s.dir = FreshDirectory("relay_http");
  s.store = OpenSeededStore(s.dir + "/store");
  weft::policy_store::StoreServerOptions store_options;
  store_options.writer_token = kWriterToken;
  store_options.threads = 2;
  store_options.read_timeout = std::chrono::seconds(5);
  auto upstream = weft::policy_store::StoreServer::Start(*s.store, store_options);
  if (!upstream.ok()) Fail("the store server does not start", upstream.status());
  s.upstream = std::move(upstream).value();
  weft::policy_store::RelayOptions options;
  options.upstream = "http://127.0.0.1:" + std::to_string(s.upstream->port());
  options.cache_dir = s.dir + "/cache";
  options.cache_bytes = uint64_t{1} << 20;
  options.deadline = std::chrono::milliseconds(3000);
  options.threads = 4;
  auto relay = weft::policy_store::Relay::Start(options);
  if (!relay.ok()) Fail("the relay does not start", relay.status());
  s.relay = std::move(relay).value();
  std::atexit(StopAtExit);
  CountAnswersAtExit("relay_http_fuzz");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::fuzz::RunInput(weft::fuzz::TheTarget(), data, size);
  return 0;
}
