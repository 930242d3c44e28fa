#pragma once
// A child process (troupe chaos's coordinator and nodes, and the tests'
// servers): started without a shell, its stderr read by a thread of its
// own and searchable line by line.
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe {

// A child process (no shell) whose stderr is captured by a thread of its
// own (so a chatty child never blocks on a full pipe); killed (SIGTERM, then
// SIGKILL) and reaped on destruction. It never outlives this process: it
// gets SIGKILL when this process ends, however it ends (kill -9 included;
// PR_SET_PDEATHSIG, set in every child by one fork thread that lasts as
// long as the process).
class ChildProcess {
 public:
  // argv[0] is the program's path. With `log_path`, stderr is also
  // appended to that file as it comes; with `cwd`, the child runs there.
  explicit ChildProcess(const std::vector<std::string>& argv, const std::string& log_path = "",
                        const std::string& cwd = "");
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Waits until a line of stderr (after what earlier calls consumed)
  // contains `needle`; returns that line, or "" on timeout or exit.
  std::string wait_for_line(const std::string& needle, double timeout_s);
  std::string stderr_so_far() const;
  int pid() const { return pid_; }
  bool running();
  // Its exit code (128 + signal when killed), or -1 while it runs.
  int exit_code();
  void signal(int sig);
  // Waits for the child to exit on its own; its exit code (128 + signal
  // when killed), or -1 when it is still running at the timeout.
  int wait_exit(double timeout_s);
  // Sends SIGTERM and waits (SIGKILL past the timeout); the exit code.
  int stop(double timeout_s = 20);

  // SIGKILLs every child still running; async-signal-safe, for a signal
  // handler of the parent, whose own exit would otherwise orphan them.
  static void kill_all();

 private:
  bool reap(bool block);
  int code() const;

  static constexpr size_t kMaxKeptBytes = 8u << 20;

  int pid_ = -1;
  std::FILE* log_ = nullptr;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string err_;
  bool eof_ = false;
  size_t scanned_ = 0;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace troupe
