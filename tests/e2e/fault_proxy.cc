// weft_fault_proxy: a TCP proxy that injects network faults, for the end-to-end tests.
//
//   weft_fault_proxy --upstream HOST:PORT [--listen ADDRESS:PORT] [--control ADDRESS:PORT]
//                    [--mode pass|drop|reset|blackhole]
//
// It accepts connections on --listen (default 127.0.0.1:0: a port the system picks) and forwards
// each, byte for byte in both directions, over a connection of its own to --upstream. Once both
// ports listen it prints one line to stdout:
//   fault proxy: listen 127.0.0.1:PORT control 127.0.0.1:PORT upstream HOST:PORT mode pass
// The control port (default 127.0.0.1:0) takes one-line commands and answers each with one line,
// "ok ..." or "error: ...", once the change has taken effect. From bash:
//   exec 3<>/dev/tcp/127.0.0.1/$control_port; echo blackhole >&3; read -r answer <&3
// Commands; a mode applies at once to every connection, open or new:
//   pass            forward everything
//   delay MS [MS]   forward each chunk MS milliseconds after it arrived (the second MS, if given,
//                   for upstream to client)
//   drop            close every open connection (FIN to both sides, or RST from the kernel where
//                   bytes it sent were not read yet); new connections are accepted and closed at
//                   once
//   reset           abort every open connection with RST (SO_LINGER 0) on both sides; new
//                   connections too
//   blackhole       forward nothing and close nothing: open connections stay open, new ones are
//                   accepted and not connected upstream, so clients see their deadlines pass. Bytes
//                   are left unread meanwhile and go on when the mode changes to pass or delay,
//                   as TCP would retransmit them after a partition heals
//   status          the mode and the counters, on one line
// While forwarding, a reset (or any socket error) on one side is passed on as a reset of the
// other, and an end of stream (FIN) as a shutdown of writing. SIGTERM or SIGINT closes every
// connection and exits with status 0; a bad argument or an unusable address exits with status 1.
//
// One thread and poll(2) serve any number of concurrent connections (HTTP keep-alive, long polls);
// a direction stops reading while 4 MiB of it wait to be written, so memory stays bounded.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"

namespace {

using Clock = std::chrono::steady_clock;
using weft::Result;
using weft::Status;

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kMaxQueuedBytes = 4 << 20;  // per direction of a connection
constexpr size_t kMaxControlLine = 1024;
constexpr auto kLongestPoll = std::chrono::milliseconds(500);

volatile sig_atomic_t stop_requested = 0;
void OnStopSignal(int) { stop_requested = 1; }

enum class Mode { kPass, kDelay, kDrop, kReset, kBlackhole };

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kPass:
      return "pass";
    case Mode::kDelay:
      return "delay";
    case Mode::kDrop:
      return "drop";
    case Mode::kReset:
      return "reset";
    case Mode::kBlackhole:
      return "blackhole";
  }
  return "?";
}

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// "HOST:PORT" (the last ':' separates the port) to a socket address.
Result<Address> Resolve(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return weft::InvalidArgument("'" + text + "' is not HOST:PORT");
  }
  const std::string host = text.substr(0, colon), port = text.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (error != 0) {
    return weft::InvalidArgument("cannot resolve '" + text + "': " + gai_strerror(error));
  }
  Address address;
  std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
  address.length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

