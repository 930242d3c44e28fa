#include "metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace troupe {

namespace {

bool valid_metric_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool valid_label_name(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  return valid_metric_name(n) && n.find(':') == std::string_view::npos;
}

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::Counter:
      return "counter";
    case MetricType::Gauge:
      return "gauge";
    case MetricType::Histogram:
      return "histogram";
  }
  return "untyped";
}

// `{a="x",b="y"}` (empty when there are no labels); `extra` is appended
// last, as Prometheus expects `le` after the family's own labels.
std::string label_block(const std::vector<std::string>& names,
                        const std::vector<std::string>& values, std::string_view extra = {}) {
  if (names.empty() && extra.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i];
    out += "=\"";
    out += prometheus_escape_label_value(values[i]);
    out += '"';
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

void check_bounds(const std::vector<double>& b) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i])) throw std::invalid_argument("histogram bucket bounds must be finite");
    if (i > 0 && !(b[i] > b[i - 1]))
      throw std::invalid_argument("histogram bucket bounds must be strictly increasing");
  }
}

}  // namespace

namespace {
// Prometheus escapes backslash and newline everywhere, and the double quote
// only inside label values.
std::string prometheus_escape(std::string_view v, bool quotes) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quotes)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}
}  // namespace

std::string prometheus_escape_label_value(std::string_view v) {
  return prometheus_escape(v, true);
}

std::string prometheus_escape_help(std::string_view v) {
  return prometheus_escape(v, false);
}

std::string prometheus_format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void Counter::inc(double amount) {
  if (!(amount >= 0)) throw std::invalid_argument("a counter can only increase");
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  check_bounds(bounds_);
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  // "le" is inclusive: the first bound >= v.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1)
    throw std::invalid_argument("exponential_buckets needs start > 0, factor > 1, count >= 1");
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

template <class T>
Family<T>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {}

template <class T>
T& Family<T>::labels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size())
    throw std::invalid_argument("metric " + name_ + " takes " +
                                std::to_string(label_names_.size()) + " label values, got " +
                                std::to_string(values.size()));
  std::lock_guard lock(mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(bounds_);
  } else {
    child = std::make_unique<T>();
  }
  T& ref = *child;
  children_.emplace(values, std::move(child));
  return ref;
}

template <class T>
T& Family<T>::labels(std::initializer_list<std::string_view> values) {
  return labels(std::vector<std::string>(values.begin(), values.end()));
}

template <class T>
void Family<T>::remove(const std::vector<std::string>& values) {
  std::lock_guard lock(mu_);
  children_.erase(values);
}

template <class T>
std::string Family<T>::render() const {
  std::string out = "# HELP " + name_ + " " + prometheus_escape_help(help_) + "\n";
  out += "# TYPE " + name_ + " " + type_name(type_) + "\n";
  std::lock_guard lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      Histogram::Snapshot s = child->snapshot();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        std::string le =
            "le=\"" +
            (i < s.bounds.size() ? prometheus_format_value(s.bounds[i]) : std::string("+Inf")) +
            "\"";
        out += name_ + "_bucket" + label_block(label_names_, values, le) + " " +
               std::to_string(s.cumulative[i]) + "\n";
      }
      std::string lb = label_block(label_names_, values);
      out += name_ + "_sum" + lb + " " + prometheus_format_value(s.sum) + "\n";
      out += name_ + "_count" + lb + " " + std::to_string(s.count) + "\n";
    } else {
      out += name_ + label_block(label_names_, values) + " " +
             prometheus_format_value(child->value()) + "\n";
    }
  }
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

MetricsRegistry::Entry& MetricsRegistry::add(const std::string& name, const std::string& help,
                                             MetricType type, std::vector<std::string> label_names,
                                             std::vector<double> bounds) {
  if (!valid_metric_name(name)) throw std::invalid_argument("invalid metric name '" + name + "'");
  for (const auto& l : label_names) {
    if (!valid_label_name(l) || (type == MetricType::Histogram && l == "le"))
      throw std::invalid_argument("metric " + name + ": invalid label name '" + l + "'");
  }
  if (type == MetricType::Histogram) check_bounds(bounds);

  std::lock_guard lock(mu_);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    Entry& e = *it->second;
    if (e.type != type || e.label_names != label_names || e.bounds != bounds)
      throw std::invalid_argument("metric " + name +
                                  " is already registered with another type, labels or buckets");
    return e;
  }
  auto e = std::make_unique<Entry>();
  e->type = type;
  e->label_names = label_names;
  e->bounds = bounds;
  switch (type) {
    case MetricType::Counter:
      e->counter.reset(new Family<Counter>(name, help, type, std::move(label_names), {}));
      if (e->label_names.empty()) e->counter->labels(std::vector<std::string>{});
      break;
    case MetricType::Gauge:
      e->gauge.reset(new Family<Gauge>(name, help, type, std::move(label_names), {}));
      if (e->label_names.empty()) e->gauge->labels(std::vector<std::string>{});
      break;
    case MetricType::Histogram:
      e->histogram.reset(
          new Family<Histogram>(name, help, type, std::move(label_names), std::move(bounds)));
      if (e->label_names.empty()) e->histogram->labels(std::vector<std::string>{});
      break;
  }
  Entry& ref = *e;
  by_name_.emplace(name, &ref);
  entries_.push_back(std::move(e));
  return ref;
}

Family<Counter>& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names) {
  return *add(name, help, MetricType::Counter, std::move(label_names), {}).counter;
}

Family<Gauge>& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  return *add(name, help, MetricType::Gauge, std::move(label_names), {}).gauge;
}

Family<Histogram>& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                              std::vector<double> bounds,
                                              std::vector<std::string> label_names) {
  return *add(name, help, MetricType::Histogram, std::move(label_names), std::move(bounds))
              .histogram;
}

std::string MetricsRegistry::render() const {
  std::vector<const Entry*> entries;
  {
    std::lock_guard lock(mu_);
    for (const auto& e : entries_) entries.push_back(e.get());
  }
  // Entries are never removed, so rendering outside the registry lock is safe
  // and keeps a slow scrape from blocking registrations.
  std::string out;
  for (const Entry* e : entries) {
    switch (e->type) {
      case MetricType::Counter:
        out += e->counter->render();
        break;
      case MetricType::Gauge:
        out += e->gauge->render();
        break;
      case MetricType::Histogram:
        out += e->histogram->render();
        break;
    }
  }
  return out;
}

}  // namespace troupe
