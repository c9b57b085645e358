// Load on the orchestrator over loopback. The orchestrator is the real `weft orchestrator`, in a
// process of its own; this program is the load: N simulated workers (default 1000), each a
// cluster of capacity 1 on its own keep-alive connection, register, prove a version and then loop:
// long-poll for a lease, "generate" for --generate-ms (default 150), submit a 4 KiB trajectory,
// long-poll again. A trainer thread keeps jobs queued and takes batches. Printed: leases and
// journaled submissions per second, p50/p99/p999 latency of lease requests that got a lease and of
// submissions, and the orchestrator process's CPU time per submission; next to baselines measured
// in the same run: sequential journal appends (one fdatasync each) and a no-op request (/livez).
//
// Usage: orchestrator_bench [--workers N] [--seconds S] [--generate-ms G] [--threads T]
//                           [--compact-after BYTES] [--weft PATH] [--quick]
// (--compact-after: journal bytes between snapshots, default 64 MiB as in the configuration;
// --threads: the orchestrator's server threads, default 8 as in the configuration; --weft: the
// weft binary to run, default the one built with this program. A cluster token from registration
// is used when the orchestrator hands one out, else the worker token.)
#include <curl/curl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

// Before Boost.Asio: Boost 1.74 uses std::exchange without including it.
#include <utility>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "orchestrator/journal.h"
#include "tests/process_stats.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using namespace weft;
using namespace weft::orchestrator;

// The orchestrator process: `weft orchestrator --config` on a port of its own choosing.
struct Server {
  pid_t pid = -1;
  uint16_t port = 0;

  bool Start(const std::string& weft, const std::string& config) {
    int out[2];
    if (pipe(out) != 0) return false;
    pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      execl(weft.c_str(), weft.c_str(), "orchestrator", "--config", config.c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    // The first line says where it listens: "... on http://127.0.0.1:PORT (journal ...".
    std::string line;
    char c = 0;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    const size_t at = line.find("http://127.0.0.1:");
    if (at == std::string::npos) {
      std::fprintf(stderr, "the orchestrator did not start: %s\n", line.c_str());
      return false;
    }
    port = static_cast<uint16_t>(std::atoi(line.c_str() + at + 17));
    return port != 0;
  }
  // CPU seconds (user + system) the process has used so far.
  double CpuSeconds() const { return testing::CpuSecondsOf(pid); }
  void Stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
};

struct Latencies {
  std::mutex mutex;
  std::vector<double> lease_ms, submit_ms, noop_ms;
  void Add(std::vector<double>& list, Clock::time_point start) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::lock_guard<std::mutex> lock(mutex);
    list.push_back(ms);
  }
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// One simulated worker: a state machine on one connection.
class Worker : public std::enable_shared_from_this<Worker> {
 public:
  Worker(asio::io_context& context, tcp::endpoint endpoint, int id,
         std::chrono::milliseconds generate, Latencies& latencies,
         const std::atomic<bool>& measuring, const std::atomic<bool>& stopping,
         std::atomic<uint64_t>& leases, std::atomic<uint64_t>& submissions,
         std::atomic<uint64_t>& granted)
      : stream_(context),
        timer_(context),
        endpoint_(endpoint),
        id_("w" + std::to_string(id)),
        generate_(generate),
        latencies_(latencies),
        measuring_(measuring),
        stopping_(stopping),
        leases_(leases),
        submissions_(submissions),
        granted_(granted) {}

  void Start() {
    stream_.async_connect(endpoint_, [self = shared_from_this()](beast::error_code error) {
      if (error) return self->Fail("connect", error);
      // As libcurl (the worker's client) does: a request's body must not wait for the ACK of its
      // header.
      beast::error_code ignored;
      self->stream_.socket().set_option(tcp::no_delay(true), ignored);
      self->Send("/v1/clusters",
                 Json{{"cluster", self->id_},
                      {"region", "r" + std::to_string(self->id_.size() % 3)},
                      {"capacity", 1}}
                     .dump(),
                 [self](const Json& registered) {
                   if (registered.contains("cluster_token"))
                     self->token_ = registered["cluster_token"].get<std::string>();
                   self->Send("/v1/clusters/" + self->id_ + "/heartbeat", R"({"ready_version":0})",
                              [self](const Json&) { self->Lease(); });
                 });
    });
  }
  bool failed() const { return failed_; }