std::string Describe(const sockaddr_storage& storage) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (storage.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

void MakeNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void SetNoDelay(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

// Closes with RST instead of FIN: SO_LINGER on, zero seconds.
void Abort(int fd) {
  if (fd < 0) return;
  const linger hard{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  close(fd);
}

void CloseQuietly(int fd) {
  if (fd >= 0) close(fd);
}

// Listens on `text`; returns the socket and the address it got (the port, when it asked for 0).
Result<std::pair<int, std::string>> Listen(const std::string& text) {
  WEFT_ASSIGN_OR_RETURN(Address address, Resolve(text));
  const int fd = socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return weft::Unavailable("socket: " + std::string(std::strerror(errno)));
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
      listen(fd, 1024) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return weft::Unavailable("cannot listen on " + text + ": " + why);
  }
  MakeNonBlocking(fd);
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  return std::make_pair(fd, Describe(bound));
}

// Bytes read from one side, due to be written to the other at `due`.
struct Chunk {
  Clock::time_point due;
  std::string bytes;
  size_t written = 0;
};

// One direction of a connection: what was read from its source and waits for its sink.
struct Flow {
  std::deque<Chunk> chunks;
  size_t queued = 0;          // bytes in `chunks` not yet written
  bool source_ended = false;  // the source sent FIN
  bool sink_shut = false;     // ... and the sink was told (shutdown for writing)
  bool Due(Clock::time_point now) const { return !chunks.empty() && chunks.front().due <= now; }
};

struct Connection {
  int client = -1;
  int upstream = -1;        // -1: no connection upstream yet (black hole, or not started)
  bool connecting = false;  // a non-blocking connect upstream is under way
  Flow up;                  // client to upstream
  Flow down;                // upstream to client
  // A side that hung up (or failed) during a black hole is left out of poll until forwarding
  // resumes, which then finds out why.
  bool client_hung = false;
  bool upstream_hung = false;
  bool finished = false;  // both fds closed; removed after the current round
};

struct ControlClient {
  int fd = -1;
  std::string pending;
  bool finished = false;
};

struct Options {
  std::string listen = "127.0.0.1:0";
  std::string control = "127.0.0.1:0";
  std::string upstream;
  Mode mode = Mode::kPass;
};

class FaultProxy {
 public:
  explicit FaultProxy(const Options& options) : options_(options), mode_(options.mode) {}
  ~FaultProxy() {
    for (Connection& c : connections_) Close(c);
    for (ControlClient& k : controls_) CloseQuietly(k.fd);
    CloseQuietly(listener_);
    CloseQuietly(control_listener_);
  }

  Status Start() {
    WEFT_ASSIGN_OR_RETURN(upstream_, Resolve(options_.upstream));
    WEFT_ASSIGN_OR_RETURN(auto listening, Listen(options_.listen));
    listener_ = listening.first;
    WEFT_ASSIGN_OR_RETURN(auto control, Listen(options_.control));
    control_listener_ = control.first;
    std::printf("fault proxy: listen %s control %s upstream %s mode %s\n", listening.second.c_str(),
                control.second.c_str(), options_.upstream.c_str(), ModeName(mode_));
    std::fflush(stdout);
    return Status::Ok();
  }

  // Serves until SIGTERM or SIGINT (blocked outside ppoll, so none is missed between rounds).
  void Run(const sigset_t& while_polling) {
    std::vector<pollfd> fds;
    enum class Side { kListener, kControlListener, kControl, kClient, kUpstream };
    struct Slot {
      Side side;
      Connection* connection = nullptr;
      ControlClient* control = nullptr;
    };
    std::vector<Slot> slots;
    while (!stop_requested) {
      const Clock::time_point now = Clock::now();
      if (Forwarding()) {
        for (Connection& c : connections_) {
          if (c.upstream < 0 && !c.finished) ConnectUpstream(c);
        }
      }
      fds.clear();
      slots.clear();
      fds.push_back({listener_, POLLIN, 0});
      slots.push_back({Side::kListener});
      fds.push_back({control_listener_, POLLIN, 0});
      slots.push_back({Side::kControlListener});
      for (ControlClient& k : controls_) {
        fds.push_back({k.fd, POLLIN, 0});
        slots.push_back({Side::kControl, nullptr, &k});
      }
      Clock::time_point wake = now + kLongestPoll;
      for (Connection& c : connections_) {
        short client_events = 0, upstream_events = 0;
        if (Forwarding()) {
          if (!c.up.source_ended && c.up.queued < kMaxQueuedBytes) client_events |= POLLIN;
          if (c.down.Due(now)) client_events |= POLLOUT;
          if (c.connecting) {
            upstream_events |= POLLOUT;
          } else {
            if (!c.down.source_ended && c.down.queued < kMaxQueuedBytes) upstream_events |= POLLIN;
            if (c.up.Due(now)) upstream_events |= POLLOUT;
          }
          for (const Flow* flow : {&c.up, &c.down}) {
            if (!flow->chunks.empty() && flow->chunks.front().due > now)
              wake = std::min(wake, flow->chunks.front().due);
          }
        }
        // Poll reports hang-ups whatever it was asked: a side with nothing left to do (both its
        // directions ended), or that hung up during a black hole, is left out.
        const bool client_done = c.up.source_ended && c.down.sink_shut;
        const bool upstream_done = c.down.source_ended && c.up.sink_shut;
        fds.push_back({c.client_hung || client_done ? -1 : c.client, client_events, 0});
        slots.push_back({Side::kClient, &c});
        fds.push_back({c.upstream_hung || upstream_done ? -1 : c.upstream, upstream_events, 0});
        slots.push_back({Side::kUpstream, &c});
      }
      const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now);
      const timespec timeout{static_cast<time_t>(wait.count() / 1'000'000'000),
                             static_cast<long>(std::max<int64_t>(0, wait.count() % 1'000'000'000))};
      const int ready = ppoll(fds.data(), fds.size(), &timeout, &while_polling);
      if (ready < 0) continue;  // EINTR: a stop signal, checked above
      for (size_t i = 0; i < fds.size(); ++i) {
        const short events = fds[i].revents;
        if (events == 0) continue;
        switch (slots[i].side) {
          case Side::kListener:
            AcceptClients();
            break;
          case Side::kControlListener:
            AcceptControl();
            break;
          case Side::kControl:
            ServeControl(*slots[i].control);
            break;
          case Side::kClient:
          case Side::kUpstream:
            Serve(*slots[i].connection, slots[i].side == Side::kClient, events);
            break;
        }
      }
      if (Forwarding()) {
        for (Connection& c : connections_) {
          if (!c.finished) Flush(c);
        }
      }
      connections_.remove_if([](const Connection& c) { return c.finished; });
      controls_.remove_if([](const ControlClient& k) { return k.finished; });
    }
    std::fprintf(stderr, "fault proxy: stopping; %s\n", Counters().c_str());
  }

 private:
  bool Forwarding() const { return mode_ == Mode::kPass || mode_ == Mode::kDelay; }

  std::string Counters() const {
    std::ostringstream out;
    out << "mode " << ModeName(mode_) << " delay_ms " << delay_up_.count() << " "
        << delay_down_.count() << " open " << connections_.size() << " accepted " << accepted_
        << " refused " << refused_ << " aborted " << aborted_ << " upstream_failures "
        << upstream_failures_ << " bytes_up " << bytes_up_ << " bytes_down " << bytes_down_;
    return out.str();
  }

  void AcceptClients() {
    while (true) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: all taken (or a transient error: poll reports it again)
      ++accepted_;
      if (mode_ == Mode::kDrop || mode_ == Mode::kReset) {
        ++refused_;
        if (mode_ == Mode::kReset)
          Abort(fd);
        else
          close(fd);
        continue;
      }
      SetNoDelay(fd);
      Connection& c = connections_.emplace_back();
      c.client = fd;
      if (Forwarding()) ConnectUpstream(c);
    }
  }

  void ConnectUpstream(Connection& c) {
    const int fd =
        socket(upstream_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return AbortBoth(c, /*upstream_failed=*/true);
    SetNoDelay(fd);
    c.upstream = fd;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&upstream_.storage), upstream_.length) == 0)
      return;
    if (errno == EINPROGRESS) {
      c.connecting = true;
      return;
    }
    AbortBoth(c, true);
  }

  // Passes a failure on: both sides get a reset, as they would from a broken path.
  void AbortBoth(Connection& c, bool upstream_failed = false) {
    if (c.finished) return;
    Abort(c.client);
    Abort(c.upstream);
    c.client = c.upstream = -1;
    c.finished = true;
    ++aborted_;
    if (upstream_failed) ++upstream_failures_;
  }

  void Close(Connection& c) {
    if (c.finished) return;
    CloseQuietly(c.client);
    CloseQuietly(c.upstream);
    c.client = c.upstream = -1;
    c.finished = true;
  }

  void Serve(Connection& c, bool client_side, short events) {
    if (c.finished) return;
    if (!Forwarding()) {
      // A black hole: remember the hang-up, act on it when forwarding resumes.
      (client_side ? c.client_hung : c.upstream_hung) = true;
      return;
    }
    const int fd = client_side ? c.client : c.upstream;
    Flow& from = client_side ? c.up : c.down;  // what this fd is the source of
    Flow& to = client_side ? c.down : c.up;    // ... and the sink of
    if (!client_side && c.connecting) {
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) return AbortBoth(c, true);
      c.connecting = false;
      return;  // writes and reads follow in the flush and the next round
    }
    if (events & POLLERR) return AbortBoth(c);
    if ((events & (POLLIN | POLLHUP)) && !from.source_ended) {
      Read(c, fd, from, client_side);
      if (c.finished) return;
    } else if ((events & POLLHUP) && !to.sink_shut) {
      // Gone for good while still owed bytes: writing would fail; pass it on as a reset.
      return AbortBoth(c);
    }
    if ((events & POLLOUT) && !c.finished) Write(c, fd, to);
  }

  void Read(Connection& c, int fd, Flow& flow, bool client_side) {
    char buffer[kReadChunk];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      const auto delay = client_side ? delay_up_ : delay_down_;
      flow.chunks.push_back({Clock::now() + delay, std::string(buffer, static_cast<size_t>(n))});
      flow.queued += static_cast<size_t>(n);
      (client_side ? bytes_up_ : bytes_down_) += static_cast<uint64_t>(n);
    } else if (n == 0) {
      flow.source_ended = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      AbortBoth(c);
    }
  }

  void Write(Connection& c, int fd, Flow& flow) {
    const Clock::time_point now = Clock::now();
    while (flow.Due(now)) {
      Chunk& chunk = flow.chunks.front();
      const ssize_t n = send(fd, chunk.bytes.data() + chunk.written,
                             chunk.bytes.size() - chunk.written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        return AbortBoth(c);
      }
      chunk.written += static_cast<size_t>(n);
      flow.queued -= static_cast<size_t>(n);
      if (chunk.written < chunk.bytes.size()) return;
      flow.chunks.pop_front();
    }
  }

  // Writes what is due, passes ends of stream on, and closes a connection both of whose
  // directions have ended.
  void Flush(Connection& c) {
    if (c.connecting || c.upstream < 0) return;
    struct Leg {
      Flow& flow;
      int sink;
    };
    for (Leg leg : {Leg{c.up, c.upstream}, Leg{c.down, c.client}}) {
      if (c.finished) return;
      Write(c, leg.sink, leg.flow);
      if (c.finished) return;
      if (leg.flow.source_ended && leg.flow.chunks.empty() && !leg.flow.sink_shut) {
        shutdown(leg.sink, SHUT_WR);
        leg.flow.sink_shut = true;
      }
    }
    if (c.up.sink_shut && c.down.sink_shut) Close(c);
  }

  void AcceptControl() {
    while (true) {
      const int fd = accept4(control_listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      controls_.emplace_back().fd = fd;
    }
  }

  void ServeControl(ControlClient& k) {
    char buffer[512];
    const ssize_t n = recv(k.fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(k.fd);
        k.finished = true;
      }
      return;
    }
    k.pending.append(buffer, static_cast<size_t>(n));
    size_t end;
    while ((end = k.pending.find('\n')) != std::string::npos) {
      std::string line = k.pending.substr(0, end);
      k.pending.erase(0, end + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const std::string answer = Command(line) + "\n";
      // A one-line answer fits the socket's buffer; a client that does not read it loses it.
      if (send(k.fd, answer.data(), answer.size(), MSG_NOSIGNAL) < 0) break;
    }
    if (k.pending.size() > kMaxControlLine) {
      const std::string answer = "error: command longer than 1024 bytes\n";
      send(k.fd, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(k.fd);
      k.finished = true;
    }
  }

  // Applies one control command; the answer is one line.
  std::string Command(const std::string& line) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "status") return "ok " + Counters();
    Mode mode;
    std::chrono::milliseconds up{0}, down{0};
    if (verb == "pass") {
      mode = Mode::kPass;
    } else if (verb == "drop") {
      mode = Mode::kDrop;
    } else if (verb == "reset") {
      mode = Mode::kReset;
    } else if (verb == "blackhole") {
      mode = Mode::kBlackhole;
    } else if (verb == "delay") {
      long long first = -1, second = -1;
      if (!(in >> first) || first < 0 || first > 3'600'000) {
        return "error: delay takes milliseconds (0 to 3600000), one or one per direction";
      }
      if (!(in >> second)) second = first;
      if (second < 0 || second > 3'600'000) return "error: delay: bad second duration";
      mode = Mode::kDelay;
      up = std::chrono::milliseconds(first);
      down = std::chrono::milliseconds(second);
    } else {
      return "error: unknown command '" + verb +
             "' (pass, delay MS [MS], drop, reset, blackhole, status)";
    }
    std::string extra;
    if (in >> extra) return "error: " + verb + ": unexpected '" + extra + "'";
    SetMode(mode, up, down);
    return "ok " + Counters();
  }

  void SetMode(Mode mode, std::chrono::milliseconds up, std::chrono::milliseconds down) {
    mode_ = mode;
    delay_up_ = up;
    delay_down_ = down;
    size_t ended = 0;
    for (Connection& c : connections_) {
      if (c.finished) continue;
      c.client_hung = c.upstream_hung = false;  // forwarding, if it resumes, finds out why
      if (mode == Mode::kDrop) {
        Close(c);
        ++ended;
      } else if (mode == Mode::kReset) {
        AbortBoth(c);
        ++ended;
      }
    }
    std::fprintf(stderr, "fault proxy: mode %s (%zu connections ended)\n", ModeName(mode), ended);
  }

  Options options_;
  Mode mode_;
  std::chrono::milliseconds delay_up_{0}, delay_down_{0};
  Address upstream_;
  int listener_ = -1, control_listener_ = -1;
  std::list<Connection> connections_;  // stable addresses: poll slots point at them
  std::list<ControlClient> controls_;
  uint64_t accepted_ = 0, refused_ = 0, aborted_ = 0, upstream_failures_ = 0;
  uint64_t bytes_up_ = 0, bytes_down_ = 0;
};

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "weft_fault_proxy: error: %s\n"
               "usage: weft_fault_proxy --upstream HOST:PORT [--listen ADDRESS:PORT] "
               "[--control ADDRESS:PORT] [--mode pass|drop|reset|blackhole]\n",
               why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--upstream") {
      options.upstream = value;
    } else if (flag == "--listen") {
      options.listen = value;
    } else if (flag == "--control") {
      options.control = value;
    } else if (flag == "--mode") {
      if (value == "pass")
        options.mode = Mode::kPass;
      else if (value == "drop")
        options.mode = Mode::kDrop;
      else if (value == "reset")
        options.mode = Mode::kReset;
      else if (value == "blackhole")
        options.mode = Mode::kBlackhole;
      else
        return Usage("--mode: '" + value + "' is not pass, drop, reset or blackhole");
    } else {
      return Usage("unknown option " + flag);
    }
  }
  if (options.upstream.empty()) return Usage("--upstream is required");

  // The stop signals stay blocked except inside ppoll, which they interrupt.
  sigset_t stop_signals, while_polling;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigprocmask(SIG_BLOCK, &stop_signals, &while_polling);
  sigdelset(&while_polling, SIGTERM);
  sigdelset(&while_polling, SIGINT);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  FaultProxy proxy(options);
  Status started = proxy.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "weft_fault_proxy: error: %s\n", started.ToString().c_str());
    return 1;
  }
  proxy.Run(while_polling);
  return 0;
}
