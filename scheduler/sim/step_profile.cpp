#include "scheduler/sim/step_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace troupe::sim {

namespace {

constexpr const char* kFormat = "troupe-step-profile/1";

void check_axis(const std::vector<int>& axis, const std::string& name, const std::string& where) {
  if (axis.empty()) throw std::invalid_argument(where + ": " + name + " has no points");
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] < 0) throw std::invalid_argument(where + ": " + name + " has a negative point");
    if (i > 0 && axis[i] <= axis[i - 1])
      throw std::invalid_argument(where + ": " + name + " must be strictly ascending");
  }
}

// The segment of `axis` to interpolate x in, and x's weight toward its upper
// end (outside the axis the weight leaves [0, 1]: linear continuation).
struct Segment {
  size_t lo = 0, hi = 0;
  double w = 0;
};

Segment segment(const std::vector<int>& axis, double x) {
  if (axis.size() == 1) return {0, 0, 0};
  size_t hi = size_t(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  hi = std::clamp<size_t>(hi, 1, axis.size() - 1);
  const size_t lo = hi - 1;
  return {lo, hi, (x - axis[lo]) / double(axis[hi] - axis[lo])};
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw std::invalid_argument(where + ": missing \"" + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(where + ": \"" + key + "\" has the wrong type (" + e.what() + ")");
  }
}

}  // namespace

std::string ProfileGrid::describe() const {
  return std::to_string(pipeline) + "x" + std::to_string(tensor) + " (pipeline x tensor), " +
         std::to_string(threads) + " thread(s) per device";
}

void ProfileGrid::validate() const {
  const std::string where = "profile layout " + describe();
  if (pipeline < 1 || tensor < 1 || threads < 1 || block_tokens < 1)
    throw std::invalid_argument(where +
                                ": pipeline, tensor, threads and block_tokens must be >= 1");
  check_axis(batch, "batch", where);
  check_axis(context, "context", where);
  check_axis(prefill, "prefill", where);
  if (stages() != pipeline)
    throw std::invalid_argument(where + ": stage_seconds has " + std::to_string(stages()) +
                                " stages, expected " + std::to_string(pipeline));
  if (!(overhead_s >= 0) || !(overhead_per_seq_s >= 0) || !(request_overhead_s >= 0))
    throw std::invalid_argument(where + ": the serving overhead must be >= 0");
  for (const auto& s : stage_seconds) {
    if (s.size() != points())
      throw std::invalid_argument(where + ": stage_seconds has " + std::to_string(s.size()) +
                                  " points, the grid " + std::to_string(points()));
    for (double v : s)
      if (!std::isfinite(v) || v < 0)
        throw std::invalid_argument(where + ": a step time is negative or not finite");
  }
}

nlohmann::json StepProfile::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["model"] = {{"name", model.name},
                {"max_seq_len", model.max_seq_len},
                {"vocab_size", model.vocab_size},
                {"kv_bytes_per_token", model.kv_bytes_per_token},
                {"bos", model.bos},
                {"eos", model.eos}};
  j["dtype"] = dtype;
  j["kv_dtype"] = kv_dtype;
  j["isa"] = isa;
  j["cpu"] = cpu;
  j["layouts"] = nlohmann::json::array();
  for (const ProfileGrid& g : layouts)
    j["layouts"].push_back({{"pipeline", g.pipeline},
                            {"tensor", g.tensor},
                            {"threads", g.threads},
                            {"block_tokens", g.block_tokens},
                            {"batch", g.batch},
                            {"context", g.context},
                            {"prefill", g.prefill},
                            {"stage_seconds", g.stage_seconds},
                            {"overhead_s", g.overhead_s},
                            {"overhead_per_seq_s", g.overhead_per_seq_s},
                            {"request_overhead_s", g.request_overhead_s}});
  return j;
}

