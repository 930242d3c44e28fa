#pragma once
// A fixed set of compute threads that run one parallel loop at a time.
// Workers spin briefly before sleeping, because a decode step runs hundreds
// of short loops and a futex wake-up per loop would cost more than the work.
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace troupe {

class ThreadPool {
 public:
  // n_threads counts the calling thread: 1 means no worker threads.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(task, thread) for every task in [0, n_tasks) and returns when all
  // are done. Tasks are claimed dynamically; `thread` is in [0, size()).
  // Not reentrant: call from one thread at a time.
  void parallel_for(int n_tasks, const std::function<void(int, int)>& fn);

 private:
  void worker_loop(int thread);
  void run_tasks(int thread);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> busy_{0};
  std::atomic<int> generation_{0};  // int: waits on it are plain futex waits
  std::atomic<bool> stop_{false};
};

}  // namespace troupe
