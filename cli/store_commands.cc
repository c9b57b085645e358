// weft store publish | pull | ls | gc | serve: the policy store from the command line.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "cli/commands.h"
#include "common/parallel.h"
#include "common/units.h"
#include "policy_store/caching_store.h"
#include "policy_store/http_store.h"
#include "policy_store/link_shaper.h"
#include "policy_store/object_store.h"
#include "policy_store/pins.h"
#include "policy_store/publish.h"
#include "policy_store/reader.h"
#include "policy_store/relay.h"
#include "policy_store/retention.h"
#include "policy_store/s3_store.h"
#include "policy_store/store_server.h"
#include "sync/safetensors.h"

namespace weft::cli {
namespace {

using namespace weft::policy_store;

constexpr const char* kStoreHelp =
    "store: a directory, file://PATH, http(s)://HOST:PORT or s3://BUCKET/PREFIX";

struct StoreOptions {
  std::string store;
  std::string run;
  std::string model;  // publish: the file to publish; pull: --have
  std::string output;
  int64_t version = -1;
  uint64_t keyframe_interval = 50;
  double keyframe_budget = 0.5;
  int threads = 0;
  uint32_t max_connections = 0;  // serve, relay
  std::vector<uint64_t> pins;
  bool dry_run = false;
  std::string listen = "127.0.0.1:8080";
  // How the store is reached (pull, relay).
  std::string shape_bandwidth;  // e.g. "100MB" (per second)
  std::string shape_latency;    // e.g. "40ms"
  std::string deadline = "120s";
  std::string cache_dir;
  std::string cache_bytes = "10GiB";
  std::string upstream;                   // relay
  std::string holder;                     // pull --pin-as, pin --holder
  bool remove = false;                    // pin --remove
  std::string abandoned_uploads = "24h";  // gc: multipart uploads older than this are aborted
  bool finish = false, discard = false;   // recover
};

// The OpenOptions the flags describe.
Result<OpenOptions> LinkOptions(const StoreOptions& options) {
  OpenOptions open;
  if (!options.shape_bandwidth.empty()) {
    WEFT_ASSIGN_OR_RETURN(open.shape_bytes_per_second, ParseByteSize(options.shape_bandwidth));
  }
  if (!options.shape_latency.empty()) {
    WEFT_ASSIGN_OR_RETURN(open.shape_latency, ParseDuration(options.shape_latency));
  }
  WEFT_ASSIGN_OR_RETURN(std::chrono::microseconds deadline, ParseDuration(options.deadline));
  open.deadline = std::max(std::chrono::milliseconds(1),
                           std::chrono::duration_cast<std::chrono::milliseconds>(deadline));
  open.cache_dir = options.cache_dir;
  WEFT_ASSIGN_OR_RETURN(open.cache_bytes, ParseByteSize(options.cache_bytes));
  return open;
}

// What the transfer took beyond the bytes: retries, resumed downloads, cache hits ("" if nothing).
std::string TransferNote(ObjectStore& store) {
  std::vector<std::string> notes;
  ObjectStore* reached = &store;
  if (auto* cache = dynamic_cast<CachingStore*>(&store)) {
    const CacheStats stats = cache->stats();
    notes.push_back(std::to_string(stats.hits) + " blobs from the local cache");
    if (stats.corrupted > 0)
      notes.push_back(std::to_string(stats.corrupted) + " corrupted copies fetched again");
    reached = &cache->upstream();
  }
  if (auto* http = dynamic_cast<HttpStore*>(reached)) {
    if (http->retries() > 0) notes.push_back(std::to_string(http->retries()) + " requests retried");
    if (http->resumed() > 0)
      notes.push_back(std::to_string(http->resumed()) + " downloads resumed");
  }
  if (auto* s3 = dynamic_cast<S3Store*>(reached)) {
    if (s3->retries() > 0) notes.push_back(std::to_string(s3->retries()) + " requests retried");
    if (s3->resumed() > 0) notes.push_back(std::to_string(s3->resumed()) + " downloads resumed");
  }
  std::string text;
  for (const std::string& note : notes) text += (text.empty() ? "" : ", ") + note;
  return text;
}

// The flags that say how a store is reached.
void AddLinkFlags(CLI::App* command, StoreOptions* options, bool cache) {
  command->add_option("--shape-bandwidth", options->shape_bandwidth,
                      "emulate a link of this many bytes per second (e.g. 100MB)");
  command->add_option("--shape-latency", options->shape_latency,
                      "emulate a link adding this latency to each request (e.g. 40ms)");
  command->add_option("--deadline", options->deadline,
                      "give up on a request after this long, retries included (default 120s)");
  if (cache) {
    command->add_option("--cache", options->cache_dir,
                        "keep fetched blobs in this directory and read them from there");
    command->add_option("--cache-bytes", options->cache_bytes,
                        "the most the cache holds (default 10GiB)");
  }
}

int Threads(const StoreOptions& options) { return ThreadsOrAll(options.threads); }

// The served tensors of a safetensors file, in file order.
Result<sync::ServedModel> LoadModel(const std::string& path, int threads) {
  WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile file, sync::SafetensorsFile::Open(path));
  return sync::ServedModel::FromSafetensors(file, threads);
}

Status RunPublish(const StoreOptions& options) {
  WEFT_ASSIGN_OR_RETURN(OpenOptions link, LinkOptions(options));
  link.create = true;  // a new store starts with its first publication
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store, link));
  WEFT_ASSIGN_OR_RETURN(sync::ServedModel model, LoadModel(options.model, Threads(options)));
  const KeyframePolicy policy{options.keyframe_interval, options.keyframe_budget};
  std::optional<uint64_t> expected;
  if (options.version >= 0) expected = static_cast<uint64_t>(options.version);
  Result<Manifest> published =
      PublishModel(*store, options.run, model, policy, Threads(options), expected);
  if (!published.ok() && published.status().code() == StatusCode::kInvalidArgument) {
    return published.status().WithContext(options.model);
  }
  WEFT_ASSIGN_OR_RETURN(Manifest manifest, std::move(published));
  std::printf(
      "published %s version %llu to %s: %s%s\n", options.run.c_str(),
      static_cast<unsigned long long>(manifest.version), store->Describe().c_str(),
      manifest.delta ? ("delta of " + std::to_string(manifest.delta->bytes) + " bytes").c_str()
                     : "",
      manifest.has_keyframe() ? ((manifest.delta ? " and " : "") + std::string("keyframe of ") +
                                 std::to_string(manifest.keyframe_bytes()) + " bytes")
                                    .c_str()
                              : "");
  return Status::Ok();
}

