#include "support/test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe::test {

std::filesystem::path source_dir() {
  return TROUPE_SOURCE_DIR;
}
std::filesystem::path model_path(const std::string& name) {
  return source_dir() / "models" / name;
}
std::filesystem::path data_path(const std::string& name) {
  return std::filesystem::path(TROUPE_TEST_DATA) / name;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
           std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

CommandResult run_command(const std::vector<std::string>& argv, int timeout_s) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  CommandResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  bool killed = false;
  char buf[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    int n = poll(fds, 2, left > 0 ? int(std::min<long>(left, 1000)) : 100);
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, size_t(got));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace troupe::test

namespace troupe::test {

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  err_fd_ = fds[0];
  fcntl(err_fd_, F_SETFL, fcntl(err_fd_, F_GETFL) | O_NONBLOCK);
}

ChildProcess::~ChildProcess() {
  stop(10);
  if (err_fd_ >= 0) close(err_fd_);
}

std::string ChildProcess::wait_for_line(const std::string& needle, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t scanned = 0;
  for (;;) {
    // Check complete lines seen so far.
    for (size_t nl; (nl = err_.find('\n', scanned)) != std::string::npos; scanned = nl + 1) {
      const std::string line = err_.substr(scanned, nl - scanned);
      if (line.find(needle) != std::string::npos) return line;
    }
    if (std::chrono::steady_clock::now() >= deadline) return "";
    pollfd p{err_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(err_fd_, buf, sizeof buf);
      if (n > 0)
        err_.append(buf, size_t(n));
      else if (n == 0)
        return "";  // exited
    }
  }
}

void ChildProcess::signal(int sig) {
  if (!reaped_ && pid_ > 0) kill(pid_, sig);
}

int ChildProcess::stop(double timeout_s) {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    kill(pid_, SIGTERM);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!reaped_) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        reaped_ = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        reaped_ = true;
        break;
      }
      // Keep draining stderr so the child never blocks on a full pipe.
      char buf[4096];
      while (read(err_fd_, buf, sizeof buf) > 0) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body, double timeout_s,
                          const HttpHeaders& extra_headers) {
  HttpClient client(loopback_client(port, timeout_s));
  return client.request({.method = method,
                         .target = target,
                         .body = body,
                         .headers = extra_headers,
                         .keep_alive = false});
}

HttpClient::Options loopback_client(int port, double timeout_s, bool retry_stale) {
  HttpClient::Options o;
  o.host = "127.0.0.1";
  o.port = std::to_string(port);
  o.connect_timeout_s = timeout_s;
  o.io_timeout_s = timeout_s;
  o.retry_stale_connection = retry_stale;
  return o;
}

}  // namespace troupe::test
