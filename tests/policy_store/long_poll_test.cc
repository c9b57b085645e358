// Long polls on the objects that change: a store server and a relay answer a GET with
// `Prefer: wait=N` when the object changes (not when the wait ends), a relay holds one upstream
// watch for all its readers, and a directory store notices writers of this process and others.
#include "policy_store/long_poll.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "common/byte_io.h"
#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/manifest.h"
#include "policy_store/reader.h"
#include "policy_store/relay.h"
#include "policy_store/run_objects.h"
#include "policy_store/store_server.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace long_poll_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A request header carrying `prefer` as its Prefer field.
weft::http::RequestHeader WithPrefer(const std::vector<std::string>& prefer) {
  weft::http::RequestHeader request;
  for (const std::string& value : prefer) request.insert(boost::beast::http::field::prefer, value);
  return request;
}

TEST_CASE("long polls: the Prefer header's wait") {
  const std::chrono::seconds longest(30);
  CHECK(!PreferredWait(WithPrefer({}), longest).value());
  CHECK(!PreferredWait(WithPrefer({"respond-async"}), longest).value());
  CHECK(*PreferredWait(WithPrefer({"wait=7"}), longest).value() == std::chrono::seconds(7));
  CHECK(*PreferredWait(WithPrefer({"respond-async, wait=3"}), longest).value() ==
        std::chrono::seconds(3));
  CHECK(*PreferredWait(WithPrefer({"return=minimal", "wait = \"4\""}), longest).value() ==
        std::chrono::seconds(4));
  CHECK(*PreferredWait(WithPrefer({"wait=600"}), longest).value() == longest);  // capped
  CHECK(*PreferredWait(WithPrefer({"wait=0"}), longest).value() == std::chrono::seconds(0));
  for (const char* bad : {"wait=", "wait=-1", "wait=1.5", "wait=ten", "wait=99999999999"}) {
    CAPTURE(bad);
    Result<std::optional<std::chrono::seconds>> refused = PreferredWait(WithPrefer({bad}), longest);
    REQUIRE(!refused.ok());
    CHECK(refused.status().message().find("whole number of seconds") != std::string::npos);
  }
}