Status RunPull(const StoreOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(options.run));
  WEFT_ASSIGN_OR_RETURN(OpenOptions link, LinkOptions(options));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store, link));
  StoreReader reader(*store, options.run, Threads(options));
  uint64_t target;
  if (options.version >= 0) {
    target = static_cast<uint64_t>(options.version);
  } else {
    WEFT_ASSIGN_OR_RETURN(target, reader.Latest());
  }
  sync::ServedModel model;
  std::optional<uint64_t> have;
  if (!options.model.empty()) {
    WEFT_ASSIGN_OR_RETURN(model, LoadModel(options.model, Threads(options)));
    WEFT_ASSIGN_OR_RETURN(have, reader.IdentifyVersion(model));
    if (!have) {
      std::printf("%s matches none of the recent versions of run '%s'; pulling without it\n",
                  options.model.c_str(), options.run.c_str());
      model = sync::ServedModel();
    } else if (*have > target) {
      return InvalidArgument(options.model + " holds version " + std::to_string(*have) +
                             ", newer than the requested " + std::to_string(target));
    }
  }
  WEFT_ASSIGN_OR_RETURN(PullReport report, reader.Pull(target, have, &model));
  WEFT_RETURN_IF_ERROR(sync::WriteSafetensors(options.output, model.AsTensorsToWrite()));
  if (!options.holder.empty())
    WEFT_RETURN_IF_ERROR(SetPin(*store, options.run, options.holder, target));
  const std::string note = TransferNote(*store);
  std::printf(
      "%s: run %s version %llu, %llu bytes downloaded (%s), every blob and digest verified%s\n",
      options.output.c_str(), options.run.c_str(), static_cast<unsigned long long>(target),
      static_cast<unsigned long long>(report.bytes_downloaded), report.path.c_str(),
      note.empty() ? "" : ("; " + note).c_str());
  return Status::Ok();
}