 private:
  void Lease() {
    if (stopping_) return;
    const auto start = Clock::now();
    Send("/v1/clusters/" + id_ + "/leases", R"({"max":1,"wait_ms":1000})",
         [self = shared_from_this(), start](const Json& body) {
           if (body["leases"].empty()) return self->Lease();
           self->granted_.fetch_add(1);
           if (self->measuring_) {
             self->latencies_.Add(self->latencies_.lease_ms, start);
             self->leases_.fetch_add(1);
           }
           // "Generate" for a while, as a real worker would, then submit.
           self->timer_.expires_after(self->generate_);
           self->timer_.async_wait(
               [self, lease = body["leases"][0]](beast::error_code) { self->Submit(lease); });
         });
  }

  void Submit(const Json& lease) {
    static const std::string payload(4096, 'x');
    const auto start = Clock::now();
    // Rendered as text: the load generator must cost little next to the server it measures.
    std::string submission = "{\"job\":" + lease["job"].dump() +
                             ",\"attempt\":" + lease["attempt"].dump() + ",\"cluster\":\"" + id_ +
                             "\",\"version_start\":0,\"version_end\":0,\"segments\":[[0,0]],"
                             "\"tokens\":1024,\"trajectories\":{\"text\":\"" +
                             payload + "\"}}";
    Send("/v1/clusters/" + id_ + "/submissions", std::move(submission),
         [self = shared_from_this(), start](const Json&) {
           if (self->measuring_) {
             self->latencies_.Add(self->latencies_.submit_ms, start);
             self->submissions_.fetch_add(1);
           }
           self->Lease();
         });
  }

  void Send(const std::string& target, std::string body, std::function<void(const Json&)> next) {
    request_ = {};
    request_.method(bhttp::verb::post);
    request_.target(target);
    request_.version(11);
    request_.keep_alive(true);
    request_.set(bhttp::field::host, "127.0.0.1");
    request_.set(bhttp::field::authorization, "Bearer " + token_);
    request_.body() = std::move(body);
    request_.prepare_payload();
    bhttp::async_write(stream_, request_,
                       [self = shared_from_this(), next = std::move(next)](beast::error_code error,
                                                                           size_t) mutable {
                         if (error) return self->Fail("write", error);
                         self->response_ = {};
                         bhttp::async_read(
                             self->stream_, self->buffer_, self->response_,
                             [self, next = std::move(next)](beast::error_code error, size_t) {
                               if (error) return self->Fail("read", error);
                               if (self->response_.result() != bhttp::status::ok) {
                                 if (self->stopping_) return;
                                 std::fprintf(stderr, "%s: HTTP %d %s\n", self->id_.c_str(),
                                              self->response_.result_int(),
                                              self->response_.body().c_str());
                                 self->failed_ = true;
                                 return;
                               }
                               next(Json::parse(self->response_.body(), nullptr, false));
                             });
                       });
  }

  void Fail(const char* what, beast::error_code error) {
    if (stopping_) return;  // the service going away at the end is not a failure
    std::fprintf(stderr, "%s: %s: %s\n", id_.c_str(), what, error.message().c_str());
    failed_ = true;
  }

  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  tcp::endpoint endpoint_;
  std::string id_;
  std::string token_ = "worker";  // the cluster's own token once registered
  std::chrono::milliseconds generate_;
  Latencies& latencies_;
  const std::atomic<bool>& measuring_;
  const std::atomic<bool>& stopping_;
  std::atomic<uint64_t>& leases_;
  std::atomic<uint64_t>& submissions_;
  std::atomic<uint64_t>& granted_;  // every lease granted, measured or not
  bhttp::request<bhttp::string_body> request_;
  bhttp::response<bhttp::string_body> response_;
  beast::flat_buffer buffer_;
  bool failed_ = false;
};

size_t Collect(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// A blocking POST of JSON text; the answer's text.
std::string PostText(CURL* curl, const std::string& url, const std::string& body) {
  std::string out;
  curl_slist* headers = curl_slist_append(nullptr, "Authorization: Bearer trainer");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROXY, "");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out);
  curl_easy_perform(curl);
  curl_slist_free_all(headers);
  return out;
}

