#include "gpu/device_queue.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <thread>
#include <vector>

namespace troupe {

bool DeviceQueue::post(DeviceJob job) {
  std::function<void()> notify;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (closed_) {
      const std::string why = why_;
      l.unlock();
      job.abandon(why);
      return false;
    }
    jobs_.push_back(std::move(job));
    notify = notify_;
  }
  cv_.notify_one();
  if (notify) notify();
  return true;
}

std::optional<DeviceJob> DeviceQueue::try_pop() {
  std::lock_guard<std::mutex> l(mu_);
  if (closed_ || jobs_.empty()) return std::nullopt;
  DeviceJob job = std::move(jobs_.front());
  jobs_.pop_front();
  return job;
}

std::optional<DeviceJob> DeviceQueue::wait_pop() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return closed_ || !jobs_.empty(); });
  if (closed_) return std::nullopt;
  DeviceJob job = std::move(jobs_.front());
  jobs_.pop_front();
  return job;
}

void DeviceQueue::close(const std::string& why) {
  std::deque<DeviceJob> orphans;
  std::string reason;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    why_ = why.empty() ? "device stopped" : why;
    reason = why_;
    orphans.swap(jobs_);
  }
  cv_.notify_all();
  for (auto& job : orphans) job.abandon(reason);
}

bool DeviceQueue::closed() const {
  std::lock_guard<std::mutex> l(mu_);
  return closed_;
}

std::string DeviceQueue::close_reason() const {
  std::lock_guard<std::mutex> l(mu_);
  return why_;
}

void DeviceQueue::wait_closed() const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return closed_; });
}

void DeviceQueue::set_notify(std::function<void()> notify) {
  std::lock_guard<std::mutex> l(mu_);
  notify_ = std::move(notify);
}

std::string device_death(int stage, int rank, const std::string& what) {
  return "device (stage " + std::to_string(stage) + ", rank " + std::to_string(rank) +
         ") died: " + what;
}

void run_device_job(DeviceJob& job, DeviceQueue& queue, int stage, int rank) {
  try {
    job.run();
  } catch (const std::exception& e) {
    queue.close(device_death(stage, rank, e.what()));
    throw;
  } catch (...) {
    queue.close(device_death(stage, rank, "unknown exception"));
    throw;
  }
}

namespace {

class DeviceThread : public DeviceRunner {
 public:
  DeviceThread(int stage, int rank, std::shared_ptr<DeviceQueue> queue)
      : queue_(std::move(queue)), thread_([this, stage, rank] {
          while (auto job = queue_->wait_pop()) {
            try {
              run_device_job(*job, *queue_, stage, rank);
            } catch (...) {
              spdlog::error("{}", queue_->close_reason());
              return;
            }
          }
        }) {}
  ~DeviceThread() override {
    queue_->close("device stopped");
    thread_.join();
  }

 private:
  std::shared_ptr<DeviceQueue> queue_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<DeviceRunner> launch_device_thread(int stage, int rank,
                                                   std::shared_ptr<DeviceQueue> queue) {
  return std::make_unique<DeviceThread>(stage, rank, std::move(queue));
}

}  // namespace troupe