// A keyframe's size, and its part count when it is in parts: "1200" or "1200 (4 parts)".
std::string KeyframeText(const Manifest& m) {
  std::string text = std::to_string(m.keyframe_bytes());
  if (m.keyframe.size() > 1) text += " (" + std::to_string(m.keyframe.size()) + " parts)";
  return text;
}

Status RunList(const StoreOptions& options) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store));
  std::set<std::string> runs;
  if (!options.run.empty()) {
    WEFT_RETURN_IF_ERROR(ValidateRunId(options.run));
    runs.insert(options.run);
  } else {
    WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys, store->List("runs/"));
    for (const std::string& key : keys) runs.insert(key.substr(5, key.find('/', 5) - 5));
  }
  if (runs.empty()) std::printf("%s: no runs\n", store->Describe().c_str());
  for (const std::string& run : runs) {
    StoreReader reader(*store, run, 1);
    Result<uint64_t> latest = reader.Latest();
    WEFT_ASSIGN_OR_RETURN(std::vector<uint64_t> versions, reader.Versions());
    const size_t unpublished = static_cast<size_t>(std::count_if(
        versions.begin(), versions.end(), [&](uint64_t v) { return !latest.ok() || v > *latest; }));
    std::printf("run %s: latest %s, %zu versions%s\n", run.c_str(),
                latest.ok() ? std::to_string(*latest).c_str() : "none",
                versions.size() - unpublished,
                unpublished == 0 ? ""
                                 : (" and " + std::to_string(unpublished) +
                                    " never made latest (weft store recover --run " + run + ")")
                                       .c_str());
    WEFT_ASSIGN_OR_RETURN(auto pins, ListPins(*store, run));
    for (const auto& [holder, version] : pins) {
      std::printf("  pin %s: v%llu\n", holder.c_str(), static_cast<unsigned long long>(version));
    }
    for (uint64_t v : versions) {
      WEFT_ASSIGN_OR_RETURN(Manifest m, reader.GetManifest(v));
      std::printf("  v%-6llu %3zu tensors  delta %10s  keyframe %12s%s\n",
                  static_cast<unsigned long long>(v), m.tensors.size(),
                  m.delta ? std::to_string(m.delta->bytes).c_str() : "-",
                  m.has_keyframe() ? KeyframeText(m).c_str() : "-",
                  !latest.ok() || v > *latest ? "  (not yet visible: latest is behind)" : "");
    }
  }
  return Status::Ok();
}

// What a publisher killed between a version's manifest and `latest` left: shown, finished (made
// latest) or discarded.
Status RunRecover(const StoreOptions& options) {
  if (options.finish && options.discard)
    return InvalidArgument("give --finish or --discard, not both");
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store));
  if (options.finish) {
    WEFT_ASSIGN_OR_RETURN(uint64_t version, FinishUnpublished(*store, options.run));
    std::printf("run %s: version %llu is published (latest)\n", options.run.c_str(),
                static_cast<unsigned long long>(version));
    return Status::Ok();
  }
  if (options.discard) {
    WEFT_ASSIGN_OR_RETURN(Unpublished gone, DiscardUnpublished(*store, options.run));
    std::printf(
        "run %s: discarded %zu objects of versions after latest %llu (%zu manifests); "
        "their blobs go with the next gc\n",
        options.run.c_str(), gone.keys.size(), static_cast<unsigned long long>(gone.latest),
        gone.manifests.size());
    return Status::Ok();
  }
  WEFT_ASSIGN_OR_RETURN(Unpublished found, FindUnpublished(*store, options.run));
  if (found.keys.empty()) {
    std::printf("run %s: nothing unpublished (latest %llu)\n", options.run.c_str(),
                static_cast<unsigned long long>(found.latest));
    return Status::Ok();
  }
  std::printf(
      "run %s: latest %llu; %zu objects of later versions were written but never made "
      "latest:\n",
      options.run.c_str(), static_cast<unsigned long long>(found.latest), found.keys.size());
  for (const std::string& key : found.keys) std::printf("  %s\n", key.c_str());
  std::printf(
      "publish the same weights again to complete them, --finish to make version %llu "
      "latest as it is, or --discard (with no publisher running) to publish other "
      "weights\n",
      static_cast<unsigned long long>(found.latest + 1));
  return Status::Ok();
}

