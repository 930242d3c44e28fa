#include "gpu/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <stdexcept>

namespace troupe {

namespace {
// About 50-100 us of spinning: longer than the gap between two loops of a
// decode step, short enough not to starve other processes when the machine
// is oversubscribed (tests running in parallel).
constexpr int kSpinIterations = 1 << 10;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads < 1) throw std::invalid_argument("thread count must be >= 1");
  for (int t = 1; t < n_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks(int thread) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = w & kTaskMask, tasks = (w >> kTaskBits) & kTaskMask;
    if (next >= tasks) return;
    // A claim of a loop that has ended fails: its word has changed.
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acquire,
                                     std::memory_order_acquire))
      continue;
    // The claimed task keeps the loop (and job_) alive until it is done.
    (*job_)(offset_ + int(next), thread);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == int(tasks)) done_.notify_one();
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run_batch(int n_tasks, const std::function<void(int, int)>& fn, int offset) {
  job_ = &fn;
  offset_ = offset;
  done_.store(0, std::memory_order_relaxed);
  resting_.store(false, std::memory_order_relaxed);
  ++loops_;
  const uint64_t word = (loops_ << (2 * kTaskBits)) | (uint64_t(n_tasks) << kTaskBits);
  work_.store(word, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_tasks(0);
  int done = done_.load(std::memory_order_acquire);
  for (int i = 0; done != n_tasks && i < kSpinIterations; ++i) {
    _mm_pause();
    done = done_.load(std::memory_order_acquire);
  }
  while (done != n_tasks) {
    done_.wait(done, std::memory_order_acquire);
    done = done_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int n_tasks, const std::function<void(int, int)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  for (int offset = 0; offset < n_tasks; offset += kMaxTasks)
    run_batch(std::min(kMaxTasks, n_tasks - offset), fn, offset);
}

void ThreadPool::worker_loop(int thread) {
  int seen = 0;
  for (;;) {
    int gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      if (resting_.load(std::memory_order_relaxed)) break;
      _mm_pause();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = gen;
    if (stop_.load()) return;
    run_tasks(thread);
  }
}

}  // namespace troupe
