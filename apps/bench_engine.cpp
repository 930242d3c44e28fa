#include "apps/bench_engine.h"

#include <immintrin.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "gpu/cpu/gemm.h"
#include "gpu/kv_cache.h"

namespace troupe::app {

namespace {

// The largest cache level's size for CPU 0, as the kernel tells it (0:
// unknown). Not sysconf: glibc's figure from CPUID is the whole package's
// (320 MiB on a 2-core guest whose CPUs share 32 MiB).
size_t last_level_cache_bytes() {
  int best_level = 0;
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || level < best_level) continue;
    size_t bytes = 0;
    try {
      bytes = std::stoull(size);
    } catch (const std::exception&) {
      continue;
    }
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    best_level = level;
    best = bytes;
  }
  return best;
}

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : bytes(n), p(static_cast<float*>(std::aligned_alloc(64, n))) {
    if (!p) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(p); }
  size_t bytes;
  float* p;
};

// Prompt ids that avoid BOS/EOS and stay in the vocabulary.
std::vector<int> synthetic_ids(int n, int vocab, int salt) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = 3 + (i * 7919 + salt * 104729) % (vocab - 3);
  return ids;
}

// Set-up steps hold at most this many tokens (engines that size buffers by
// their largest step are built for it).
constexpr int kFillStepTokens = 2048;

// Grows every item's sequence from its position to `context` tokens with
// synthetic prompt chunks, several sequences a step (untimed set-up).
void fill_contexts(StepEngine& engine, std::vector<StepItem>& items, int context, int vocab) {
  const int chunk = 512;
  for (bool more = true; more;) {
    more = false;
    std::vector<StepItem> step;
    int tokens = 0;
    for (size_t i = 0; i <= items.size(); ++i) {
      const bool last = i == items.size();
      const int n = last ? 0 : std::min(chunk, context - items[i].position);
      if (!step.empty() && (last || tokens + n > kFillStepTokens)) {
        engine.step(step);
        step.clear();
        tokens = 0;
      }
      if (n <= 0) continue;
      StepItem grow = items[i];
      grow.tokens = synthetic_ids(n, vocab, int(i) + items[i].position);
      step.push_back(std::move(grow));
      tokens += n;
      items[i].position += n;
      more = more || items[i].position < context;
    }
  }
}

}  // namespace

size_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;
}