// ADDRESS:PORT of --listen.
Result<std::pair<std::string, uint16_t>> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("--listen takes ADDRESS:PORT, not '" + listen + "'");
  }
  const std::string port = listen.substr(colon + 1);
  char* end = nullptr;
  const unsigned long value = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value > 65535) {
    return InvalidArgument("--listen: bad port '" + port + "'");
  }
  return std::make_pair(listen.substr(0, colon), static_cast<uint16_t>(value));
}

// Runs until SIGINT or SIGTERM: `start` starts the server (after the signals are blocked, so that
// its threads do not take them); `describe` says what it serves, `mode` who may write.
template <typename Server>
Status ServeUntilStopped(const std::function<Result<std::unique_ptr<Server>>()>& start,
                         const std::function<std::string(const Server&)>& describe,
                         const std::string& address, const std::string& mode) {
  StopSignals stop;  // before the server's threads start
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<Server> running, start());
  std::printf("serving %s on http://%s:%u (%s)\n", describe(*running).c_str(), address.c_str(),
              static_cast<unsigned>(running->port()), mode.c_str());
  std::fflush(stdout);
  stop.Wait();
  running->Stop();
  std::printf("stopped\n");
  return Status::Ok();
}

Status RunServe(const StoreOptions& options) {
  StoreServerOptions server;
  WEFT_ASSIGN_OR_RETURN(std::tie(server.address, server.port), ParseListen(options.listen));
  const char* token = std::getenv("WEFT_STORE_TOKEN");
  server.writer_token = token ? token : "";
  OpenOptions open;
  open.create = !server.writer_token.empty();  // a read-only server serves what exists
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> backend, OpenStore(options.store, open));
  server.threads = std::max(2, Threads(options));
  server.max_connections = options.max_connections;
  return ServeUntilStopped<StoreServer>(
      [&] { return StoreServer::Start(*backend, server); },
      [&](const StoreServer&) { return backend->Describe(); }, server.address,
      server.writer_token.empty() ? "read-only" : "writes need WEFT_STORE_TOKEN");
}

// A read-only pull-through cache of an upstream store (policy_store/relay.h).
Status RunRelay(const StoreOptions& options) {
  RelayOptions relay;
  relay.upstream = options.upstream;
  relay.cache_dir = options.cache_dir;
  WEFT_ASSIGN_OR_RETURN(relay.cache_bytes, ParseByteSize(options.cache_bytes));
  StoreOptions link_flags = options;
  link_flags.cache_dir.clear();  // the relay's cache is its own, not a reader's
  WEFT_ASSIGN_OR_RETURN(OpenOptions link, LinkOptions(link_flags));
  relay.link = LinkShape{link.shape_bytes_per_second, link.shape_latency};
  relay.deadline = link.deadline;
  WEFT_ASSIGN_OR_RETURN(std::tie(relay.address, relay.port), ParseListen(options.listen));
  if (options.threads > 0) relay.threads = options.threads;
  relay.max_connections = options.max_connections;
  return ServeUntilStopped<Relay>([&] { return Relay::Start(relay); },
                                  [](const Relay& r) { return r.Describe(); }, relay.address,
                                  "read-only");
}

Status RunPin(const StoreOptions& options) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store));
  if (options.remove) {
    WEFT_RETURN_IF_ERROR(RemovePin(*store, options.run, options.holder));
    std::printf("run %s: %s holds no version any more\n", options.run.c_str(),
                options.holder.c_str());
    return Status::Ok();
  }
  if (options.version < 0) return InvalidArgument("give the pinned --version, or --remove");
  StoreReader reader(*store, options.run, 1);
  WEFT_RETURN_IF_ERROR(reader.GetManifest(static_cast<uint64_t>(options.version)).status());
  WEFT_RETURN_IF_ERROR(
      SetPin(*store, options.run, options.holder, static_cast<uint64_t>(options.version)));
  std::printf("run %s: %s holds version %lld\n", options.run.c_str(), options.holder.c_str(),
              static_cast<long long>(options.version));
  return Status::Ok();
}

