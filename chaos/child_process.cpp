#include "chaos/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace troupe {

namespace {

// The children alive, for kill_all() (a signal handler may read it, so
// plain atomics in a fixed table, no allocation, no lock).
constexpr size_t kMaxChildren = 512;
std::atomic<int> g_children[kMaxChildren];

void remember(int pid) {
  for (auto& slot : g_children) {
    int empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void forget(int pid) {
  for (auto& slot : g_children) {
    int p = pid;
    if (slot.compare_exchange_strong(p, 0)) return;
  }
}

// Children are forked by one thread that lives as long as the process.
// PR_SET_PDEATHSIG fires when the thread that forked the child ends, not
// the process: a child forked by a short-lived thread (a node restarted by
// troupe chaos's fault thread) would be killed when that thread returns.
class Spawner {
 public:
  // Never destroyed: its thread runs until the process exits, past static
  // destructors. A process forked from this one (a test's helper) has no
  // copy of the thread, so it makes its own.
  static Spawner& get() {
    Slot& s = slot();
    std::lock_guard<std::mutex> l(s.mu);
    if (!s.spawner || s.owner != getpid()) {
      s.spawner = new Spawner;  // a forked copy's old one is left alone
      s.owner = getpid();
    }
    return *s.spawner;
  }
  // Runs `fork_it` (which forks and returns the pid, or -1 with errno) on
  // the spawner's thread; its result and errno.
  std::pair<int, int> run(const std::function<int()>& fork_it) {
    Job job{&fork_it};
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return job_ == nullptr; });
    job_ = &job;
    cv_.notify_all();
    done_cv_.wait(l, [&] { return job.done; });
    return {job.pid, job.err};
  }

 private:
  struct Slot {
    std::mutex mu;
    Spawner* spawner = nullptr;
    pid_t owner = 0;
  };
  static Slot& slot() {
    static Slot* s = [] {
      Slot* made = new Slot;
      // A fork while another thread makes a spawner leaves the lock
      // consistent in the child.
      pthread_atfork([] { slot().mu.lock(); }, [] { slot().mu.unlock(); },
                     [] { slot().mu.unlock(); });
      return made;
    }();
    return *s;
  }
  struct Job {
    const std::function<int()>* fork_it;
    int pid = -1, err = 0;
    bool done = false;
  };
  Spawner() {
    std::thread([this] {
      // Signals for the process go to its other threads.
      sigset_t all;
      sigfillset(&all);
      pthread_sigmask(SIG_BLOCK, &all, nullptr);
      std::unique_lock<std::mutex> l(mu_);
      for (;;) {
        cv_.wait(l, [&] { return job_ != nullptr; });
        errno = 0;
        job_->pid = (*job_->fork_it)();
        job_->err = errno;
        job_->done = true;
        job_ = nullptr;
        done_cv_.notify_all();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;
};

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path,
                           const std::string& cwd) {
  if (!log_path.empty()) {
    log_ = std::fopen(log_path.c_str(), "a");
    if (!log_) throw std::runtime_error("cannot write " + log_path);
  }
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  // Everything the child needs is made here: between fork and exec it may
  // only make async-signal-safe calls (no allocation).
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const char* dir = cwd.empty() ? nullptr : cwd.c_str();
  const pid_t parent = getpid();
  const std::function<int()> fork_it = [&]() -> int {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    // The child dies with this process, however it ends (SIGKILL included):
    // a node left stopped (SIGSTOP) still takes SIGKILL. The parent may
    // have died before the call: then it is not ours to wait for.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(125);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fds[1], 2);
    close(fds[0]);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
    }
    // Nothing else of the parent's (its sockets, other children's pipes)
    // leaks into the child: a process started late would hold them all.
    close_range(3, ~0U, 0);
    if (dir && chdir(dir) != 0) _exit(126);
    execv(args[0], args.data());
    _exit(127);
  };
  const auto [pid, err] = Spawner::get().run(fork_it);
  pid_ = pid;
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    if (log_) std::fclose(log_);
    log_ = nullptr;
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(err));
  }
  remember(pid_);
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

void ChildProcess::kill_all() {
  for (auto& slot : g_children)
    if (const int pid = slot.load(); pid > 0) ::kill(pid, SIGKILL);
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
  if (waitpid(pid_, &status_, block ? 0 : WNOHANG) == pid_) {
    reaped_ = true;
    forget(pid_);
  }
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
