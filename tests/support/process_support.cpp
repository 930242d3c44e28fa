#include "support/process_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

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
