#include "gpu/shard.h"

#include "gpu/cpu/thread_pool.h"
#include "gpu/engine.h"
#include "gpu/kv_cache.h"

namespace troupe {

namespace {

class CpuShard final : public Shard {
 public:
  CpuShard(const Checkpoint& ckpt, DType dtype, const ShardSpec& spec, int threads,
           int block_tokens, int blocks, DType kv_dtype)
      : model_(ckpt, dtype, spec),
        cache_(model_.make_cache(block_tokens, blocks, kv_dtype)),
        pool_(threads) {}

  const ShardDims& dims() const override { return model_.dims(); }
  void forward(std::span<const StepItem> items, const ShardIo& io) override {
    const std::vector<StepInput> inputs = step_inputs(items, caches_);
    model_.forward_shard(inputs, cache_, pool_, ws_, io);
  }
  size_t weight_bytes() const override { return model_.weight_bytes(); }
  size_t streamed_bytes() const override { return model_.weight_bytes_per_step(); }

 private:
  Model model_;
  KvCache cache_;
  ThreadPool pool_;
  Workspace ws_;
  std::vector<SequenceCache> caches_;  // the current micro-batch's sequences
};

}  // namespace

ShardFactory cpu_shards(const Checkpoint& ckpt, DType dtype, std::vector<int> threads,
                        int block_tokens, int blocks, DType kv_dtype) {
  if (threads.empty()) threads = {1};
  return [&ckpt, dtype, threads = std::move(threads), block_tokens, blocks, kv_dtype](
             const ShardSpec& spec, int device) {
    const int n = threads.size() == 1 ? threads[0] : threads.at(size_t(device));
    return std::unique_ptr<Shard>(
        std::make_unique<CpuShard>(ckpt, dtype, spec, n, block_tokens, blocks, kv_dtype));
  };
}

}  // namespace troupe