void measure_bandwidth(int threads, size_t bytes, double& copy_gbs, double& read_gbs) {
  AlignedBuffer src(bytes), dst(bytes);
  std::memset(src.p, 1, bytes);
  std::memset(dst.p, 0, bytes);
  ThreadPool pool(threads);
  const size_t n = bytes / sizeof(float);
  const int chunks = threads * 8;
  const size_t per = (n / size_t(chunks)) / 8 * 8;
  copy_gbs = read_gbs = 0;
  std::vector<double> sink(size_t(threads), 0);
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = Clock::now();
    pool.parallel_for(chunks, [&](int c, int) {
      const float* s = src.p + size_t(c) * per;
      float* d = dst.p + size_t(c) * per;
      for (size_t i = 0; i < per; i += 8) _mm256_stream_ps(d + i, _mm256_load_ps(s + i));
      _mm_sfence();
    });
    auto t1 = Clock::now();
    copy_gbs =
        std::max(copy_gbs, 2.0 * double(per) * chunks * sizeof(float) / seconds(t0, t1) / 1e9);
    t0 = Clock::now();
    pool.parallel_for(chunks, [&](int c, int thread) {
      const float* s = src.p + size_t(c) * per;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (size_t i = 0; i < per; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(s + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(s + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(s + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(s + i + 24));
      }
      alignas(32) float out[8];
      _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      sink[size_t(thread)] += out[0];
    });
    t1 = Clock::now();
    read_gbs = std::max(read_gbs, double(per) * chunks * sizeof(float) / seconds(t0, t1) / 1e9);
  }
  if (sink[0] == 12345.0) std::abort();  // keeps the reads alive
}

namespace {

// Decode steps of G groups of sequences kept in flight together: a group's
// next step is launched as soon as its last one is sampled, while the other
// groups' steps are still in the pipeline (how a pipeline keeps every stage
// busy at decode, where each step needs the previous step's tokens).
void decode_in_groups(StepEngine& engine, const std::vector<StepItem>& items, int G, int steps) {
  std::vector<std::vector<StepItem>> group(static_cast<size_t>(G));
  for (size_t i = 0; i < items.size(); ++i) group[i % size_t(G)].push_back(items[i]);
  std::deque<std::pair<int, uint64_t>> flight;  // (group, ticket), oldest first
  std::vector<int> done(static_cast<size_t>(G), 0);
  for (int g = 0; g < G; ++g) flight.emplace_back(g, engine.launch(group[size_t(g)]));
  while (!flight.empty()) {
    const auto [g, ticket] = flight.front();
    flight.pop_front();
    const auto ids = engine.finish(ticket);
    auto& members = group[size_t(g)];
    for (size_t i = 0; i < members.size(); ++i) {
      members[i].position += int(members[i].tokens.size());
      members[i].tokens = {ids[i]};
    }
    if (++done[size_t(g)] < steps) flight.emplace_back(g, engine.launch(members));
  }
}

}  // namespace

EngineBenchResult run_engine_bench(std::shared_ptr<const Checkpoint> ckpt, DType dtype,
                                   const std::string& model_name, const EngineBenchOptions& o) {
  const ModelConfig& c = ckpt->config;
  EngineBenchResult r;
  r.model = model_name;
  r.dtype = dtype_name(dtype);
  r.products = quant_products_name(ckpt->quant_products);
  r.isa = isa_name(active_isa());
  r.threads = o.engine.threads_of(0);
  r.pipeline = o.engine.pipeline;
  r.tensor = o.engine.tensor;
  r.prompt_len = std::min(o.prompt_len, c.max_seq_len);

  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  // Decode repeats keep growing the same contexts.
  // The context gives way to the decode steps within the model's length.
  const int steps = std::clamp(o.decode_tokens, 1, c.max_seq_len - 1);
  r.context = std::clamp(o.context, 1, c.max_seq_len - steps);
  const int reps = std::clamp(o.repeats, 1, std::max(1, (c.max_seq_len - r.context) / steps));
  const int ctx_per_seq = std::min(c.max_seq_len, std::max(r.prompt_len, r.context + steps * reps));
  EngineSpec spec = o.engine;
  // Each sequence slot owns a fixed range of blocks (the bench is its own
  // scheduler): slot b holds blocks [b * per_seq, (b + 1) * per_seq).
  const int per_seq = (ctx_per_seq + spec.block_tokens - 1) / spec.block_tokens;
  spec.blocks = std::max(1, max_batch) * per_seq;
  // The bench's steps (a whole prompt, every sequence's first 16 tokens)
  // must fit an engine that sizes its buffers by the largest step (CUDA).
  spec.max_batch_sequences = std::max(spec.max_batch_sequences, max_batch);
  spec.max_batch_tokens = std::max({spec.max_batch_tokens, r.prompt_len, kFillStepTokens});
  r.groups = spec.pipeline > 1 ? (o.groups > 0 ? o.groups : spec.pipeline) : 1;
  spec.microbatches = o.microbatches > 0 ? o.microbatches : (r.groups > 1 ? 1 : 0);
  if (spec.pipeline > 1) r.microbatches = spec.microbatches;
  auto builder = std::make_shared<EngineBuilder>(ckpt, dtype);
  spec = builder->resolve(spec);
  r.device = device_kind_name(spec.kind);
  if (spec.kind == DeviceKind::Cpu) {
    int all_threads = 0;
    for (int d = 0; d < spec.devices(); ++d) all_threads += spec.threads_of(d);
    // Arrays well past the last-level cache, so the copy measures DRAM.
    measure_bandwidth(all_threads, size_t(512) << 20, r.bandwidth_gbs, r.read_bandwidth_gbs);
  }
  r.stage_layers = spec.stage_layers;
  if (const LayerProfile* p = builder->profile()) r.layer_cost_s = p->seconds;
  const std::unique_ptr<StepEngine> engine = builder->build(spec);
  {
    const EngineStats st = engine->stats();
    r.weight_bytes_per_device = st.weight_bytes;
    // Weights streamed per step: every device's share, embeddings aside.
    for (size_t b : st.streamed_bytes) r.weight_bytes_per_step += b;
  }
  // The host's bandwidth bounds CPU devices only (bench_cuda has the GPU's).
  if (r.bandwidth_gbs > 0) {
    r.bound_steps_per_s = r.bandwidth_gbs * 1e9 / double(r.weight_bytes_per_step);
    r.last_level_cache_bytes = last_level_cache_bytes();
  }
  // A CUDA engine keeps its cache in the weights' type.
  const DType kv = spec.kind == DeviceKind::Cuda ? dtype : spec.kv_dtype;
  r.kv_dtype = dtype_name(kv);
  r.kv_bytes_per_token = c.kv_bytes_per_token(kv);
  const bool layout = spec.devices() > 1;
  uint64_t next_seq = 1;
  auto item = [&](uint64_t seq, int slot, std::vector<int> tokens) {
    StepItem it;
    it.seq = seq;
    it.tokens = std::move(tokens);
    it.blocks = contiguous_blocks(slot * per_seq, per_seq);
    it.sample = true;
    it.sampling.temperature = 0;
    return it;
  };

  // Prefill: the whole prompt in one step; best of the repeats.
  {
    const auto prompt = synthetic_ids(r.prompt_len, c.vocab_size, 1);
    double best = 1e30;
    for (int rep = 0; rep < o.repeats; ++rep) {
      const uint64_t seq = next_seq++;
      const auto t0 = Clock::now();
      engine->step({item(seq, 0, prompt)});
      best = std::min(best, seconds(t0, Clock::now()));
      engine->release(seq);
    }
    r.prefill_tokens_per_s = double(r.prompt_len) / best;
  }

  // Decode: B sequences with `context` tokens each, then decode_tokens steps.
  for (int batch : o.batches) {
    std::vector<StepItem> items;
    for (int b = 0; b < batch; ++b) items.push_back(item(next_seq + uint64_t(b), b, {}));
    fill_contexts(*engine, items, r.context, c.vocab_size);
    const EngineStats before = engine->stats();
    double best = 1e30;
    const int G = std::min(batch, r.groups);
    for (int rep = 0; rep < reps; ++rep) {
      const auto t0 = Clock::now();
      if (G > 1) {
        for (int b = 0; b < batch; ++b) items[size_t(b)].tokens = {3 + b % (c.vocab_size - 3)};
        decode_in_groups(*engine, items, G, steps);
      } else {
        for (int st = 0; st < steps; ++st) {
          for (int b = 0; b < batch; ++b)
            items[size_t(b)].tokens = {3 + (st * 31 + b) % (c.vocab_size - 3)};
          engine->step(items);
          for (auto& it : items) ++it.position;
        }
      }
      if (G > 1)
        for (auto& it : items) it.position += steps;
      best = std::min(best, seconds(t0, Clock::now()));
    }
    for (int b = 0; b < batch; ++b) engine->release(next_seq + uint64_t(b));
    next_seq += uint64_t(batch);
    DecodePoint p;
    p.batch = batch;
    p.tokens_per_s = double(batch) * steps / best;
    p.bound_fraction = r.bound_steps_per_s > 0 ? (double(steps) / best) / r.bound_steps_per_s : 0;
    if (layout) {
      // Bubble and communication share over this batch size's decode steps.
      const EngineStats d = engine->stats().since(before);
      for (size_t s = 0; s < d.stages.size(); ++s)
        p.bubble_fraction.push_back(d.bubble_fraction(int(s)));
      p.comm_share = d.comm_share();
      p.comm_bytes = d.comm_bytes();
    }
    r.decode.push_back(p);
  }
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

nlohmann::json EngineBenchResult::to_json() const {
  nlohmann::json j;
  j["mode"] = "engine";
  j["model"] = model;
  j["dtype"] = dtype;
  j["quantized_products"] = products;
  j["kv_dtype"] = kv_dtype;
  j["device"] = device;
  j["isa"] = isa;
  j["threads"] = threads;
  j["bandwidth_gbs"] = bandwidth_gbs;
  j["read_bandwidth_gbs"] = read_bandwidth_gbs;
  j["weight_bytes_per_step"] = weight_bytes_per_step;
  j["bound_steps_per_s"] = bound_steps_per_s;
  j["last_level_cache_bytes"] = last_level_cache_bytes;
  j["prompt_len"] = prompt_len;
  j["context"] = context;
  j["prefill_tokens_per_s"] = prefill_tokens_per_s;
  j["decode"] = nlohmann::json::array();
  for (const auto& d : decode) {
    nlohmann::json p = {
        {"batch", d.batch}, {"tokens_per_s", d.tokens_per_s}, {"bound_fraction", d.bound_fraction}};
    if (pipeline * tensor > 1) {
      p["bubble_fraction"] = d.bubble_fraction;
      p["comm_share"] = d.comm_share;
      p["comm_bytes"] = d.comm_bytes;
    }
    j["decode"].push_back(p);
  }
  j["layout"] = {{"replicas", 1}, {"pipeline", pipeline}, {"tensor", tensor}};
  if (pipeline > 1) {
    j["groups"] = groups;
    j["microbatches"] = microbatches;
  }
  j["weight_bytes_per_device"] = weight_bytes_per_device;
  if (!stage_layers.empty()) {
    j["stage_layers"] = stage_layers;
    j["layer_cost_s"] = layer_cost_s;
  }
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["peak_rss_bytes"] = peak_rss_bytes;
  return j;
}

// Said only where it changes what runs.
std::string EngineBenchResult::products_note() const {
  return products == "exact" ? "" : " (" + products + " products for quantized ones)";
}

std::string EngineBenchResult::table() const {
  std::ostringstream s;
  char line[256];
  const bool bounded = bound_steps_per_s > 0;
  if (bounded) {
    s << "model " << model << ", " << dtype << " weights" << products_note() << ", " << kv_dtype
      << " KV cache, " << threads << " threads, " << isa << " kernels\n";
    std::snprintf(line, sizeof line,
                  "memory bandwidth: copy %.1f GB/s, read %.1f GB/s; weights per step %.1f MB -> "
                  "bound %.1f steps/s\n",
                  bandwidth_gbs, read_bandwidth_gbs, double(weight_bytes_per_step) / 1e6,
                  bound_steps_per_s);
    s << line;
    if (last_level_cache_bytes > 0 && weight_bytes_per_step <= last_level_cache_bytes)
      std::snprintf(line, sizeof line,
                    "(the weights fit in the %zu MiB last-level cache: decode can run past the "
                    "memory bound)\n",
                    last_level_cache_bytes >> 20);
    else
      line[0] = '\0';
  } else {
    s << "model " << model << ", " << dtype << " weights" << products_note() << ", " << kv_dtype
      << " KV cache, on " << device << "\n";
    std::snprintf(line, sizeof line,
                  "weights per step %.1f MB (no host bandwidth bound: bench_cuda has the GPU's)\n",
                  double(weight_bytes_per_step) / 1e6);
  }
  s << line;
  std::snprintf(line, sizeof line, "prefill (%d tokens): %.1f tokens/s\n", prompt_len,
                prefill_tokens_per_s);
  s << line;
  if (pipeline * tensor > 1) {
    std::snprintf(line, sizeof line,
                  "layout: %d stage(s) x %d shard(s); weights per device:", pipeline, tensor);
    s << line;
    for (size_t b : weight_bytes_per_device) s << " " << (b >> 20) << " MiB";
    if (!stage_layers.empty()) {
      s << "; layers per stage:";
      for (const auto& [b, e] : stage_layers) s << " [" << b << ", " << e << ")";
    }
    s << "\n";
    if (pipeline > 1) {
      // 0 micro-batches: one per stage for whole-batch steps, one per step
      // when several groups are in flight (--microbatches' help).
      const std::string per_step = microbatches > 0 ? std::to_string(microbatches)
                                   : groups > 1     ? "1"
                                                    : std::to_string(pipeline) + " (one per stage)";
      std::snprintf(line, sizeof line,
                    "pipelining: %d sequence group(s) in flight, %s micro-batch(es) per step\n",
                    groups, per_step.c_str());
      s << line;
    }
  }
  s << "decode from a context of " << context << " tokens:\n";
  s << "  batch | decode tokens/s | of bandwidth bound";
  if (pipeline * tensor > 1) s << " | comm share | bubble per stage";
  s << "\n";
  for (const auto& d : decode) {
    if (bounded)
      std::snprintf(line, sizeof line, "  %5d | %15.1f | %17.0f%%", d.batch, d.tokens_per_s,
                    100.0 * d.bound_fraction);
    else
      std::snprintf(line, sizeof line, "  %5d | %15.1f | %18s", d.batch, d.tokens_per_s, "-");
    s << line;
    if (pipeline * tensor > 1) {
      std::snprintf(line, sizeof line, " | %9.0f%% |", 100.0 * d.comm_share);
      s << line;
      for (double b : d.bubble_fraction) {
        std::snprintf(line, sizeof line, " %.0f%%", 100.0 * b);
        s << line;
      }
    }
    s << "\n";
  }
  std::snprintf(line, sizeof line, "KV cache: %zu bytes/token; peak RSS %.1f MiB\n",
                kv_bytes_per_token, double(peak_rss_bytes) / (1 << 20));
  s << line;
  return s.str();
}

}  // namespace troupe::app

namespace troupe::app {

namespace {

std::vector<int> default_contexts(int max_seq_len) {
  std::vector<int> c{16, max_seq_len / 8, max_seq_len / 2, max_seq_len - 1};
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  c.erase(std::remove_if(c.begin(), c.end(), [](int v) { return v < 1; }), c.end());
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

sim::ProfileModel profile_model(const ModelConfig& c, const std::string& name, DType kv_dtype) {
  return {name,     c.max_seq_len, c.vocab_size, (long long)c.kv_bytes_per_token(kv_dtype),
          c.bos_id, c.eos_ids};
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? ""
                                        : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

constexpr double kProfileSecondsPerPoint = 0.02;

sim::ProfileGrid measure_step_profile(std::shared_ptr<const Checkpoint> ckpt, DType dtype,
                                      const StepProfileOptions& o) {
  const ModelConfig& c = ckpt->config;
  sim::ProfileGrid g;
  g.batch = o.batch;
  g.context = o.context.empty() ? default_contexts(c.max_seq_len) : o.context;
  g.prefill = o.prefill;
  for (auto* axis : {&g.batch, &g.context, &g.prefill}) std::sort(axis->begin(), axis->end());
  if (g.context.back() >= c.max_seq_len)
    throw std::invalid_argument("--grid-context: a decode at context " +
                                std::to_string(g.context.back()) + " needs " +
                                std::to_string(g.context.back() + 1) +
                                " positions; the model has " + std::to_string(c.max_seq_len));
  // A prefill longer than the context runs as several sequences' chunks.
  const int chunk = std::min(c.max_seq_len, 512);
  const int max_b = g.batch.back(), max_p = g.prefill.back();
  const int prefill_slots = (max_p + chunk - 1) / chunk;
  EngineSpec spec = o.engine;
  const int per_slot =
      (std::max(g.context.back() + 1, chunk) + spec.block_tokens - 1) / spec.block_tokens;
  spec.blocks = std::max(1, max_b + prefill_slots) * per_slot;
  spec.microbatches = 1;  // whole steps: each stage's time is the step's
  auto builder = std::make_shared<EngineBuilder>(ckpt, dtype);
  spec = builder->resolve(spec);
  const std::unique_ptr<StepEngine> engine = builder->build(spec);
  g.pipeline = spec.pipeline;
  g.tensor = spec.tensor;
  g.threads = spec.threads_of(0);
  g.block_tokens = spec.block_tokens;
  g.stage_seconds.assign(size_t(spec.pipeline), std::vector<double>(g.points(), 0.0));

  auto item = [&](int slot, std::vector<int> tokens, int position) {
    StepItem it;
    it.seq = uint64_t(slot) + 1;
    it.tokens = std::move(tokens);
    it.position = position;
    it.blocks = contiguous_blocks(slot * per_slot, per_slot);
    it.sample = true;
    it.sampling.temperature = 0;
    return it;
  };
  // Times one step; per stage, its share of the step's wall time.
  auto time_step = [&](const std::vector<StepItem>& items) {
    const auto t0 = Clock::now();
    engine->step(items);
    const double wall = seconds(t0, Clock::now());
    std::vector<double> stage(size_t(spec.pipeline), 0.0);
    if (spec.pipeline == 1) {
      stage[0] = wall;
      return stage;
    }
    double sum = 0;
    for (const StageSample& smp : engine->last_samples()) {
      stage[size_t(smp.stage)] += smp.seconds;
      sum += smp.seconds;
    }
    // Hand-offs between stages count too: spread them over the stages.
    for (double& s : stage) s = sum > 0 ? s * wall / sum : wall / spec.pipeline;
    return stage;
  };

  std::vector<StepItem> slots;  // every decode slot, at the context it holds
  for (int b = 0; b < max_b; ++b) slots.push_back(item(b, {}, 0));
  for (size_t ci = 0; ci < g.context.size(); ++ci) {
    const int ctx = g.context[ci];
    fill_contexts(*engine, slots, ctx, c.vocab_size);
    for (size_t bi = 0; bi < g.batch.size(); ++bi)
      for (size_t pi = 0; pi < g.prefill.size(); ++pi) {
        const int b = g.batch[bi], p = g.prefill[pi];
        if (b == 0 && p == 0) continue;
        if (b == 0 && ci > 0) {  // no decode: the context does not enter
          for (auto& st : g.stage_seconds) st[g.at(bi, ci, pi)] = st[g.at(bi, 0, pi)];
          continue;
        }
        std::vector<StepItem> items;
        for (int i = 0; i < b; ++i)
          items.push_back(item(i, {3 + (i * 31) % (c.vocab_size - 3)}, ctx));
        for (int left = p, slot = max_b; left > 0; left -= chunk, ++slot)
          items.push_back(item(slot, synthetic_ids(std::min(chunk, left), c.vocab_size, slot), 0));
        std::vector<std::vector<double>> runs(size_t(spec.pipeline));
        time_step(items);  // warm-up
        // Short steps vary most (a scheduler tick, a cache miss): they are
        // repeated until about 20 ms were measured, up to 100 times.
        const auto start = Clock::now();
        for (int r = 0; r < std::max(1, o.repeats) ||
                        (r < 100 && seconds(start, Clock::now()) < kProfileSecondsPerPoint);
             ++r) {
          const auto st = time_step(items);
          for (size_t s = 0; s < st.size(); ++s) runs[s].push_back(st[s]);
        }
        for (size_t s = 0; s < runs.size(); ++s)
          g.stage_seconds[s][g.at(bi, ci, pi)] = median(runs[s]);
      }
  }
  g.validate();
  return g;
}

}  // namespace troupe::app