// A blocking JSON request for the trainer thread (POST with a body, GET without).
Json Post(CURL* curl, const std::string& url, const Json& body,
          const std::string& token = "trainer") {
  std::string out;
  const std::string text = body.dump();
  curl_slist* headers = curl_slist_append(nullptr, ("Authorization: Bearer " + token).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROXY, "");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (body.is_null()) {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out);
  curl_easy_perform(curl);
  curl_slist_free_all(headers);
  return Json::parse(out, nullptr, false);
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 1000;
  double seconds = 10;
  int generate_ms = 150;
  int threads = 8;
  std::string weft = WEFT_BINARY;
  uint64_t compact_after = uint64_t{64} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      workers = 200;
      seconds = 3;
    } else if (arg == "--workers" && i + 1 < argc) {
      workers = std::atoi(argv[++i]);
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (arg == "--compact-after" && i + 1 < argc) {
      compact_after = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--generate-ms" && i + 1 < argc) {
      generate_ms = std::atoi(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--weft" && i + 1 < argc) {
      weft = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--workers N] [--seconds S] [--generate-ms G] [--threads T] "
                   "[--compact-after BYTES] [--weft PATH] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("weft-orchestrator-bench-" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir);

  // Baseline 1: sequential journal appends of a 4 KiB record, one fdatasync each.
  double journal_per_second = 0;
  {
    auto journal = std::move(Journal::Open(dir + "/baseline.journal", [](std::string_view) {
                     return Status::Ok();
                   })).value();
    const std::string record = "{" + std::string(4200, 'j') + "}";
    const auto start = Clock::now();
    int appended = 0;
    while (std::chrono::duration<double>(Clock::now() - start).count() < 1.0) {
      if (!journal->Append(record).ok()) return 1;
      ++appended;
    }
    journal_per_second = appended / std::chrono::duration<double>(Clock::now() - start).count();
  }

  const std::string config = dir + "/orchestrator.yaml";
  std::ofstream(config) << "orchestrator:\n  listen: 127.0.0.1:0\n  journal: " << dir
                        << "/orchestrator.journal\n  max_staleness: 2\n  max_in_flight: 1000000\n"
                        << "  lease: 60s\n  cluster_timeout: 60s\n  threads: " << threads
                        << "\n  compact_after: " << compact_after
                        << "\n  tokens: {worker: worker, trainer: trainer, admin: admin}\n";
  Server server;
  if (!server.Start(weft, config)) return 1;
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port);
  {
    CURL* curl = curl_easy_init();
    Post(curl, url + "/v1/versions", {{"version", 0}});
    curl_easy_cleanup(curl);
  }

  // Baseline 2: a no-op request (/livez) on the client the workers use, before the load.
  Latencies latencies;
  {
    asio::io_context context;
    tcp::socket socket(context);
    socket.connect({asio::ip::make_address("127.0.0.1"), server.port});
    beast::flat_buffer buffer;
    for (int i = 0; i < 2000; ++i) {
      bhttp::request<bhttp::empty_body> request(bhttp::verb::get, "/livez", 11);
      request.set(bhttp::field::host, "127.0.0.1");
      const auto start = Clock::now();
      bhttp::write(socket, request);
      bhttp::response<bhttp::string_body> response;
      bhttp::read(socket, buffer, response);
      latencies.Add(latencies.noop_ms, start);
    }
  }

  std::atomic<bool> measuring{false}, stopping{false};
  std::atomic<uint64_t> leases{0}, submissions{0}, granted{0};
  // The trainer: keeps jobs queued (at least 4 per worker: added and not yet leased) and drains
  // the buffer. It reads only the batch id of each answer: it must not slow the load it makes.
  std::thread trainer([&] {
    CURL* curl = curl_easy_init();
    uint64_t ack = 0;  // the last batch received, acknowledged with the next request
    uint64_t added = 0;
    std::string prompts = "{\"prompts\":[";
    for (int i = 0; i < 2000; ++i) prompts += i ? ",{\"prompt\":\"p\"}" : "{\"prompt\":\"p\"}";
    prompts += "]}";
    while (!stopping) {
      while (added - std::min(added, granted.load()) < static_cast<uint64_t>(4 * workers)) {
        PostText(curl, url + "/v1/jobs", prompts);
        added += 2000;
      }
      const std::string batch = PostText(
          curl, url + "/v1/batches",
          "{\"max\":1000,\"ack\":" + (ack ? std::to_string(ack) : std::string("null")) + "}");
      const uint64_t id =
          batch.rfind("{\"batch\":", 0) == 0 ? std::strtoull(batch.c_str() + 9, nullptr, 10) : 0;
      if (id > 0 && id != ack) {
        ack = id;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    curl_easy_cleanup(curl);
  });
  asio::io_context context;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), server.port);
  std::vector<std::shared_ptr<Worker>> simulated;
  for (int i = 0; i < workers; ++i) {
    simulated.push_back(
        std::make_shared<Worker>(context, endpoint, i, std::chrono::milliseconds(generate_ms),
                                 latencies, measuring, stopping, leases, submissions, granted));
    simulated.back()->Start();
  }
  std::thread client([&] { context.run(); });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // connect, register, warm up
  const double cpu_before = server.CpuSeconds();
  auto own_cpu = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  };
  const double load_cpu_before = own_cpu();
  measuring = true;
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = server.CpuSeconds() - cpu_before;
  const double load_cpu = own_cpu() - load_cpu_before;
  const uint64_t measured_submissions = submissions;
  stopping = true;
  trainer.join();
  Json journal;
  {
    CURL* curl = curl_easy_init();
    journal = Post(curl, url + "/v1/status", Json(), "admin")["journal"];
    curl_easy_cleanup(curl);
  }
  server.Stop();
  context.stop();
  client.join();
  const size_t failed =
      std::count_if(simulated.begin(), simulated.end(), [](const auto& w) { return w->failed(); });
  auto count = [&](const char* field) {
    return journal.is_object() && journal[field].is_number() ? journal[field].get<uint64_t>() : 0;
  };
  const uint64_t syncs = count("syncs"), records = count("records");

  std::printf(
      "\nOrchestrator under load over loopback: %d workers (capacity 1 each, long-polling, %d ms "
      "of generation per job), "
      "%.1f s measured\n",
      workers, generate_ms, elapsed);
  std::printf("  %-44s %10s %10s %10s %10s\n", "", "per second", "p50 ms", "p99 ms", "p999 ms");
  std::printf("  %-44s %10.0f %10.2f %10.2f %10.2f\n", "leases (requests that got one)",
              leases / elapsed, Percentile(latencies.lease_ms, 0.5),
              Percentile(latencies.lease_ms, 0.99), Percentile(latencies.lease_ms, 0.999));
  std::printf("  %-44s %10.0f %10.2f %10.2f %10.2f\n", "submissions (4 KiB, journaled)",
              submissions / elapsed, Percentile(latencies.submit_ms, 0.5),
              Percentile(latencies.submit_ms, 0.99), Percentile(latencies.submit_ms, 0.999));
  std::printf("  %-44s %10.0f %10s %10s %10s\n", "baseline: sequential 4 KiB journal appends",
              journal_per_second, "-", "-", "-");
  std::printf("  %-44s %10s %10.3f %10.3f %10.3f\n", "baseline: no-op request (/livez), idle", "-",
              Percentile(latencies.noop_ms, 0.5), Percentile(latencies.noop_ms, 0.99),
              Percentile(latencies.noop_ms, 0.999));
  std::printf(
      "  orchestrator process: %.2f CPU s in %.1f s (%.0f%% of a core), %.0f us per submission "
      "(its lease and submit requests, wake-ups, batches; %d server threads)\n",
      cpu, elapsed, 100 * cpu / elapsed,
      measured_submissions ? 1e6 * cpu / static_cast<double>(measured_submissions) : 0.0, threads);
  std::printf("  load generator (this process): %.2f CPU s (%.0f%% of a core)\n", load_cpu,
              100 * load_cpu / elapsed);
  std::printf("  journal: %llu compactions (every %llu bytes)\n",
              static_cast<unsigned long long>(count("compactions")),
              static_cast<unsigned long long>(compact_after));
  std::printf("  journal: %llu records in %llu syncs (%.1f per sync); %zu workers failed\n",
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(syncs),
              syncs ? static_cast<double>(records) / syncs : 0.0, failed);
  std::printf(
      "  target on a 2-core machine: >= 5000 journaled submissions/s with p99 lease latency < 20 "
      "ms\n");
  simulated.clear();
  std::filesystem::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
