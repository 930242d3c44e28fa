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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>

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

std::string HttpResponse::header(const std::string& name) const {
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  const std::string h = lower(headers), n = lower(name) + ":";
  size_t pos = 0;
  while ((pos = h.find(n, pos)) != std::string::npos) {
    if (pos == 0 || h[pos - 1] == '\n') {
      size_t b = pos + n.size(), e = headers.find("\r\n", b);
      std::string v = headers.substr(b, e - b);
      v.erase(0, v.find_first_not_of(' '));
      return v;
    }
    ++pos;
  }
  return "";
}

HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body, double timeout_s,
                          const std::string& extra_headers) {
  HttpResponse r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{long(timeout_s), long((timeout_s - long(timeout_s)) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return r;
  }
  std::string req = method + " " + target +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST")
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string raw;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  close(fd);
  const size_t split = raw.find("\r\n\r\n");
  if (split == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) return r;
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  r.headers = raw.substr(0, split + 2);
  std::string rest = raw.substr(split + 4);
  if (r.header("Transfer-Encoding").find("chunked") != std::string::npos) {
    size_t pos = 0;
    for (;;) {
      const size_t eol = rest.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t len = std::strtoul(rest.c_str() + pos, nullptr, 16);
      if (len == 0) break;
      r.body.append(rest, eol + 2, len);
      pos = eol + 2 + len + 2;
    }
  } else {
    r.body = rest;
  }
  return r;
}

}  // namespace troupe::test
