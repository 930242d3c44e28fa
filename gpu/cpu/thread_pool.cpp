#include "gpu/cpu/thread_pool.h"

#include <immintrin.h>

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
  for (;;) {
    const int task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*job_)(task, thread);
  }
}

void ThreadPool::parallel_for(int n_tasks, const std::function<void(int, int)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  job_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_tasks(0);
  int left = busy_.load(std::memory_order_acquire);
  for (int i = 0; left != 0 && i < kSpinIterations; ++i) {
    _mm_pause();
    left = busy_.load(std::memory_order_acquire);
  }
  while (left != 0) {
    busy_.wait(left, std::memory_order_acquire);
    left = busy_.load(std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int thread) {
  int seen = 0;
  for (;;) {
    int gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
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
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_one();
  }
}

}  // namespace troupe
