#include "tests/fuzz/http_fuzz.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace weft::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

// Well-formed requests get this long; the servers are configured to answer far sooner (long
// polls of at most 100 ms, upstream deadlines of 3 s), so only a wedged server reaches it.
constexpr std::chrono::milliseconds kDeadline{5000};

struct Counts {
  std::string name;
  uint64_t requests = 0, by_class[6] = {}, no_answer = 0, timed_out = 0;
};
Counts& TheCounts() {
  static Counts counts;
  return counts;
}

void PrintCounts() {
  const Counts& c = TheCounts();
  std::fprintf(stderr,
               "%s: %llu requests: %llu 1xx/2xx, %llu 3xx, %llu 4xx, %llu 5xx, %llu without an "
               "answer, %llu past the deadline\n",
               c.name.c_str(), static_cast<unsigned long long>(c.requests),
               static_cast<unsigned long long>(c.by_class[1] + c.by_class[2]),
               static_cast<unsigned long long>(c.by_class[3]),
               static_cast<unsigned long long>(c.by_class[4]),
               static_cast<unsigned long long>(c.by_class[5]),
               static_cast<unsigned long long>(c.no_answer),
               static_cast<unsigned long long>(c.timed_out));
}

// Prints the request and the answer (escaped, cut to a few KiB) and aborts.
[[noreturn]] void Finding(const std::string& what, std::string_view request, const Answer& answer) {
  auto printable = [](std::string_view bytes) {
    std::string out;
    for (unsigned char c : bytes.substr(0, 4096)) {
      if (c == '\n' || (c >= 0x20 && c < 0x7f && c != '\\')) {
        out += static_cast<char>(c);
      } else {
        char escaped[8];
        std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
        out += escaped;
      }
    }
    if (bytes.size() > 4096) out += "... (" + std::to_string(bytes.size()) + " bytes)";
    return out;
  };
  std::fprintf(stderr, "\n==== weft fuzz finding: %s\n---- request:\n%s\n---- answer:\n%s\n----\n",
               what.c_str(), printable(request).c_str(), printable(answer.bytes).c_str());
  std::abort();
}

// The status code of the response starting at `at`, or 0.
int StatusAt(const std::string& bytes, size_t at) {
  if (bytes.compare(at, 7, "HTTP/1.") != 0 || bytes.size() < at + 12) return 0;
  int status = 0;
  for (size_t i = at + 9; i < at + 12; ++i) {
    if (bytes[i] < '0' || bytes[i] > '9') return 0;
    status = status * 10 + (bytes[i] - '0');
  }
  return status;
}

// Where the first final (not 1xx) response starts, or npos.
size_t FinalResponse(const std::string& bytes) {
  size_t at = 0;
  while (true) {
    const int status = StatusAt(bytes, at);
    if (status == 0) return std::string::npos;
    if (status >= 200) return at;
    const size_t end = bytes.find("\r\n\r\n", at);
    if (end == std::string::npos) return std::string::npos;
    at = end + 4;
  }
}

// Splits the rest of a structured input at its first two zero bytes (see the header).
void SplitParts(std::string_view rest, std::string* suffix, std::string* headers,
                std::string* body) {
  const size_t first = rest.find('\0');
  if (first == std::string_view::npos) {
    *body = rest;
    return;
  }
  const size_t second = rest.find('\0', first + 1);
  if (second == std::string_view::npos) {
    *headers = rest.substr(0, first);
    *body = rest.substr(first + 1);
    return;
  }
  *suffix = rest.substr(0, first);
  *headers = rest.substr(first + 1, second - first - 1);
  *body = rest.substr(second + 1);
}

std::string BuildRequest(const std::string& method, const std::string& path,
                         const std::string& token, const std::string& headers,
                         const std::string& body) {
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!token.empty()) request += "Authorization: Bearer " + token + "\r\n";
  request += "Content-Type: application/json\r\n";
  size_t at = 0;
  while (at < headers.size()) {
    size_t end = headers.find('\n', at);
    if (end == std::string::npos) end = headers.size();
    std::string line = headers.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) request += line + "\r\n";
    at = end + 1;
  }
  request += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return request;
}

}  // namespace

std::string Answer::Body() const {
  const size_t at = FinalResponse(bytes);
  if (at == std::string::npos) return "";
  const size_t end = bytes.find("\r\n\r\n", at);
  return end == std::string::npos ? "" : bytes.substr(end + 4);
}

