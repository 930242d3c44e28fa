// CUDA backend figures on a random model (default: the 1b preset in bf16,
// TinyLlama's shape): device copy bandwidth, decode tokens/s at batch 1 and
// at batch 8/32/128 with contexts near 512 and 2048 (graphs on and off, and
// the deterministic mode), prefill TFLOP/s, and the RMSNorm and SiLU kernels
// as a fraction of bandwidth; then a table against the bounds (the H200's
// measured 4.3 TB/s copy and ~790 TFLOP/s bf16 by default). Timing lives
// here, never in the tests. Run by scripts/gpu-check.sh.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/kernels.h"
#include "gpu/synth_model.h"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string preset = "1b";
  DType dtype = DType::BF16;
  double bound_tbs = 4.3;       // copy bandwidth the bounds use
  double bound_tflops = 790.0;  // dense bf16
  bool quick = false;           // fewer points, for a first look
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Device-to-device copy, GB/s counting the read and the write.
double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  cu::check(cudaMalloc(&a, bytes), "cudaMalloc");
  cu::check(cudaMalloc(&b, bytes), "cudaMalloc");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int reps = 10;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cu::check(cudaEventSynchronize(e1), "copy");
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a), cudaFree(b);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 2.0 * double(bytes) * reps / (double(ms) * 1e-3) / 1e9;
}

// Times `fn` (queued on the default stream) over reps, in seconds per call.
template <class Fn>
double time_kernel(Fn&& fn, int reps = 20) {
  fn();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(e1);
  cu::check(cudaEventSynchronize(e1), "kernel");
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return double(ms) * 1e-3 / reps;
}

// GB/s of add_rmsnorm (x and delta read, x and the 16-bit output written)
// and of silu_mul (gate|up read, the output written) on the model's shapes.
void kernel_bandwidth(const ModelConfig& c, DType dtype, double& norm_gbs, double& silu_gbs) {
  const int rows = 4096;
  const size_t n = size_t(rows) * size_t(c.dim), h = size_t(rows) * size_t(c.hidden_dim);
  auto device_floats = [](size_t count) {
    void* p = nullptr;
    cu::check(cudaMalloc(&p, count * sizeof(float)), "cudaMalloc");
    return static_cast<float*>(p);
  };
  float* x = device_floats(n);
  float* delta = device_floats(n);
  float* w = device_floats(size_t(c.dim));
  float* gu = device_floats(2 * h);
  void* out = device_floats(h);
  cudaMemset(x, 0, n * 4), cudaMemset(delta, 0, n * 4), cudaMemset(w, 0, size_t(c.dim) * 4);
  cudaMemset(gu, 0, 2 * h * 4);
  const double es = double(dtype_size(dtype));
  const double t_norm = time_kernel(
      [&] { cu::add_rmsnorm(x, delta, w, nullptr, out, dtype, rows, c.dim, 1e-5f, nullptr); });
  norm_gbs = double(n) * (4 + 4 + 4 + es) / t_norm / 1e9;
  const double t_silu =
      time_kernel([&] { cu::silu_mul(gu, rows, c.hidden_dim, out, dtype, nullptr); });
  silu_gbs = double(h) * (8 + es) / t_silu / 1e9;
  cudaFree(x), cudaFree(delta), cudaFree(w), cudaFree(gu), cudaFree(out);
}

struct DecodePoint {
  int batch, context;
  bool graphs, deterministic;
  double tokens_per_s;
};

// One sequence prefilled to `context` tokens (its blocks then shared,
// read-only, by every sequence of the batch, each appending into blocks of
// its own), then `steps` timed decode steps of `batch` sequences.
class DecodeBench {
 public:
  DecodeBench(StepEngine& e, int context) : e_(e), context_(context) {
    const int bt = e.block_tokens();
    prefix_blocks_ = context / bt;
    std::vector<int> blocks;
    for (int b = 0; b < prefix_blocks_; ++b) blocks.push_back(b);
    next_block_ = prefix_blocks_;
    const auto t0 = Clock::now();
    for (int pos = 0; pos < context; pos += chunk_) {
      StepItem it;
      it.seq = 1u << 30;
      it.position = pos;
      it.tokens.assign(size_t(std::min(chunk_, context - pos)), 5);
      it.blocks = blocks;
      it.sample = pos + chunk_ >= context;
      it.sampling.temperature = 0;
      e.step({it});
    }
    prefill_s_ = seconds_since(t0);
    e.release(1u << 30);
  }
  double prefill_seconds() const { return prefill_s_; }

  double tokens_per_s(int batch, int steps) {
    const int bt = e_.block_tokens();
    const int own = (steps + 2 + bt - 1) / bt;
    if (next_block_ + batch * own > e_.kv_blocks()) next_block_ = prefix_blocks_;
    std::vector<StepItem> items(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b) {
      StepItem& it = items[size_t(b)];
      it.seq = uint64_t(b);
      it.position = context_;
      it.tokens = {7};
      it.sample = true;
      it.sampling.temperature = 0;
      for (int k = 0; k < prefix_blocks_; ++k) it.blocks.push_back(k);
      for (int k = 0; k < own; ++k) it.blocks.push_back(next_block_++);
    }
    auto run = [&](int n) {
      for (int s = 0; s < n; ++s) {
        const auto ids = e_.step(items);
        for (size_t b = 0; b < items.size(); ++b) {
          items[b].tokens = {ids[b] >= 0 ? ids[b] : 7};
          ++items[b].position;
        }
      }
    };
    run(2);  // captures the graph of this size
    const auto t0 = Clock::now();
    run(steps);
    const double took = seconds_since(t0);
    for (int b = 0; b < batch; ++b) e_.release(uint64_t(b));
    return double(batch) * steps / took;
  }

