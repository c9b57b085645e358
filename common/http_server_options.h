// ServerOptions: how a weft HTTP server listens (common/http_server.h), apart from the server
// itself so that configurations can hold them without the HTTP plumbing (Beast).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace weft::http {

struct ServerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (see HttpServer::port)
  uint64_t max_body_bytes = uint64_t{4} << 30;
  int threads = 2;
  std::chrono::seconds read_timeout{30};
  // Connections open at once; past it a new one is answered 503 (closed, with TLS) at once. 0:
  // the process's open-file limit (RLIMIT_NOFILE) less 64, so that the server runs out of
  // connections before the process runs out of descriptors.
  uint32_t max_connections = 0;
  // HTTPS: a PEM certificate (chain) and its private key; both empty: plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

}  // namespace weft::http
