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
  // are done. Tasks are claimed dynamically; `thread` is in [0, size()). The
  // caller runs tasks too, and waits only for tasks a worker has claimed: a
  // worker not yet awake (the machine busy with other threads) costs nothing
  // once the caller has done the work itself.
  // Not reentrant: call from one thread at a time.
  void parallel_for(int n_tasks, const std::function<void(int, int)>& fn);

  // No loop follows soon (a step is over): the workers sleep now instead of
  // spinning, so that they leave the cores to other threads until the next
  // loop wakes them.
  void rest() { resting_.store(true, std::memory_order_relaxed); }

 private:
  // The current loop in one word, so that a claim is one compare-and-swap
  // that fails if the loop it was meant for has ended:
  // [loop number : 32 | tasks : 16 | next task : 16]. A loop of more tasks
  // runs as several.
  static constexpr int kTaskBits = 16;
  static constexpr uint64_t kTaskMask = (uint64_t(1) << kTaskBits) - 1;
  static constexpr int kMaxTasks = int(kTaskMask);

  void worker_loop(int thread);
  void run_tasks(int thread);
  void run_batch(int n_tasks, const std::function<void(int, int)>& fn, int offset);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  int offset_ = 0;  // task numbers of this batch start here (loops over kMaxTasks)
  std::atomic<uint64_t> work_{0};
  std::atomic<int> done_{0};        // tasks of the current loop finished
  std::atomic<int> generation_{0};  // int: waits on it are plain futex waits
  uint64_t loops_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> resting_{false};
};

}  // namespace troupe
