#include "cli/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

extern char** environ;

namespace weft::cli {

using Clock = std::chrono::steady_clock;

Child MakeChild(std::string name, std::vector<std::string> args, bool restart, std::string listen) {
  Child child;
  child.name = std::move(name);
  child.args = std::move(args);
  child.restart = restart;
  child.listen = std::move(listen);
  return child;
}

Result<std::string> FindExecutable(const std::string& name, const std::string& search_path) {
  auto executable = [](const std::string& path) {
    struct stat info {};
    return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    std::error_code error;
    const std::string path = std::filesystem::absolute(name, error).string();
    if (error || !executable(path)) return NotFound("'" + name + "' is not an executable file");
    return path;
  }
  size_t begin = 0;
  while (begin <= search_path.size()) {
    size_t end = search_path.find(':', begin);
    if (end == std::string::npos) end = search_path.size();
    // An empty entry is the working directory, as for execvp.
    const std::string dir = end == begin ? "." : search_path.substr(begin, end - begin);
    const std::string candidate = dir + "/" + name;
    if (executable(candidate)) {
      std::error_code error;
      const std::string path = std::filesystem::absolute(candidate, error).string();
      return error ? candidate : path;
    }
    begin = end + 1;
  }
  return NotFound("'" + name + "' is not an executable found on PATH (" + search_path + ")");
}

Status Supervisor::Start(Child& child) {
  // Everything the child needs is made here: between fork and exec only async-signal-safe calls.
  const bool own = child.executable.empty();
  const std::string program = own ? binary_ : child.executable;
  std::vector<std::string> argv = {own ? binary_ : (child.argv0.empty() ? program : child.argv0)};
  argv.insert(argv.end(), child.args.begin(), child.args.end());
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string entry = *variable;
    if (!child.environment.count(entry.substr(0, entry.find('=')))) environment.push_back(entry);
  }
  for (const auto& [name, value] : child.environment) environment.push_back(name + "=" + value);
  std::vector<char*> raw_environment;
  for (std::string& e : environment) raw_environment.push_back(e.data());
  raw_environment.push_back(nullptr);
  const std::string exec_failed = "weft run: cannot execute " + program + "\n";
  const std::string log = log_dir_ + "/" + child.name + ".log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot open " + log);
  sigset_t none;
  sigemptyset(&none);
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(fd);
    return Internal("fork failed for " + child.name);
  }
  if (pid == 0) {
    // The child: its own process group (a Ctrl-C reaches only weft run, which stops everything
    // in order), output to its log, signals unblocked.
    setpgid(0, 0);
    // weft run (or generate) killed outright: its processes die too, at once. (A SIGTERM would
    // have its workers drain towards an orchestrator that is gone, for minutes of deadlines.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fd, 1);
    dup2(fd, 2);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(program.c_str(), raw.data(), raw_environment.data());
    const ssize_t ignored = ::write(2, exec_failed.data(), exec_failed.size());
    (void)ignored;
    _exit(127);
  }
  ::close(fd);
  setpgid(pid, pid);  // as the child does: a Stop right after Start reaches its group
  child.pid = pid;
  child.running = true;
  child.ended.clear();
  return Status::Ok();
}

std::vector<Child*> Supervisor::Reap(std::vector<Child>& children) {
  std::vector<Child*> ended;
  for (Child& c : children) {
    if (!c.running) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.running = false;
      c.ended = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                  : "killed by signal " + std::to_string(WTERMSIG(status));
      c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      ended.push_back(&c);
    }
  }
  return ended;
}

void Supervisor::Stop(std::vector<Child*> children, std::chrono::milliseconds grace) {
  for (Child* c : children) {
    if (c->running) kill(-c->pid, SIGTERM);
  }
  const auto deadline = Clock::now() + grace;
  for (Child* c : children) {
    while (c->running) {
      int status = 0;
      if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
        c->running = false;
        c->ended = "stopped";
        break;
      }
      if (Clock::now() > deadline) {
        kill(-c->pid, SIGKILL);
        waitpid(c->pid, &status, 0);
        c->running = false;
        c->ended =
            "killed after not stopping within " + std::to_string(grace.count() / 1000) + " s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

bool WaitForPort(const std::string& listen, std::chrono::milliseconds timeout, const Child& child) {
  const size_t colon = listen.rfind(':');
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(listen.substr(colon + 1))));
  std::string host = listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) return false;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    if (connected) return true;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) return false;  // it died
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace weft::cli