 private:
  StepEngine& e_;
  int context_;
  int prefix_blocks_ = 0, next_block_ = 0;
  const int chunk_ = 512;
  double prefill_s_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--preset" && i + 1 < argc)
      a.preset = argv[++i];
    else if (s == "--dtype" && i + 1 < argc)
      a.dtype = parse_dtype(argv[++i]).value_or(DType::BF16);
    else if (s == "--quick")
      a.quick = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda [--preset 1b|110m|tiny] [--dtype bf16|f16|f32] [--quick]\n");
      return 2;
    }
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::printf("bench_cuda: NO GPU: %s\n", why.c_str());
    return 3;
  }
  std::printf("bench_cuda: %s\n", why.c_str());
  const ModelConfig cfg = synth_preset(a.preset);
  auto t0 = Clock::now();
  const Checkpoint ck = synth_checkpoint(cfg, 1, a.dtype);
  std::printf("random %s checkpoint in %s: %.1f s\n", a.preset.c_str(), dtype_name(a.dtype),
              seconds_since(t0));

  const double copy_gbs = copy_bandwidth_gbs();
  double norm_gbs = 0, silu_gbs = 0;
  kernel_bandwidth(cfg, a.dtype, norm_gbs, silu_gbs);

  std::vector<DecodePoint> points;
  double streamed = 0, prefill_tflops = 0, prefill_tokens_per_s = 0;
  const std::vector<int> batches = a.quick ? std::vector<int>{8} : std::vector<int>{8, 32, 128};
  const int steps = 16;
  for (bool deterministic : {false, true}) {
    for (bool graphs : {true, false}) {
      if (deterministic && !graphs) continue;
      CudaEngineOptions o;
      o.blocks = 4096;
      o.max_batch_tokens = 2048;
      o.max_batch_sequences = 128;
      o.graphs = graphs;
      o.deterministic = deterministic;
      t0 = Clock::now();
      auto engine = make_cuda_engine(ck, a.dtype, o);
      std::printf("engine (graphs %s, %s) built in %.1f s\n", graphs ? "on" : "off",
                  deterministic ? "deterministic" : "fast", seconds_since(t0));
      streamed = double(engine->stats().streamed_bytes[0]);
      for (int context : {512, cfg.max_seq_len - 2 * steps}) {
        // The first prefill of an engine loads kernels and picks cuBLASLt
        // plans: a warm-up one keeps that out of the prefill figure.
        if (context == 512) DecodeBench warm_up(*engine, context);
        DecodeBench bench(*engine, context);
        if (!deterministic && graphs && context == 512) {
          // 2 x weights x tokens: the projections' FLOPs, the usual convention.
          prefill_tokens_per_s = context / bench.prefill_seconds();
          prefill_tflops =
              2.0 * streamed / double(dtype_size(a.dtype)) * prefill_tokens_per_s / 1e12;
          points.push_back({1, context, graphs, deterministic, bench.tokens_per_s(1, 64)});
        }
        if (deterministic && context == 512)
          points.push_back({1, context, graphs, deterministic, bench.tokens_per_s(1, 64)});
        for (int b : batches) {
          if (deterministic && b != 32 && !a.quick) continue;
          points.push_back({b, context, graphs, deterministic, bench.tokens_per_s(b, steps)});
        }
      }
    }
  }

  const double bound_gbs = a.bound_tbs * 1e3;
  const double bound_b1 = bound_gbs * 1e9 / streamed;
  std::printf("\n== CUDA figures: %s %s (%.2f GB streamed per decode step) ==\n", a.preset.c_str(),
              dtype_name(a.dtype), streamed / 1e9);
  std::printf("%-46s %14s %14s %9s %s\n", "figure", "measured", "bound", "fraction", "target");
  auto line = [](const std::string& what, double v, double bound, const char* unit,
                 const std::string& target) {
    char m[32], b[32];
    std::snprintf(m, sizeof m, "%.1f %s", v, unit);
    std::snprintf(b, sizeof b, "%.1f %s", bound, unit);
    std::printf("%-46s %14s %14s %8.1f%% %s\n", what.c_str(), m, b, 100 * v / bound,
                target.c_str());
  };
  line("device copy bandwidth", copy_gbs, bound_gbs, "GB/s", "");
  for (const auto& p : points) {
    char what[96];
    std::snprintf(what, sizeof what, "decode tok/s batch %d ctx %d %s%s", p.batch, p.context,
                  p.graphs ? "graphs" : "eager", p.deterministic ? " determ." : "");
    const double bound = bound_b1 * p.batch;  // memory-bound: weights once per step
    std::string target;
    if (p.batch == 1 && !p.deterministic)
      target = p.tokens_per_s >= 0.7 * bound_b1 ? ">= 70%: met" : ">= 70%: NOT MET";
    line(what, p.tokens_per_s, bound, "tok/s", target);
  }
  line("prefill (2 x params x tokens), 512-token prompt", prefill_tflops, a.bound_tflops, "TFLOP/s",
       "");
  std::printf("%-46s %14.0f tok/s\n", "prefill tokens/s (512-token prompt)", prefill_tokens_per_s);
  line("RMSNorm + residual kernel", norm_gbs, bound_gbs, "GB/s", "");
  line("SiLU x up kernel", silu_gbs, bound_gbs, "GB/s", "");
  std::printf(
      "(decode bounds: %.1f TB/s over the weights per step, x batch; valid while "
      "memory-bound, ~180 tokens per step)\n",
      a.bound_tbs);
  return 0;
}
