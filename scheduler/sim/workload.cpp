#include "scheduler/sim/workload.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace troupe::sim {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

// A whole-string number, or nullopt.
std::optional<double> number(const std::string& text) {
  const std::string t = trim(text);
  double v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

double positive_number(const std::string& text, const std::string& what) {
  const auto v = number(text);
  if (!v || *v <= 0)
    throw std::invalid_argument(what + ": '" + text + "' is not a positive number");
  return *v;
}

// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
// days_from_civil), so trace times need no time zone database.
long long days_from_civil(long long y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long long era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + (long long)doe - 719468;
}

void civil_from_days(long long z, int& y, unsigned& m, unsigned& d) {
  z += 719468;
  const long long era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = unsigned(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = int(yoe + era * 400 + (m <= 2));
}

int to_tokens(double v) {
  return int(std::clamp(std::llround(v), 1LL, (long long)1 << 30));
}

}  // namespace

// ---- draws ----

double normal01(Xoshiro256& rng) {
  // Box-Muller; 1 - u keeps the log's argument in (0, 1].
  const double u = 1.0 - rng.uniform01(), v = rng.uniform01();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

double exponential(Xoshiro256& rng, double mean) {
  return -mean * std::log(1.0 - rng.uniform01());
}

// Marsaglia and Tsang (2000); shape < 1 by boosting to shape + 1.
double gamma_draw(Xoshiro256& rng, double shape, double scale) {
  if (shape < 1) {
    const double u = 1.0 - rng.uniform01();
    return gamma_draw(rng, shape + 1, scale) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0, v = 0;
    do {
      x = normal01(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform01();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
  }
}

// ---- lengths ----

LengthDist LengthDist::parse(const std::string& spec) {
  LengthDist d;
  d.spec_ = spec;
  const auto parts = split(spec, ':');
  const std::string what = "length distribution '" + spec + "'";
  const auto need = [&](size_t n, const char* form) {
    if (parts.size() != n) throw std::invalid_argument(what + ": expected " + form);
  };
  if (parts.size() == 1 || parts[0] == "fixed") {
    if (parts.size() > 2) need(2, "fixed:N");
    d.kind_ = Kind::Fixed;
    d.a_ = positive_number(parts.back(), what);
  } else if (parts[0] == "uniform") {
    need(3, "uniform:MIN:MAX");
    d.kind_ = Kind::Uniform;
    d.a_ = positive_number(parts[1], what);
    d.b_ = positive_number(parts[2], what);
    if (d.b_ < d.a_) throw std::invalid_argument(what + ": MAX is below MIN");
  } else if (parts[0] == "exp") {
    need(2, "exp:MEAN");
    d.kind_ = Kind::Exp;
    d.a_ = positive_number(parts[1], what);
  } else if (parts[0] == "lognormal") {
    need(3, "lognormal:MEDIAN:SIGMA");
    d.kind_ = Kind::LogNormal;
    d.a_ = positive_number(parts[1], what);
    d.b_ = positive_number(parts[2], what);
  } else {
    throw std::invalid_argument(what + ": expected N, uniform:MIN:MAX, exp:MEAN or " +
                                "lognormal:MEDIAN:SIGMA");
  }
  return d;
}

int LengthDist::sample(Xoshiro256& rng) const {
  switch (kind_) {
    case Kind::Fixed:
      return to_tokens(a_);
    case Kind::Uniform:
      return to_tokens(a_ + double(rng.below(uint64_t(b_ - a_) + 1)));
    case Kind::Exp:
      return to_tokens(exponential(rng, a_));
    case Kind::LogNormal:
      return to_tokens(a_ * std::exp(b_ * normal01(rng)));
  }
  return 1;
}

double LengthDist::mean() const {
  switch (kind_) {
    case Kind::Fixed:
      return a_;
    case Kind::Uniform:
      return (a_ + b_) / 2;
    case Kind::Exp:
      return a_;
    case Kind::LogNormal:
      return a_ * std::exp(b_ * b_ / 2);
  }
  return a_;
}

// ---- arrival processes ----

ArrivalProcess ArrivalProcess::parse(const std::string& spec, double rate_per_s) {
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s))
    throw std::invalid_argument("the arrival rate must be a positive number");
  ArrivalProcess p;
  p.spec_ = spec;
  p.rate_ = rate_per_s;
  const auto parts = split(spec, ':');
  if (spec == "constant") {
    p.kind_ = Kind::Constant;
  } else if (spec == "poisson") {
    p.kind_ = Kind::Poisson;
  } else if (parts.size() == 2 && parts[0] == "gamma") {
    p.kind_ = Kind::Gamma;
    const double cv = positive_number(parts[1], "arrival process '" + spec + "'");
    p.shape_ = 1.0 / (cv * cv);
  } else {
    throw std::invalid_argument("arrival process '" + spec +
                                "': expected constant, poisson or gamma:CV");
  }
  return p;
}

double ArrivalProcess::next_gap_s(Xoshiro256& rng) const {
  switch (kind_) {
    case Kind::Constant:
      return 1.0 / rate_;
    case Kind::Poisson:
      return exponential(rng, 1.0 / rate_);
    case Kind::Gamma:
      return gamma_draw(rng, shape_, 1.0 / (rate_ * shape_));
  }
  return 1.0 / rate_;
}

// ---- synthetic ----

SyntheticWorkload::SyntheticWorkload(SyntheticOptions options)
    : o_(std::move(options)),
      prompt_(LengthDist::parse(o_.prompt)),
      output_(LengthDist::parse(o_.output)),
      process_(ArrivalProcess::parse(o_.process, o_.rate_per_s)),
      rng_(o_.seed) {
  if (!(o_.cancel_fraction >= 0 && o_.cancel_fraction <= 1))
    throw std::invalid_argument("the cancelled share must be in [0, 1]");
  if (!(o_.cancel_after_s >= 0) || !std::isfinite(o_.cancel_after_s))
    throw std::invalid_argument("the mean time until a cancellation must be seconds >= 0");
  if (!(o_.high_priority_fraction >= 0 && o_.high_priority_fraction <= 1))
    throw std::invalid_argument("the high-priority share must be in [0, 1]");
}

std::optional<Arrival> SyntheticWorkload::next() {
  if (sent_ >= o_.requests) return std::nullopt;
  if (sent_ > 0) t_ += process_.next_gap_s(rng_);
  ++sent_;
  Arrival a;
  a.time_s = t_;
  a.prompt_tokens = prompt_.sample(rng_);
  a.output_tokens = output_.sample(rng_);
  // Always drawn, so that turning cancellation on does not change the rest.
  const double u_cancel = rng_.uniform01(), after = exponential(rng_, o_.cancel_after_s);
  if (u_cancel < o_.cancel_fraction) a.cancel_after_s = after;
  if (rng_.uniform01() < o_.high_priority_fraction) a.priority = 1;
  return a;
}

// ---- shared prefixes ----

SharedPrefixWorkload::SharedPrefixWorkload(std::unique_ptr<Workload> inner, int len, int groups,
                                           uint64_t seed)
    : inner_(std::move(inner)), len_(len), groups_(groups), rng_(seed ^ 0x5bd1e995u) {
  if (len_ < 1) throw std::invalid_argument("a shared prefix needs at least one token");
  if (groups_ < 1) throw std::invalid_argument("shared prefixes need at least one group");
}

std::optional<Arrival> SharedPrefixWorkload::with_prefix(std::optional<Arrival> a) {
  if (!a) return a;
  a->prefix_group = int(rng_.next() % uint64_t(groups_));
  a->prefix_tokens = len_;
  a->prompt_tokens += len_;
  return a;
}

std::optional<Arrival> SharedPrefixWorkload::next() {
  return with_prefix(inner_->next());
}

std::optional<Arrival> SharedPrefixWorkload::on_end(int client, double now_s) {
  return with_prefix(inner_->on_end(client, now_s));
}

// ---- closed loop ----

ClosedLoopWorkload::ClosedLoopWorkload(ClosedLoopOptions options)
    : o_(std::move(options)),
      prompt_(LengthDist::parse(o_.prompt)),
      output_(LengthDist::parse(o_.output)),
      rng_(o_.seed) {
  if (o_.clients < 1) throw std::invalid_argument("a closed loop needs at least one client");
  if (!(o_.think_s >= 0) || !std::isfinite(o_.think_s))
    throw std::invalid_argument("the think time must be seconds >= 0");
}

Arrival ClosedLoopWorkload::make(int client, double at) {
  ++sent_;
  Arrival a;
  a.time_s = at;
  a.client = client;
  a.prompt_tokens = prompt_.sample(rng_);
  a.output_tokens = output_.sample(rng_);
  return a;
}

std::optional<Arrival> ClosedLoopWorkload::next() {
  if (started_ >= o_.clients || sent_ >= o_.requests) return std::nullopt;
  return make(started_++, 0.0);
}

std::optional<Arrival> ClosedLoopWorkload::on_end(int client, double now_s) {
  if (sent_ >= o_.requests) return std::nullopt;
  return make(client, now_s + o_.think_s);
}

// ---- traces ----

double parse_trace_time(const std::string& text) {
  if (const auto v = number(text)) return *v;
  // YYYY-MM-DD HH:MM:SS[.fraction]
  const std::string t = trim(text);
  int y = 0;
  unsigned mo = 0, d = 0, h = 0, mi = 0;
  double s = 0;
  char frac[32] = {0};
  if (std::sscanf(t.c_str(), "%d-%u-%u%*[ T]%u:%u:%lf%31s", &y, &mo, &d, &h, &mi, &s, frac) < 6 ||
      frac[0] != 0 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s < 0 || s >= 61)
    throw std::invalid_argument("'" + text +
                                "' is neither seconds nor a time like 2023-11-16 18:15:46.68");
  return double(days_from_civil(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 + s;
}

TraceFormat trace_format_of(const std::filesystem::path& file) {
  const std::string ext = file.extension().string();
  if (ext == ".csv") return TraceFormat::Azure;
  if (ext == ".jsonl" || ext == ".json") return TraceFormat::Mooncake;
  throw std::invalid_argument(file.string() +
                              ": unknown trace format; expected .csv (Azure: TIMESTAMP,"
                              "ContextTokens,GeneratedTokens) or .jsonl (Mooncake: timestamp, "
                              "input_length, output_length)");
}

TraceWorkload::TraceWorkload(const std::filesystem::path& file, TraceOptions options)
    : file_(file), format_(trace_format_of(file)), o_(options), in_(file) {
  if (!in_) throw std::invalid_argument("cannot read the trace " + file.string());
  if (!(o_.time_scale > 0) || !(o_.length_scale > 0) || !std::isfinite(o_.time_scale) ||
      !std::isfinite(o_.length_scale))
    throw std::invalid_argument("trace time and length scales must be positive");
  if (format_ != TraceFormat::Azure) return;
  std::string header;
  std::getline(in_, header);
  ++line_;
  const auto cols = split(trim(header), ',');
  columns_ = int(cols.size());
  for (int i = 0; i < columns_; ++i) {
    const std::string c = trim(cols[size_t(i)]);
    if (c == "TIMESTAMP") col_time_ = i;
    if (c == "ContextTokens") col_prompt_ = i;
    if (c == "GeneratedTokens") col_output_ = i;
  }
  if (col_time_ < 0 || col_prompt_ < 0 || col_output_ < 0)
    throw std::invalid_argument(file.string() +
                                ": the header must name TIMESTAMP, ContextTokens and "
                                "GeneratedTokens (the Azure LLM inference trace), got '" +
                                trim(header) + "'");
}

std::optional<Arrival> TraceWorkload::read_row() {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (trim(text).empty()) continue;
    const std::string where = file_.string() + ":" + std::to_string(line_);
    double t = 0, prompt = 0, output = 0;
    try {
      if (format_ == TraceFormat::Azure) {
        const auto cells = split(trim(text), ',');
        if (int(cells.size()) != columns_)
          throw std::invalid_argument("expected " + std::to_string(columns_) + " columns");
        t = parse_trace_time(cells[size_t(col_time_)]);
        prompt = positive_number(cells[size_t(col_prompt_)], "ContextTokens");
        const auto out = number(cells[size_t(col_output_)]);
        if (!out || *out < 0) throw std::invalid_argument("GeneratedTokens is not a count");
        output = *out;
      } else {
        const auto j = nlohmann::json::parse(text);
        // The same rules as the Azure columns, naming the field.
        const auto field = [&](const char* name) {
          const auto it = j.find(name);
          if (it == j.end() || !it->is_number())
            throw std::invalid_argument(std::string(name) + " is missing or not a number");
          return it->get<double>();
        };
        t = field("timestamp") / 1000.0;  // Mooncake: milliseconds
        prompt = field("input_length");
        if (!(prompt > 0)) throw std::invalid_argument("input_length is not a positive number");
        output = field("output_length");
        if (!(output >= 0)) throw std::invalid_argument("output_length is not a count");
        if (const auto h = j.find("hash_ids"); h != j.end()) {
          if (!h->is_array()) throw std::invalid_argument("hash_ids is not an array");
          block_ids_.clear();
          for (const auto& id : *h) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0)
              throw std::invalid_argument("hash_ids holds something not an id: " + id.dump());
            block_ids_.push_back(id.get<uint64_t>());
          }
        } else {
          block_ids_.clear();
        }
      }
    } catch (const std::exception& e) {
      throw std::invalid_argument(where + ": " + e.what());
    }
    if (!t0_) t0_ = t;
    const double rel = (t - *t0_) / o_.time_scale;
    if (rel < last_) throw std::invalid_argument(where + ": the trace goes back in time");
    last_ = rel;
    Arrival a;
    a.time_s = rel;
    a.prompt_tokens = to_tokens(prompt * o_.length_scale);
    if (!block_ids_.empty()) {
      a.block_ids = block_ids_;
      a.block_id_tokens = std::max(1, int(std::lround(kMooncakeBlockTokens * o_.length_scale)));
    }
    // A row with no generated tokens still asks for one: a request always
    // produces at least its first token.
    a.output_tokens = to_tokens(output * o_.length_scale);
    ++cuts_.rows;
    cuts_.context = o_.max_context;
    cuts_.asked_prompt += a.prompt_tokens;
    cuts_.asked_output += a.output_tokens;
    if (o_.max_context > 1 && a.prompt_tokens + a.output_tokens > o_.max_context) {
      ++cuts_.cut;
      a.prompt_tokens = std::min(a.prompt_tokens, o_.max_context - 1);
      a.output_tokens = std::max(1, std::min(a.output_tokens, o_.max_context - a.prompt_tokens));
    }
    cuts_.kept_prompt += a.prompt_tokens;
    cuts_.kept_output += a.output_tokens;
    return a;
  }
  return std::nullopt;
}

std::optional<Arrival> TraceWorkload::next() {
  if (o_.limit > 0 && rows_ >= o_.limit) return std::nullopt;
  auto a = read_row();
  if (a) ++rows_;
  return a;
}

double TraceCuts::scale_to_fit() const {
  const double mean = rows > 0 ? (asked_prompt + asked_output) / double(rows) : 0;
  return cut > 0 && mean > 0 ? std::min(1.0, context / mean) : 0;
}

TraceStats trace_stats(const std::filesystem::path& file, size_t limit) {
  TraceOptions o;
  o.limit = limit;
  TraceWorkload w(file, o);
  TraceStats s;
  double prompt = 0, output = 0;
  while (const auto a = w.next()) {
    ++s.rows;
    s.span_s = a->time_s;
    prompt += a->prompt_tokens;
    output += a->output_tokens;
  }
  if (s.rows > 0) {
    s.mean_prompt = prompt / double(s.rows);
    s.mean_output = output / double(s.rows);
  }
  return s;
}

void write_trace(Workload& w, size_t count, const std::filesystem::path& file) {
  const TraceFormat format = trace_format_of(file);
  std::ofstream out(file);
  if (!out) throw std::invalid_argument("cannot write the trace " + file.string());
  // Azure's timestamps are wall-clock times; start the sample at midnight.
  const double epoch = double(days_from_civil(2024, 5, 1)) * 86400.0;
  if (format == TraceFormat::Azure) out << "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  char line[160];
  for (size_t i = 0; i < count; ++i) {
    const auto a = w.next();
    if (!a) break;
    if (format == TraceFormat::Azure) {
      const double t = epoch + a->time_s;
      const long long whole = (long long)std::floor(t);
      const long long day = whole / 86400, sec = whole % 86400;
      int y = 0;
      unsigned mo = 0, d = 0;
      civil_from_days(day, y, mo, d);
      const long long frac = std::llround((t - double(whole)) * 1e7);
      std::snprintf(line, sizeof line, "%04d-%02u-%02u %02lld:%02lld:%02lld.%07lld,%d,%d\n", y, mo,
                    d, sec / 3600, sec / 60 % 60, sec % 60, std::min(frac, 9999999LL),
                    a->prompt_tokens, a->output_tokens);
    } else {
      std::snprintf(line, sizeof line,
                    "{\"timestamp\": %lld, \"input_length\": %d, \"output_length\": %d}\n",
                    std::llround(a->time_s * 1000.0), a->prompt_tokens, a->output_tokens);
    }
    out << line;
  }
  if (!out) throw std::runtime_error("cannot write the trace " + file.string());
}

}  // namespace troupe::sim