Status RunCollect(const StoreOptions& options) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(options.run));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenStore(options.store));
  WEFT_ASSIGN_OR_RETURN(std::chrono::microseconds abandoned,
                        ParseDuration(options.abandoned_uploads));
  WEFT_ASSIGN_OR_RETURN(CollectReport report,
                        CollectGarbage(*store, options.run, options.pins, options.dry_run));
  std::printf(
      "%s run %s: keeping versions from %llu; %s %llu versions and %llu blobs (%llu bytes)\n",
      store->Describe().c_str(), options.run.c_str(),
      static_cast<unsigned long long>(report.kept_from),
      options.dry_run ? "would delete" : "deleted",
      static_cast<unsigned long long>(report.versions_deleted),
      static_cast<unsigned long long>(report.blobs_deleted),
      static_cast<unsigned long long>(report.bytes_freed));
  // On S3, what publishers killed mid-way left behind: the parts of their uploads (of this run's
  // objects, and of blobs and write checks, which belong to no run; never another run's), and
  // the objects of their write checks.
  if (auto* s3 = dynamic_cast<S3Store*>(store.get()); s3 != nullptr && !options.dry_run) {
    const auto cutoff = std::chrono::system_clock::now() -
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(abandoned);
    const std::string own = "runs/" + options.run + "/";
    WEFT_ASSIGN_OR_RETURN(size_t aborted,
                          s3->AbortUploadsBefore(cutoff, [&](const std::string& key) {
                            return key.starts_with(own) || key.starts_with("blobs/") ||
                                   key.starts_with(S3Store::kProbePrefix);
                          }));
    WEFT_ASSIGN_OR_RETURN(size_t probes, s3->DeleteProbesBefore(cutoff));
    std::printf(
        "%s: aborted %zu multipart uploads (of run %s, blobs and write checks) and deleted %zu "
        "write-check objects, started more than %s ago\n",
        store->Describe().c_str(), aborted, options.run.c_str(), probes,
        options.abandoned_uploads.c_str());
  }
  return Status::Ok();
}

// --max-connections of the servers (store serve, relay).
void AddMaxConnections(CLI::App* command, StoreOptions* options) {
  command
      ->add_option("--max-connections", options->max_connections,
                   "connections open at once; more are answered 503 (default: the open-file "
                   "limit less 64)")
      ->check(CLI::Range(1u, 1000000u));
}

}  // namespace

