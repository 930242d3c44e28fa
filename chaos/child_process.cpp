#include "chaos/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace troupe {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  if (!log_path.empty()) {
    log_ = std::fopen(log_path.c_str(), "a");
    if (!log_) throw std::runtime_error("cannot write " + log_path);
  }
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
  const int fd = fds[0];
  reader_ = std::thread([this, fd] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> l(mu_);
      if (n <= 0) {
        eof_ = true;
        cv_.notify_all();
        break;
      }
      if (log_) {
        std::fwrite(buf, 1, size_t(n), log_);
        std::fflush(log_);
      }
      // A long run's chatter stays in its log file; what is waited for
      // comes early.
      if (err_.size() < kMaxKeptBytes) err_.append(buf, size_t(n));
      cv_.notify_all();
    }
    close(fd);
  });
}

ChildProcess::~ChildProcess() {
  stop(10);
  if (reader_.joinable()) reader_.join();
  if (log_) std::fclose(log_);
}

bool ChildProcess::running() {
  return pid_ > 0 && !reap(false);
}

int ChildProcess::exit_code() {
  return reap(false) ? code() : -1;
}

std::string ChildProcess::stderr_so_far() const {
  std::lock_guard<std::mutex> l(mu_);
  return err_;
}

std::string ChildProcess::wait_for_line(const std::string& needle, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    for (size_t nl; (nl = err_.find('\n', scanned_)) != std::string::npos; scanned_ = nl + 1) {
      const std::string line = err_.substr(scanned_, nl - scanned_);
      if (line.find(needle) != std::string::npos) {
        scanned_ = nl + 1;
        return line;
      }
    }
    if (eof_) return "";
    if (cv_.wait_until(l, deadline) == std::cv_status::timeout) return "";
  }
}

void ChildProcess::signal(int sig) {
  if (!reaped_ && pid_ > 0) kill(pid_, sig);
}

bool ChildProcess::reap(bool block) {
  if (reaped_) return true;
  if (waitpid(pid_, &status_, block ? 0 : WNOHANG) == pid_) reaped_ = true;
  return reaped_;
}

int ChildProcess::code() const {
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

int ChildProcess::wait_exit(double timeout_s) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!reap(false)) {
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Its last words (the reason it stopped) are read before returning.
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::seconds(2), [&] { return eof_; });
  return code();
}

int ChildProcess::stop(double timeout_s) {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    kill(pid_, SIGTERM);
    if (wait_exit(timeout_s) < 0) {
      kill(pid_, SIGKILL);
      reap(true);
    }
  }
  return code();
}

}  // namespace troupe