TEST_CASE("long polls: a store server answers when the object changes, 304 when the wait ends") {
  Served served("secret");
  HttpStore reader(served.url, "", FastRetries());
  HttpStore writer(served.url, "secret", FastRetries());
  const std::string key = "runs/r/latest";

  // Absent: a wait of one second ends with 404, said to have waited.
  Clock::time_point start = Clock::now();
  Result<ObjectWatch> absent = reader.WaitForChange(key, std::nullopt, milliseconds(1000));
  REQUIRE(absent.ok());
  CHECK(!absent->value);
  CHECK(absent->waited);
  CHECK(SecondsSince(start) >= 0.9);

  // Created while a poll waits: answered then, long before its wait ends.
  std::thread create([&] {
    std::this_thread::sleep_for(milliseconds(300));
    REQUIRE(writer.CompareAndSwap(key, std::nullopt, "1\n").ok());
  });
  start = Clock::now();
  Result<ObjectWatch> created = reader.WaitForChange(key, std::nullopt, milliseconds(8000));
  create.join();
  REQUIRE(created.ok());
  CHECK(created->value == std::optional<std::string>("1\n"));
  CHECK(created->waited);
  CHECK(SecondsSince(start) < 4);

  // A client that holds an older value is answered at once with the new one.
  start = Clock::now();
  Result<ObjectWatch> newer = reader.WaitForChange(key, std::string("0\n"), milliseconds(8000));
  REQUIRE(newer.ok());
  CHECK(newer->value == std::optional<std::string>("1\n"));
  CHECK(SecondsSince(start) < 4);

  // Unchanged: 304 after the wait, the value it held.
  start = Clock::now();
  Result<ObjectWatch> same = reader.WaitForChange(key, std::string("1\n"), milliseconds(1000));
  REQUIRE(same.ok());
  CHECK(same->value == std::optional<std::string>("1\n"));
  CHECK(SecondsSince(start) >= 0.9);

  // Many polls, one change: every poll hears it.
  std::vector<std::thread> polls;
  std::atomic<int> heard{0};
  for (int i = 0; i < 8; ++i) {
    polls.emplace_back([&] {
      Result<ObjectWatch> got = reader.WaitForChange(key, std::string("1\n"), milliseconds(8000));
      if (got.ok() && got->value == std::optional<std::string>("2\n")) ++heard;
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  start = Clock::now();
  REQUIRE(writer.CompareAndSwap(key, std::string("1\n"), "2\n").ok());
  for (std::thread& poll : polls) poll.join();
  CHECK(heard == 8);
  CHECK(SecondsSince(start) < 4);

  // A written file the server did not write (another process's publisher) is noticed too.
  std::thread outside([&] {
    std::this_thread::sleep_for(milliseconds(300));
    const std::string path = served.root + "/" + key;
    { std::ofstream(path + ".new") << "3\n"; }
    std::filesystem::rename(path + ".new", path);
  });
  start = Clock::now();
  Result<ObjectWatch> moved = reader.WaitForChange(key, std::string("2\n"), milliseconds(8000));
  outside.join();
  REQUIRE(moved.ok());
  CHECK(moved->value == std::optional<std::string>("3\n"));
  CHECK(SecondsSince(start) < 4);

  // Bad waits are refused; immutable objects are served as ever, without waiting.
  CHECK(
      weft::testing::Raw(served.url + "/v1/objects/" + key, "GET", {"Prefer: wait=soon"}).status ==
      400);
  REQUIRE(served.backend->PutImmutable("blobs/x", TextBytes("x")).ok());
  start = Clock::now();
  const auto immutable =
      weft::testing::Raw(served.url + "/v1/objects/blobs/x", "GET", {"Prefer: wait=5"});
  CHECK(immutable.status == 200);
  CHECK(SecondsSince(start) < 2);
}

TEST_CASE("long polls: a stopping server answers the polls that wait, at once") {
  Served served("secret");
  REQUIRE(served.backend->CompareAndSwap("runs/r/latest", std::nullopt, "1\n").ok());
  HttpStoreOptions options = FastRetries();
  options.attempts = 1;
  HttpStore reader(served.url, "", options);
  std::atomic<bool> answered{false};
  std::thread poll([&] {
    Result<ObjectWatch> got =
        reader.WaitForChange("runs/r/latest", std::string("1\n"), milliseconds(9000));
    CHECK(!got.ok());
    answered = true;
  });
  std::this_thread::sleep_for(milliseconds(300));
  const Clock::time_point start = Clock::now();
  served.server->Stop();
  poll.join();
  CHECK(answered);
  CHECK(SecondsSince(start) < 4);
}

TEST_CASE("long polls: a relay holds one upstream watch for all its readers") {
  Served served("secret");
  REQUIRE(served.backend->CompareAndSwap("runs/r/latest", std::nullopt, "5\n").ok());
  RelayOptions options;
  options.upstream = served.url;
  options.cache_dir = TempRoot("long_poll_relay");
  Result<std::unique_ptr<Relay>> relay = Relay::Start(options);
  REQUIRE(relay.ok());
  const std::string relay_url = "http://127.0.0.1:" + std::to_string((*relay)->port());
  HttpStore through(relay_url, "", FastRetries());
  auto upstream_answers = [&] {
    const std::string text = weft::testing::Raw(served.url + "/metrics", "GET").text();
    const std::string name = "weft_store_server_answers_total{class=\"2xx\"} ";
    const size_t at = text.find(name);
    const size_t not_modified =
        text.find("weft_store_server_answers_total{class=\"3xx\"} ") + name.size();
    return std::stoull(text.substr(at + name.size())) + std::stoull(text.substr(not_modified));
  };

  // 16 readers wait on the relay through a second of quiet and a new version.
  std::vector<std::thread> readers;
  std::atomic<int> heard{0};
  for (int i = 0; i < 16; ++i) {
    readers.emplace_back([&] {
      StoreReader store_reader(through, "r", 1);
      Result<StoreReader::LatestWatch> first = store_reader.WatchLatest(milliseconds(0));
      if (!first.ok() || first->version != std::optional<uint64_t>(5)) return;
      Result<StoreReader::LatestWatch> next = store_reader.WatchLatest(milliseconds(8000));
      if (next.ok() && next->waited && next->version == std::optional<uint64_t>(6)) ++heard;
    });
  }
  std::this_thread::sleep_for(milliseconds(1500));
  const uint64_t before = upstream_answers();
  const Clock::time_point start = Clock::now();
  REQUIRE(served.backend->CompareAndSwap("runs/r/latest", std::string("5\n"), "6\n").ok());
  for (std::thread& reader : readers) reader.join();
  CHECK(heard == 16);
  CHECK(SecondsSince(start) < 4);
  // The change reached the relay in its one watch, answered once upstream (with the /metrics
  // read that counted it), not once per reader.
  const uint64_t asked = upstream_answers() - before;
  CAPTURE(asked);
  CHECK(asked <= 3);
  (*relay)->Stop();
  std::filesystem::remove_all(options.cache_dir);
}

TEST_CASE("long polls: at most kMaxWatchedKeys keys are watched at once; the rest are plain GETs") {
  const std::string root = TempRoot("long_poll_keys");
  auto store = std::move(DirectoryStore::Open(root)).value();
  std::atomic<int> answered{0}, unavailable{0};
  weft::http::Responder respond([&](weft::http::Response response) {
    ++answered;
    if (response.result() == boost::beast::http::status::service_unavailable) ++unavailable;
  });
  {
    LongPolls polls(*store);
    weft::http::RequestHeader request;
    for (size_t i = 0; i < LongPolls::kMaxWatchedKeys; ++i) {
      CHECK(polls.Add(request, "runs/r/pins/holder" + std::to_string(i), std::chrono::seconds(20),
                      respond));
    }
    // Another poll of a watched key is taken; a new key is not.
    CHECK(polls.Add(request, "runs/r/pins/holder0", std::chrono::seconds(20), respond));
    CHECK(!polls.Add(request, "runs/r/pins/one-too-many", std::chrono::seconds(20), respond));
    CHECK(polls.waiting() == LongPolls::kMaxWatchedKeys + 1);
    CHECK(answered == 0);  // absent, and still absent: they wait
    const Clock::time_point start = Clock::now();
    polls.Stop();
    CHECK(SecondsSince(start) < 4);
  }
  CHECK(answered == static_cast<int>(LongPolls::kMaxWatchedKeys) + 1);
  CHECK(unavailable == answered);
  std::filesystem::remove_all(root);
}

TEST_CASE("long polls: a directory store wakes on a swap of this process, and waits its wait") {
  const std::string root = TempRoot("long_poll_dir");
  auto store = std::move(DirectoryStore::Open(root)).value();
  const std::string key = "runs/r/latest";
  Clock::time_point start = Clock::now();
  Result<ObjectWatch> none = store->WaitForChange(key, std::nullopt, milliseconds(300));
  REQUIRE(none.ok());
  CHECK(!none->value);
  CHECK(none->waited);
  CHECK(SecondsSince(start) >= 0.25);

  std::thread swap([&] {
    std::this_thread::sleep_for(milliseconds(200));
    REQUIRE(store->CompareAndSwap(key, std::nullopt, "1\n").ok());
  });
  start = Clock::now();
  Result<ObjectWatch> created = store->WaitForChange(key, std::nullopt, milliseconds(8000));
  swap.join();
  REQUIRE(created.ok());
  CHECK(created->value == std::optional<std::string>("1\n"));
  CHECK(SecondsSince(start) < 4);

  // Cancelled: kUnavailable within the recheck.
  std::atomic<bool> cancel{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(200));
    cancel = true;
  });
  start = Clock::now();
  Result<ObjectWatch> cancelled =
      store->WaitForChange(key, std::string("1\n"), milliseconds(8000), &cancel);
  stopper.join();
  CHECK(cancelled.status().code() == StatusCode::kUnavailable);
  CHECK(SecondsSince(start) < 4);

  // A pointer too large to be one is refused.
  REQUIRE(
      store->CompareAndSwap(key, std::string("1\n"), std::string(kMaxWatchedBytes + 1, 'x')).ok());
  CHECK(store->WaitForChange(key, std::nullopt, milliseconds(0)).status().code() ==
        StatusCode::kInvalidArgument);
  std::filesystem::remove_all(root);
}

}  // namespace long_poll_test
}  // namespace weft::policy_store
