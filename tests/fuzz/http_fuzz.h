// The shared part of the libFuzzer targets that fuzz a server's HTTP request path in-process
// (orchestrator_http_fuzz, store_http_fuzz, relay_http_fuzz): each input goes to the server over a
// fresh loopback TCP connection, and the harness itself judges the server's behaviour.
//
// An input is one of two kinds, chosen by its first byte:
//   - even: the rest of the input is the whole request, sent as it is (the HTTP parser, the
//     header checks, pipelining, anything malformed);
//   - odd: a well-formed request built by the harness, to reach deep into the handlers. Byte 1
//     picks the endpoint from the target's table (modulo its size), byte 2 the token (0 to 4 the
//     endpoint's own, 5 the admin's, 6 a wrong one, 7 none; modulo 8), and the rest is split at
//     its first two zero bytes: `body`, or `headers \0 body`, or `path-suffix \0 headers \0 body`.
//     `headers` are extra header lines (one per '\n'), the suffix is appended to the endpoint's
//     path, and the request carries Host, the token, Content-Type: application/json and the
//     body's Content-Length. The target may rewrite the path and body first (placeholders for
//     values only known at run time: a leased job, a blob's hash).
//
// After sending, the harness half-closes the connection and reads until the server closes it or
// a deadline passes (poll with timeouts: nothing here blocks). It aborts (a finding, with the
// request and the answer on stderr) when:
//   - a server answers 500 (a handler threw, or an internal error came from client input);
//   - a server closes the connection (not by a reset) of a well-formed request it read whole
//     without answering, or answers with something that is not HTTP;
//   - a server stops answering `GET /livez` with 200 (checked every kLivenessEvery inputs and at
//     the first): it crashed a thread, deadlocked, or leaks what it needs to accept connections;
//   - the harness cannot open a socket (the process ran out of descriptors: a server leaks them).
// Not thread-safe: libFuzzer calls a target from one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::fuzz {

inline constexpr uint64_t kLivenessEvery = 64;

// What one exchange on a fresh connection gave.
struct Answer {
  bool connected = false;
  bool sent = false;    // the whole request was written (then the connection was half-closed)
  bool closed = false;  // the server closed (or reset) the connection; else the deadline passed
  bool reset = false;   // ... by a reset (what it had sent may be lost)
  std::string bytes;    // everything the server sent
  int status = 0;       // the first final response's status code; 0 when there was none
  std::string Body() const;  // what follows the first final response's header
};
Answer Exchange(uint16_t port, std::string_view request, std::chrono::milliseconds deadline);

// Aborts unless GET /livez on `port` answers 200 with {"ok": true} (tried three times, 10 s each).
void CheckAlive(uint16_t port, const std::string& server);

struct Endpoint {
  std::string method, path;
  std::string token;  // the role whose token the endpoint takes (Target::token); "" for none
  int server = 0;     // which of the target's servers (Target::port)
  // Seeds: each is [path-suffix \0 headers \0] body, as in a structured input.
  std::vector<std::string> seeds;
};

struct Target {
  std::string name;
  std::vector<Endpoint> endpoints;
  std::function<uint16_t(int server)> port;
  // The token of a role ("admin" included); "" when there is none.
  std::function<std::string(const std::string& role)> token;
  // Rewrites a structured request's path and body before it is sent (may be empty).
  std::function<void(const Endpoint&, std::string* path, std::string* body)> expand;
  // Sees every answer: to a structured request with its endpoint, to a raw one with null (may be
  // empty).
  std::function<void(const Endpoint*, const Answer&)> observe;
  // Aborts when a server no longer answers (CheckAlive on each).
  std::function<void()> check_alive;
  // Raw requests to seed with (whole requests, without the leading kind byte).
  std::vector<std::string> raw_seeds;
};

// Sends one fuzz input as described at the top, judges the answer, and checks liveness when due.
void RunInput(const Target& target, const uint8_t* data, size_t size);

// A structured input for endpoint `index` of a table: the token choice, then the seed text.
std::string StructuredInput(size_t index, std::string_view seed, uint8_t token_choice = 0);

// The seeds of a target's table: every endpoint's seeds as structured inputs, and its raw seeds.
std::vector<std::string> SeedsOf(const Target& target);

// Counts answers by class and prints them at exit ("NAME: N requests: ...").
void CountAnswersAtExit(const std::string& name);

}  // namespace weft::fuzz
