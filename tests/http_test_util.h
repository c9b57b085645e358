// A raw HTTP request for tests of weft's servers: sent exactly as given (no path normalisation,
// no proxy), for what well-behaved clients never send too.
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::testing {

// A socket listening on a free loopback port (for test servers): its descriptor; the port goes to
// *port.
inline int ListenOnLoopback(int backlog, uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  *port = ntohs(address.sin_port);
  REQUIRE(listen(fd, backlog) == 0);
  return fd;
}

struct RawReply {
  long status = 0;  // 0: no answer
  std::vector<uint8_t> body;
  std::string text() const { return std::string(body.begin(), body.end()); }
};

inline RawReply Raw(const std::string& url, const std::string& method,
                    const std::vector<std::string>& headers = {}, const std::string& body = "") {
  RawReply reply;
  CURL* curl = curl_easy_init();
  curl_slist* list = nullptr;
  for (const auto& h : headers) list = curl_slist_append(list, h.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(curl, CURLOPT_PROXY, "");  // loopback, whatever the environment says
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty()) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* user) {
        auto* out = static_cast<std::vector<uint8_t>*>(user);
        out->insert(out->end(), data, data + size * count);
        return size * count;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  if (curl_easy_perform(curl) == CURLE_OK)
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  return reply;
}

// One connection to a server on loopback, written and read byte for byte: for what well-behaved
// clients never send. Reads give up after `wait` without data.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port, std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    timeval timeout{static_cast<time_t>(wait.count() / 1000),
                    static_cast<suseconds_t>(wait.count() % 1000 * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawConnection() { close(fd_); }
  void Send(std::string_view bytes) { (void)!send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // What arrives until the server closes (or nothing more comes within the wait).
  std::string ReadAll() {
    std::string text;
    char buffer[4096];
    ssize_t got;
    while ((got = recv(fd_, buffer, sizeof(buffer), 0)) > 0) text.append(buffer, got);
    closed_ = got == 0;
    return text;
  }
  // What one read returns.
  std::string ReadSome() {
    char buffer[4096];
    ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
    return got > 0 ? std::string(buffer, got) : std::string();
  }
  // Whether the last ReadAll ended because the server closed the connection.
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
};

// The status code of the first answer in `text` (0: none).
inline int StatusOf(const std::string& text) {
  if (text.rfind("HTTP/1.", 0) != 0 || text.size() < 12) return 0;
  return std::stoi(text.substr(9, 3));
}

// The port of a loopback URL ("http://127.0.0.1:PORT").
inline uint16_t PortOf(const std::string& url) {
  return static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
}

}  // namespace weft::testing