StepProfile StepProfile::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw std::invalid_argument(source + ": a step profile is a JSON object");
  const auto format = field<std::string>(j, "format", source);
  if (format != kFormat)
    throw std::invalid_argument(source + ": format is '" + format + "', expected '" + kFormat +
                                "' (make one with troupe bench --profile)");
  StepProfile p;
  const auto& m = j.at("model");
  const std::string mw = source + ": model";
  p.model.name = field<std::string>(m, "name", mw);
  p.model.max_seq_len = field<int>(m, "max_seq_len", mw);
  p.model.vocab_size = field<int>(m, "vocab_size", mw);
  p.model.kv_bytes_per_token = field<long long>(m, "kv_bytes_per_token", mw);
  p.model.bos = field<int>(m, "bos", mw);
  p.model.eos = field<std::vector<int>>(m, "eos", mw);
  if (p.model.max_seq_len < 1) throw std::invalid_argument(mw + ": max_seq_len must be >= 1");
  p.dtype = j.value("dtype", "");
  p.kv_dtype = j.value("kv_dtype", "f32");
  p.isa = j.value("isa", "");
  p.cpu = j.value("cpu", "");
  for (const auto& l : field<nlohmann::json>(j, "layouts", source)) {
    ProfileGrid g;
    const std::string lw = source + ": layouts[" + std::to_string(p.layouts.size()) + "]";
    g.pipeline = field<int>(l, "pipeline", lw);
    g.tensor = field<int>(l, "tensor", lw);
    g.threads = field<int>(l, "threads", lw);
    g.block_tokens = field<int>(l, "block_tokens", lw);
    g.batch = field<std::vector<int>>(l, "batch", lw);
    g.context = field<std::vector<int>>(l, "context", lw);
    g.prefill = field<std::vector<int>>(l, "prefill", lw);
    g.stage_seconds = field<std::vector<std::vector<double>>>(l, "stage_seconds", lw);
    g.overhead_s = l.value("overhead_s", 0.0);
    g.overhead_per_seq_s = l.value("overhead_per_seq_s", 0.0);
    g.request_overhead_s = l.value("request_overhead_s", 0.0);
    g.validate();
    p.layouts.push_back(std::move(g));
  }
  if (p.layouts.empty()) throw std::invalid_argument(source + ": the profile has no layouts");
  return p;
}

StepProfile StepProfile::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::invalid_argument("cannot read the step profile " + file.string());
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(file.string() + ": not JSON (" + e.what() + ")");
  }
  return from_json(j, file.string());
}

void StepProfile::save(const std::filesystem::path& file) const {
  std::ofstream out(file);
  out << to_json().dump(1) << "\n";
  if (!out) throw std::runtime_error("cannot write the step profile " + file.string());
}

const ProfileGrid& StepProfile::find(int pipeline, int tensor, int threads) const {
  const ProfileGrid* best = nullptr;
  for (const ProfileGrid& g : layouts) {
    if (g.pipeline != pipeline || g.tensor != tensor) continue;
    if (best == nullptr || std::abs(g.threads - threads) < std::abs(best->threads - threads))
      best = &g;
  }
  if (best != nullptr) return *best;
  std::string have;
  for (const ProfileGrid& g : layouts) have += (have.empty() ? "" : "; ") + g.describe();
  throw std::invalid_argument("the step profile of " + model.name + " has no layout " +
                              std::to_string(pipeline) + "x" + std::to_string(tensor) +
                              " (pipeline x tensor); it has: " + have +
                              ". Measure it with troupe bench --profile --pipeline " +
                              std::to_string(pipeline) + " --tensor " + std::to_string(tensor));
}

void StepProfile::put(ProfileGrid grid) {
  grid.validate();
  for (ProfileGrid& g : layouts)
    if (g.pipeline == grid.pipeline && g.tensor == grid.tensor && g.threads == grid.threads) {
      g = std::move(grid);
      return;
    }
  layouts.push_back(std::move(grid));
}

StepCostModel::StepCostModel(ProfileGrid grid) : grid_(std::move(grid)) {
  grid_.validate();
}

double StepCostModel::stage_s(int stage, const StepShape& shape) const {
  const std::vector<double>& t = grid_.stage_seconds.at(size_t(stage));
  // Context stays within what was measured: attention beyond the longest
  // measured context is not a straight line worth trusting.
  const double ctx =
      std::clamp(shape.context, double(grid_.context.front()), double(grid_.context.back()));
  const Segment b = segment(grid_.batch, shape.decode);
  const Segment c = segment(grid_.context, ctx);
  const Segment p = segment(grid_.prefill, shape.prefill);
  double sum = 0;
  for (int ib = 0; ib < 2; ++ib)
    for (int ic = 0; ic < 2; ++ic)
      for (int ip = 0; ip < 2; ++ip) {
        const double w = (ib ? b.w : 1 - b.w) * (ic ? c.w : 1 - c.w) * (ip ? p.w : 1 - p.w);
        if (w == 0) continue;
        sum += w * t[grid_.at(ib ? b.hi : b.lo, ic ? c.hi : c.lo, ip ? p.hi : p.lo)];
      }
  return std::max(0.0, sum);
}

double StepCostModel::step_s(const StepShape& shape) const {
  double s = 0;
  for (int i = 0; i < stages(); ++i) s += stage_s(i, shape);
  return s;
}

}  // namespace troupe::sim
