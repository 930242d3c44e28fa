#pragma once
// Helpers for integration tests: child processes and HTTP requests on
// 127.0.0.1 (with the shared client, net/http_client.h).
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/http_client.h"

namespace troupe::test {

// A child process (no shell) whose stderr is captured by a thread of its
// own (so a chatty child never blocks on a full pipe); killed (SIGTERM, then
// SIGKILL) and reaped on destruction.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Waits until a line of stderr (after what earlier calls consumed)
  // contains `needle`; returns that line, or "" on timeout or exit.
  std::string wait_for_line(const std::string& needle, double timeout_s);
  std::string stderr_so_far() const;
  int pid() const { return pid_; }
  void signal(int sig);
  // Waits for the child to exit on its own; its exit code (128 + signal
  // when killed), or -1 when it is still running at the timeout.
  int wait_exit(double timeout_s);
  // Sends SIGTERM and waits (SIGKILL past the timeout); the exit code.
  int stop(double timeout_s = 20);

 private:
  bool reap(bool block);
  int code() const;

  int pid_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string err_;
  bool eof_ = false;
  size_t scanned_ = 0;
  bool reaped_ = false;
  int status_ = 0;
};

// One HTTP/1.1 request with the shared client (net/http_client.h) on a fresh
// connection to 127.0.0.1:port ("Connection: close"); status 0 when no
// response arrived.
HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body = "", double timeout_s = 60,
                          const HttpHeaders& extra_headers = {});

// The shared client's options for 127.0.0.1:port, every wait bounded by
// timeout_s. A server's own tests pass retry_stale = false, so that a
// connection the server closed wrongly is not quietly replaced.
HttpClient::Options loopback_client(int port, double timeout_s, bool retry_stale = true);

}  // namespace troupe::test
