#pragma once
// A small thread-safe metrics registry (counters, gauges, histograms with
// label sets) rendered in the Prometheus text exposition format.
//
// Why hand-written and not prometheus-cpp: it is not in Debian 12's packages,
// and what /metrics needs is a few hundred lines.
//
// Cost on hot paths: a labelled child is found once (a short mutex and a map
// lookup) and the returned reference stays valid for the registry's lifetime,
// so code that updates per step should keep the reference; updating it is one
// relaxed atomic operation (histograms: two).
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class Counter {
 public:
  // Throws std::invalid_argument for a negative or NaN amount: a counter only goes up.
  void inc(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the upper bounds (inclusive, "le") of the finite buckets,
  // strictly increasing; the +Inf bucket is implicit. Throws
  // std::invalid_argument otherwise.
  explicit Histogram(std::vector<double> bounds);

  void observe(double v);  // NaN is ignored

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // _count is derived from the buckets, so a snapshot taken during updates
  // is still self-consistent (+Inf bucket == count); only _sum may lag.
  Snapshot snapshot() const;

  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0};
};

// Buckets growing by `factor` from `start`: start, start*factor, ... (`count` of them).
std::vector<double> exponential_buckets(double start, double factor, int count);

enum class MetricType { Counter, Gauge, Histogram };

// One metric name with its label names; children are created on first use of
// a label-value combination and live as long as the family.
template <class T>
class Family {
 public:
  // Throws std::invalid_argument if the number of values differs from the
  // number of label names.
  T& labels(const std::vector<std::string>& values);
  T& labels(std::initializer_list<std::string_view> values);
  // Drops one child (a series whose subject is gone for good); a later
  // labels() makes it anew. References to it must not be held.
  void remove(const std::vector<std::string>& values);

  const std::string& name() const { return name_; }

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::vector<double> bounds);
  std::string render() const;

  std::string name_, help_;
  MetricType type_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;  // histograms only
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registering a name again with the same type and label names returns the
  // existing family; anything else (bad name, bad label name, a clash) throws
  // std::invalid_argument naming the metric. A family without labels has its
  // single child created at once, so it is rendered (as 0) before first use.
  Family<Counter>& counter(const std::string& name, const std::string& help,
                           std::vector<std::string> label_names = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help,
                       std::vector<std::string> label_names = {});
  Family<Histogram>& histogram(const std::string& name, const std::string& help,
                               std::vector<double> bounds,
                               std::vector<std::string> label_names = {});

  // Prometheus text exposition format 0.0.4, families in registration order.
  std::string render() const;

 private:
  struct Entry {
    MetricType type;
    std::vector<std::string> label_names;
    std::vector<double> bounds;
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  Entry& add(const std::string& name, const std::string& help, MetricType type,
             std::vector<std::string> label_names, std::vector<double> bounds);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::map<std::string, Entry*, std::less<>> by_name_;
};

// Text-format helpers, exposed for the tests.
std::string prometheus_escape_label_value(std::string_view v);  // \\, \", \n
std::string prometheus_escape_help(std::string_view v);         // \\, \n
std::string prometheus_format_value(double v);  // shortest round trip; +Inf, -Inf, NaN

}  // namespace troupe
