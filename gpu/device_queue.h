#pragma once
// A device's work queue. The engine posts jobs; the device's own thread (a
// plain thread, or a shard actor in the serving runtime) runs them in order.
// When the device dies the queue closes, and every job it had not started is
// abandoned: the rest of its group learns of the death at once instead of
// waiting for it forever in a collective or for its activations.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace troupe {

struct DeviceJob {
  std::function<void()> run;
  // Called instead of run when the device dies before starting the job.
  std::function<void(const std::string& why)> abandon;
};

class DeviceQueue {
 public:
  // Queues the job and calls the notify hook. On a closed queue the job is
  // abandoned at once and false is returned.
  bool post(DeviceJob job);
  // The next job, or nothing when none is queued or the queue is closed.
  std::optional<DeviceJob> try_pop();
  // Waits for the next job; nothing once the queue is closed.
  std::optional<DeviceJob> wait_pop();
  // Closes the queue (the device is dead or stopped) and abandons every
  // queued job with `why`. The first reason wins; later calls do nothing.
  void close(const std::string& why);
  bool closed() const;
  std::string close_reason() const;
  void wait_closed() const;
  // Called after every successful post, outside the lock: how a runner that
  // is not blocked in wait_pop (an actor) learns that a job is waiting.
  void set_notify(std::function<void()> notify);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<DeviceJob> jobs_;
  bool closed_ = false;
  std::string why_;
  std::function<void()> notify_;
};

// What drains a device's queue. Destroying it stops the device after its
// current job, closes the queue, and returns only once the runner is done:
// no job of it runs any more and every one it held has been abandoned (jobs
// and their abandon hooks use the engine, which is freed right after).
class DeviceRunner {
 public:
  virtual ~DeviceRunner() = default;
};

// Starts the runner of device (stage, rank). The default runs a plain thread.
using DeviceLauncher = std::function<std::unique_ptr<DeviceRunner>(
    int stage, int rank, std::shared_ptr<DeviceQueue> queue)>;

// A plain thread: runs jobs until the queue closes. A job that throws kills
// the device: the queue closes with the exception's message.
std::unique_ptr<DeviceRunner> launch_device_thread(int stage, int rank,
                                                   std::shared_ptr<DeviceQueue> queue);

// Runs one job; if it throws, closes the queue with the message naming the
// device, and rethrows (the device is dead). Shared by every runner.
void run_device_job(DeviceJob& job, DeviceQueue& queue, int stage, int rank);
// The queue's closing message for device (stage, rank) dying of `what`.
std::string device_death(int stage, int rank, const std::string& what);

}  // namespace troupe