void RegisterStore(CLI::App& app, Action* action) {
  CLI::App* store =
      app.add_subcommand("store", "Publish to, pull from, list, collect and serve policy stores");
  store->require_subcommand(1);

  auto publish = std::make_shared<StoreOptions>();
  CLI::App* p =
      store->add_subcommand("publish", "Publish MODEL.safetensors as the next version of a run");
  p->add_option("--store", publish->store, kStoreHelp)->required();
  p->add_option("--run", publish->run, "run id")->required();
  p->add_option("--version", publish->version,
                "expected version number (refused if it is not the next one)")
      ->check(CLI::NonNegativeNumber);
  p->add_option("--keyframe-interval", publish->keyframe_interval,
                "a keyframe at least every N versions")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  p->add_option("--keyframe-budget", publish->keyframe_budget,
                "a keyframe once deltas since the last exceed this fraction of it")
      ->check(CLI::NonNegativeNumber);
  p->add_option("model", publish->model, "served tensors (.safetensors)")
      ->required()
      ->check(CLI::ExistingFile);
  AddLinkFlags(p, publish.get(), false);
  p->add_option("--threads", publish->threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  p->callback([publish, action] { *action = [publish] { return RunPublish(*publish); }; });

  auto pull = std::make_shared<StoreOptions>();
  CLI::App* g = store->add_subcommand("pull", "Fetch a version (default: latest) as safetensors");
  g->add_option("--store", pull->store, kStoreHelp)->required();
  g->add_option("--run", pull->run, "run id")->required();
  g->add_option("--version", pull->version, "version (default: latest)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--have", pull->model,
                "a local copy of an earlier version, to download only deltas")
      ->check(CLI::ExistingFile);
  g->add_option("-o,--output", pull->output, "safetensors file to write")->required();
  g->add_option("--threads", pull->threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  AddLinkFlags(g, pull.get(), true);
  g->add_option("--pin-as", pull->holder,
                "record the pulled version as still needed by this holder (a worker id)");
  g->callback([pull, action] { *action = [pull] { return RunPull(*pull); }; });

  auto list = std::make_shared<StoreOptions>();
  CLI::App* l = store->add_subcommand("ls", "List runs and versions");
  l->add_option("--store", list->store, kStoreHelp)->required();
  l->add_option("--run", list->run, "only this run");
  l->callback([list, action] { *action = [list] { return RunList(*list); }; });

  auto pin = std::make_shared<StoreOptions>();
  CLI::App* n = store->add_subcommand("pin",
                                      "Record the version a holder still needs (retention keeps "
                                      "it; publishers write catch-up deltas from it)");
  n->add_option("--store", pin->store, kStoreHelp)->required();
  n->add_option("--run", pin->run, "run id")->required();
  n->add_option("--holder", pin->holder, "who needs it: a worker, job or trainer id")->required();
  n->add_option("--version", pin->version, "the version it holds")->check(CLI::NonNegativeNumber);
  n->add_flag("--remove", pin->remove, "the holder needs nothing any more");
  n->callback([pin, action] { *action = [pin] { return RunPin(*pin); }; });

  auto collect = std::make_shared<StoreOptions>();
  CLI::App* c =
      store->add_subcommand("gc", "Delete versions and blobs that no pinned version needs");
  c->add_option("--store", collect->store, kStoreHelp)->required();
  c->add_option("--run", collect->run, "run id")->required();
  c->add_option(
      "--pin", collect->pins,
      "a version still needed (repeatable), besides the store's pins; the latest is always kept");
  c->add_flag("--dry-run", collect->dry_run, "report what would be deleted, delete nothing");
  c->add_option("--abandoned-uploads", collect->abandoned_uploads,
                "on S3, abort multipart uploads started longer ago than this (default 24h)");
  c->callback([collect, action] { *action = [collect] { return RunCollect(*collect); }; });

  auto recover = std::make_shared<StoreOptions>();
  CLI::App* rc = store->add_subcommand(
      "recover", "Show, finish or discard versions a killed publisher wrote but never made latest");
  rc->add_option("--store", recover->store, kStoreHelp)->required();
  rc->add_option("--run", recover->run, "run id")->required();
  rc->add_flag("--finish", recover->finish,
               "make the version after latest latest, if its manifest and blobs are complete");
  rc->add_flag("--discard", recover->discard,
               "delete the objects of versions after latest (only with no publisher running)");
  rc->callback([recover, action] { *action = [recover] { return RunRecover(*recover); }; });

  auto serve = std::make_shared<StoreOptions>();
  CLI::App* v =
      store->add_subcommand("serve", "Serve a store over HTTP (writes need WEFT_STORE_TOKEN)");
  v->add_option("--store", serve->store,
                "the store to serve: a directory, file://PATH or s3://BUCKET/PREFIX")
      ->required();
  v->add_option("--listen", serve->listen, "ADDRESS:PORT to listen on (port 0: any free port)");
  v->add_option("--threads", serve->threads, "server threads (default: all cores, at least 2)")
      ->check(CLI::Range(1, 1024));
  AddMaxConnections(v, serve.get());
  v->callback([serve, action] { *action = [serve] { return RunServe(*serve); }; });
}

void RegisterRelay(CLI::App& app, Action* action) {
  auto relay = std::make_shared<StoreOptions>();
  CLI::App* r =
      app.add_subcommand("relay", "A regional pull-through cache of a store server (read-only)");
  r->add_option("--upstream", relay->upstream,
                "the store to relay: http(s)://HOST:PORT (a store server) or s3://BUCKET/PREFIX")
      ->required();
  r->add_option("--cache", relay->cache_dir, "directory for cached blobs")->required();
  r->add_option("--max-bytes", relay->cache_bytes,
                "the most the cache holds (e.g. 50GiB; default 10GiB)");
  r->add_option("--listen", relay->listen, "ADDRESS:PORT to listen on (port 0: any free port)");
  r->add_option("--threads", relay->threads,
                "I/O threads (default 4; they never wait on the upstream)")
      ->check(CLI::Range(1, 1024));
  AddMaxConnections(r, relay.get());
  AddLinkFlags(r, relay.get(), false);
  r->callback([relay, action] { *action = [relay] { return RunRelay(*relay); }; });
}

}  // namespace weft::cli