Answer Exchange(uint16_t port, std::string_view request, std::chrono::milliseconds deadline) {
  Answer answer;
  const Clock::time_point until = Clock::now() + deadline;
  auto left_ms = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  };
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    Finding(std::string("cannot open a socket (") + std::strerror(errno) +
                "): the process ran out of descriptors",
            request, answer);
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    pollfd waiting{fd, POLLOUT, 0};
    int error = errno;
    if (error == EINPROGRESS && ::poll(&waiting, 1, left_ms()) == 1) {
      socklen_t length = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error != 0) {
      ::close(fd);
      return answer;
    }
  }
  answer.connected = true;
  size_t written = 0;
  bool writing = true;
  auto finish_writing = [&] {
    ::shutdown(fd, SHUT_WR);  // the server reads the end of the stream after the request
    writing = false;
  };
  if (request.empty()) finish_writing();
  char buffer[16384];
  while (true) {
    const int wait = left_ms();
    if (wait == 0) break;
    pollfd events{fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
    if (::poll(&events, 1, wait) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (events.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n > 0) {
        answer.bytes.append(buffer, static_cast<size_t>(n));
      } else if (n == 0) {
        answer.closed = true;
        break;
      } else if (errno != EAGAIN && errno != EINTR) {
        answer.closed = answer.reset = true;
        break;
      }
    }
    if (writing && (events.revents & POLLOUT)) {
      const ssize_t n =
          ::send(fd, request.data() + written, request.size() - written, MSG_NOSIGNAL);
      if (n > 0) {
        written += static_cast<size_t>(n);
        if (written == request.size()) finish_writing();
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        writing = false;  // the server closed its side: read what it answered
      }
    }
  }
  answer.sent = written == request.size();
  // An abortive close: no TIME_WAIT left behind on either side, however many inputs run.
  const linger abort_on_close{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
  ::close(fd);
  const size_t final_response = FinalResponse(answer.bytes);
  if (final_response != std::string::npos) answer.status = StatusAt(answer.bytes, final_response);
  return answer;
}

void CheckAlive(uint16_t port, const std::string& server) {
  constexpr std::string_view kLivez = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  Answer answer;
  for (int attempt = 0; attempt < 3; ++attempt) {
    answer = Exchange(port, kLivez, std::chrono::milliseconds(10000));
    if (answer.status == 200 && answer.Body().find("\"ok\":true") != std::string::npos) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  Finding(server + " (port " + std::to_string(port) + ") no longer answers GET /livez" +
              (answer.connected ? "" : " (connection refused)"),
          kLivez, answer);
}

void RunInput(const Target& target, const uint8_t* data, size_t size) {
  Counts& counts = TheCounts();
  if (counts.requests++ % kLivenessEvery == 0) target.check_alive();
  if (size == 0) return;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if ((data[0] & 1) == 0) {
    const std::string_view request = input.substr(1);
    const Answer answer = Exchange(target.port(0), request, kDeadline);
    ++counts.by_class[answer.status / 100 % 6];
    if (!answer.closed) ++counts.timed_out;
    if (answer.bytes.empty() && answer.closed) ++counts.no_answer;
    if (answer.status == 500) Finding(target.name + " answered 500", request, answer);
    if (target.observe) target.observe(nullptr, answer);
    return;
  }
  if (size < 3 || target.endpoints.empty()) return;
  const Endpoint& endpoint = target.endpoints[data[1] % target.endpoints.size()];
  const uint8_t choice = data[2] % 8;
  const std::string role = choice <= 4 ? endpoint.token : choice == 5 ? "admin" : "";
  std::string token = role.empty() ? "" : target.token(role);
  if (choice == 6) token = "not-a-token";
  std::string suffix, headers, body;
  SplitParts(input.substr(3), &suffix, &headers, &body);
  std::string path = endpoint.path + suffix;
  if (target.expand) target.expand(endpoint, &path, &body);
  const std::string request = BuildRequest(endpoint.method, path, token, headers, body);
  const Answer answer = Exchange(target.port(endpoint.server), request, kDeadline);
  ++counts.by_class[answer.status / 100 % 6];
  if (!answer.closed) ++counts.timed_out;
  if (answer.status == 500) Finding(target.name + " answered 500", request, answer);
  if (answer.bytes.empty() && answer.closed) ++counts.no_answer;
  if (answer.sent && answer.closed && !answer.reset && answer.bytes.empty())
    Finding(target.name + " closed the connection of a whole request without answering", request,
            answer);
  if (!answer.bytes.empty() && answer.status == 0 && answer.closed)
    Finding(target.name + " answered with something that is not an HTTP response", request, answer);
  if (target.observe) target.observe(&endpoint, answer);
}

std::string StructuredInput(size_t index, std::string_view seed, uint8_t token_choice) {
  std::string input = {'\x01', static_cast<char>(index), static_cast<char>(token_choice)};
  input += seed;
  return input;
}

std::vector<std::string> SeedsOf(const Target& target) {
  std::vector<std::string> seeds;
  for (size_t i = 0; i < target.endpoints.size(); ++i) {
    for (const std::string& seed : target.endpoints[i].seeds)
      seeds.push_back(StructuredInput(i, seed));
    // Each endpoint once more with the admin's token, a wrong one and none.
    const std::string first =
        target.endpoints[i].seeds.empty() ? std::string() : target.endpoints[i].seeds[0];
    for (uint8_t choice = 5; choice < 8; ++choice)
      seeds.push_back(StructuredInput(i, first, choice));
  }
  for (const std::string& raw : target.raw_seeds) seeds.push_back(std::string(1, '\0') + raw);
  return seeds;
}

void CountAnswersAtExit(const std::string& name) {
  TheCounts().name = name;
  std::atexit(PrintCounts);
}

}  // namespace weft::fuzz
