#include "apps/bench_engine.h"

#include <immintrin.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "gpu/cpu/gemm.h"

namespace troupe::app {

namespace {

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
    copy_gbs = std::max(copy_gbs, 2.0 * double(per) * chunks * sizeof(float) / seconds(t0, t1) / 1e9);
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

EngineBenchResult run_engine_bench(const Model& model, const std::string& model_name,
                                   const EngineBenchOptions& o) {
  const ModelConfig& c = model.config();
  EngineBenchResult r;
  r.model = model_name;
  r.dtype = dtype_name(model.weight_dtype());
  r.isa = isa_name(active_isa());
  r.threads = o.threads;
  // Arrays well past the last-level cache, so the copy measures DRAM.
  measure_bandwidth(o.threads, size_t(512) << 20, r.bandwidth_gbs, r.read_bandwidth_gbs);
  r.weight_bytes_per_step = model.weight_bytes_per_step();
  r.bound_steps_per_s = r.bandwidth_gbs * 1e9 / double(r.weight_bytes_per_step);
  r.prompt_len = std::min(o.prompt_len, c.max_seq_len);

  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int ctx_per_seq = std::min(c.max_seq_len, std::max(r.prompt_len, 16 + o.decode_tokens));
  constexpr int kBlock = 16;
  KvCache cache = KvCache::for_model(c, kBlock, std::max(1, max_batch) * ((ctx_per_seq + kBlock - 1) / kBlock));
  r.kv_bytes_per_token = cache.bytes_per_token();
  ThreadPool pool(o.threads);
  Workspace ws;
  std::vector<float> logits(size_t(std::max(1, max_batch)) * size_t(c.vocab_size));

  // Prefill: the whole prompt in one step; best of the repeats.
  {
    const auto prompt = synthetic_ids(r.prompt_len, c.vocab_size, 1);
    double best = 1e30;
    for (int rep = 0; rep < o.repeats; ++rep) {
      SequenceCache seq;
      StepInput in{&seq, prompt, true};
      const auto t0 = Clock::now();
      model.forward({&in, 1}, cache, pool, ws, logits.data());
      best = std::min(best, seconds(t0, Clock::now()));
      cache.release(seq);
    }
    r.prefill_tokens_per_s = double(r.prompt_len) / best;
  }

  // Decode: B sequences with a 16-token context each, then decode_tokens steps.
  for (int batch : o.batches) {
    std::vector<SequenceCache> seqs(static_cast<size_t>(batch));
    std::vector<std::vector<int>> prompts;
    for (int b = 0; b < batch; ++b) prompts.push_back(synthetic_ids(16, c.vocab_size, b + 2));
    {
      std::vector<StepInput> ins;
      for (int b = 0; b < batch; ++b) ins.push_back({&seqs[size_t(b)], prompts[size_t(b)], true});
      model.forward(ins, cache, pool, ws, logits.data());
    }
    std::vector<int> next(static_cast<size_t>(batch));
    std::vector<StepInput> ins(static_cast<size_t>(batch));
    double best = 1e30;
    const int steps = std::min(o.decode_tokens, c.max_seq_len - 16);
    // Repeats reuse the contexts; positions keep growing within the context.
    const int reps = std::max(1, std::min(o.repeats, (c.max_seq_len - 16) / std::max(1, steps)));
    for (int rep = 0; rep < reps; ++rep) {
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < batch; ++b) {
          next[size_t(b)] = 3 + (s * 31 + b) % (c.vocab_size - 3);
          ins[size_t(b)] = {&seqs[size_t(b)], {&next[size_t(b)], 1}, true};
        }
        model.forward(ins, cache, pool, ws, logits.data());
      }
      best = std::min(best, seconds(t0, Clock::now()));
    }
    for (auto& s : seqs) cache.release(s);
    DecodePoint p;
    p.batch = batch;
    p.tokens_per_s = double(batch) * steps / best;
    p.bound_fraction = (double(steps) / best) / r.bound_steps_per_s;
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
  j["isa"] = isa;
  j["threads"] = threads;
  j["bandwidth_gbs"] = bandwidth_gbs;
  j["read_bandwidth_gbs"] = read_bandwidth_gbs;
  j["weight_bytes_per_step"] = weight_bytes_per_step;
  j["bound_steps_per_s"] = bound_steps_per_s;
  j["prompt_len"] = prompt_len;
  j["prefill_tokens_per_s"] = prefill_tokens_per_s;
  j["decode"] = nlohmann::json::array();
  for (const auto& d : decode)
    j["decode"].push_back({{"batch", d.batch}, {"tokens_per_s", d.tokens_per_s}, {"bound_fraction", d.bound_fraction}});
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["peak_rss_bytes"] = peak_rss_bytes;
  return j;
}

std::string EngineBenchResult::table() const {
  std::ostringstream s;
  char line[256];
  s << "model " << model << ", " << dtype << " weights, " << threads << " threads, " << isa << " kernels\n";
  std::snprintf(line, sizeof line,
                "memory bandwidth: copy %.1f GB/s, read %.1f GB/s; weights per step %.1f MB -> bound %.1f steps/s\n",
                bandwidth_gbs, read_bandwidth_gbs, double(weight_bytes_per_step) / 1e6, bound_steps_per_s);
  s << line;
  std::snprintf(line, sizeof line, "prefill (%d tokens): %.1f tokens/s\n", prompt_len, prefill_tokens_per_s);
  s << line;
  s << "  batch | decode tokens/s | of bandwidth bound\n";
  for (const auto& d : decode) {
    std::snprintf(line, sizeof line, "  %5d | %15.1f | %17.0f%%\n", d.batch, d.tokens_per_s, 100.0 * d.bound_fraction);
    s << line;
  }
  std::snprintf(line, sizeof line, "KV cache: %zu bytes/token; peak RSS %.1f MiB\n", kv_bytes_per_token,
                double(peak_rss_bytes) / (1 << 20));
  s << line;
  return s.str();
}

}  // namespace troupe::app
