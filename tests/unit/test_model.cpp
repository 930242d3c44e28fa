// End-to-end correctness of the decoder: reference ids, loader agreement,
// batched == one-by-one, thread counts, 16-bit weights, step errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gpu/checkpoint_writer.h"
#include "gpu/cpu/gemm.h"
#include "gpu/generate.h"
#include "gpu/kv_cache.h"
#include "gpu/synth_model.h"
#include "support/test_support.h"
#include "tests/support/isa_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

std::vector<int> greedy(const Model& m, const std::vector<int>& prompt, int n, int threads = 2) {
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  return generate(m, threads, req).ids;
}

// A sequence that owns blocks [first, first + count) of its cache.
SequenceCache seq_at(int first, int count) {
  SequenceCache s;
  s.blocks = contiguous_blocks(first, count);
  return s;
}

// Logits of the last prompt token, prompt fed in one step.
std::vector<float> last_logits(const Model& m, const std::vector<int>& prompt,
                               DType kv = DType::F32) {
  const int blocks = (m.config().max_seq_len + 15) / 16;
  KvCache cache = KvCache::for_model(m.config(), 16, blocks, kv);
  ThreadPool pool(2);
  Workspace ws;
  SequenceCache seq = seq_at(0, blocks);
  std::vector<float> logits(size_t(m.config().vocab_size));
  StepInput in{&seq, prompt, true};
  m.forward({&in, 1}, cache, pool, ws, logits.data());
  return logits;
}

TEST(Stories260K, GreedyIdsMatchLlama2cReference) {
  auto model = Model::load(test::model_path("stories260K") / "stories260K.bin", DType::F32);
  const auto ref =
      nlohmann::json::parse(test::read_file(test::data_path("stories260K_expected.json")));
  ASSERT_GE(ref["cases"].size(), 3u);
  for (const auto& c : ref["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int>>();
    const auto want = c["ids"].get<std::vector<int>>();
    EXPECT_EQ(greedy(*model, prompt, int(want.size())), want) << c["prompt_ids"].dump();
  }
}

TEST(Fortune, HfAndLlama2cCheckpointsGiveTheSameLogitsAndIds) {
  auto hf = Model::load(test::model_path("fortune"), DType::F32);
  auto l2c = Model::load(test::model_path("fortune") / "llama2c" / "model.bin", DType::F32);
  const std::vector<int> prompt{1, 450, 1593, 310, 1834, 338, 5, 77};
  const auto a = last_logits(*hf, prompt), b = last_logits(*l2c, prompt);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i;
  EXPECT_EQ(greedy(*hf, {1, 450}, 48), greedy(*l2c, {1, 450}, 48));
}

// RoPE scaling reaches the model through config.json (a checkpoint written
// and read back) and changes a prompt's logits, but not those of a lone
// token at position 0, which no scaling rotates. (That the rotations are
// the stretched ones: Kernels.RopeScalingStretchesTheFrequencies.)
TEST(RopeScaling, ScaledModelRotatesByTheStretchedPositions) {
  ModelConfig c = synth_preset("tiny");
  c.rope = RopeLayout::RotateHalf;
  const Checkpoint plain = synth_checkpoint(c, 3, DType::F32);
  Checkpoint scaled = plain;
  scaled.config.rope_scaling.kind = RopeScaling::Kind::Linear;
  scaled.config.rope_scaling.factor = 2;
  test::TempDir dir;
  write_hf_checkpoint(scaled, dir.path());
  const Checkpoint back = load_checkpoint(dir.path());
  EXPECT_EQ(back.config.rope_scaling, scaled.config.rope_scaling);
  const Model a(plain, DType::F32), b(back, DType::F32);
  const std::vector<int> prompt{1, 5, 9, 13, 7, 3};
  const std::vector<float> la = last_logits(a, prompt), lb = last_logits(b, prompt);
  EXPECT_NE(la, lb) << "the scaling must change the rotations";
  // One token: position 0 rotates by nothing either way.
  EXPECT_EQ(last_logits(a, {1}), last_logits(b, {1}));
}

// Qwen2: biases on q, k and v. Written and read back as a qwen2 checkpoint
// they give the same logits; zero biases give the model without them; and
// each of the three changes the answer (so none is dropped on the way).
TEST(QkvBias, Qwen2CheckpointRoundTripsAndEachBiasCounts) {
  ModelConfig c = synth_preset("tiny");
  c.rope = RopeLayout::RotateHalf;
  c.qkv_bias = true;
  const Checkpoint biased = synth_checkpoint(c, 9, DType::F32);
  test::TempDir dir;
  write_hf_checkpoint(biased, dir.path());
  EXPECT_NE(test::read_file(dir / "config.json").find("\"qwen2\""), std::string::npos);
  const Checkpoint back = load_checkpoint(dir.path());
  ASSERT_TRUE(back.config.qkv_bias);
  const std::vector<int> prompt{1, 5, 9, 13, 7, 3};
  const std::vector<float> want = last_logits(Model(biased, DType::F32), prompt);
  EXPECT_EQ(last_logits(Model(back, DType::F32), prompt), want);

  ModelConfig plain_config = c;
  plain_config.qkv_bias = false;
  Checkpoint plain = synth_checkpoint(plain_config, 9, DType::F32);
  Checkpoint zero = biased;
  for (LayerTensors& l : zero.layers)
    for (Tensor* b : {&l.bq, &l.bk, &l.bv}) *b = Tensor::zeros(b->shape(), DType::F32);
  EXPECT_EQ(last_logits(Model(zero, DType::F32), prompt),
            last_logits(Model(plain, DType::F32), prompt));
  for (int which = 0; which < 3; ++which) {
    Checkpoint one = zero;
    Tensor& b = which == 0 ? one.layers[1].bq : which == 1 ? one.layers[1].bk : one.layers[1].bv;
    b = biased.layers[1].bq.rows(0, b.dim(0));  // some nonzero values of the right size
    EXPECT_NE(last_logits(Model(one, DType::F32), prompt),
              last_logits(Model(zero, DType::F32), prompt))
        << "bias " << which;
  }
}

// Qwen3: per-head RMS norms on queries and keys, here with head_dim 16 x 8
// heads on a hidden size of 64 (Qwen3's heads are wider than dim / heads).
// Read back as a qwen3 checkpoint, the same logits; each norm's weights
// count; and with unit weights, scaling a layer's q projection changes
// nothing (the norm takes the scale out).
TEST(QkNorm, Qwen3CheckpointRoundTripsAndTheNormsCount) {
  ModelConfig c = synth_preset("tiny");
  c.rope = RopeLayout::RotateHalf;
  c.qk_norm = true;
  c.head_dim = 16;
  const Checkpoint ck = synth_checkpoint(c, 10, DType::F32);
  test::TempDir dir;
  write_hf_checkpoint(ck, dir.path());
  EXPECT_NE(test::read_file(dir / "config.json").find("\"qwen3\""), std::string::npos);
  const Checkpoint back = load_checkpoint(dir.path());
  ASSERT_TRUE(back.config.qk_norm);
  ASSERT_EQ(back.config.head_dim, 16);
  const std::vector<int> prompt{1, 5, 9, 13, 7, 3};
  const std::vector<float> want = last_logits(Model(ck, DType::F32), prompt);
  EXPECT_EQ(last_logits(Model(back, DType::F32), prompt), want);
  for (int which = 0; which < 2; ++which) {
    Checkpoint other = ck;
    Tensor& n = which == 0 ? other.layers[1].q_norm : other.layers[1].k_norm;
    n = Tensor::zeros(n.shape(), DType::F32);
    EXPECT_NE(last_logits(Model(other, DType::F32), prompt), want) << "norm " << which;
  }
  // Unit norm weights: the q projection's scale does not reach the scores.
  const auto f32_tensor = [](const std::vector<int64_t>& shape, const std::vector<float>& v) {
    Tensor t = Tensor::zeros(shape, DType::F32);
    std::copy(v.begin(), v.end(), t.data_mut<float>());
    return t;
  };
  Checkpoint unit = ck;
  for (LayerTensors& l : unit.layers)
    for (Tensor* n : {&l.q_norm, &l.k_norm}) *n = f32_tensor({16}, std::vector<float>(16, 1.0f));
  Checkpoint scaled = unit;
  std::vector<float> wq = scaled.layers[0].wq.to_f32();
  for (float& v : wq) v *= 4.0f;
  scaled.layers[0].wq = f32_tensor(scaled.layers[0].wq.shape(), wq);
  const auto a = last_logits(Model(unit, DType::F32), prompt);
  const auto b = last_logits(Model(scaled, DType::F32), prompt);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f) << i;
}

TEST(Fortune, GreedyTextForAFixedPromptIsStable) {
  auto model = Model::load(test::model_path("fortune"), DType::F32);
  auto tok = Tokenizer::load(model->tokenizer_path());
  const auto golden =
      nlohmann::json::parse(test::read_file(test::data_path("fortune_greedy.json")));
  const auto prompt = tok.encode(golden["prompt"].get<std::string>(), true);
  EXPECT_EQ(prompt, golden["prompt_ids"].get<std::vector<int>>());
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = golden["max_tokens"].get<int>();
  req.sampling.temperature = 0;
  const auto r = generate(*model, 2, req);
  EXPECT_EQ(r.ids, golden["ids"].get<std::vector<int>>());
  // The text that follows the prompt (its first space included).
  std::vector<int> all = prompt;
  all.insert(all.end(), r.ids.begin(), r.ids.end());
  EXPECT_EQ(tok.decode(all).substr(tok.decode(prompt).size()), golden["text"].get<std::string>());
}

// A ragged batch: sequences at different positions, some prefilling a chunk,
// some decoding one token, in one step, must equal each run alone.
void check_batched_equals_single(const Model& m, int threads, DType kv = DType::F32) {
  const auto& c = m.config();
  std::vector<std::vector<int>> prompts;
  for (int s = 0; s < 5; ++s) {
    std::vector<int> p;
    for (int i = 0; i < 3 + 7 * s; ++i) p.push_back((i * 37 + s * 11 + 1) % c.vocab_size);
    prompts.push_back(p);
  }
  const int extra = 6;  // decode steps after the prompt
  // Alone: each sequence prefilled at once, then decoded token by token.
  std::vector<std::vector<std::vector<float>>> alone(prompts.size());
  {
    KvCache cache = KvCache::for_model(c, 4, 512, kv);
    ThreadPool pool(threads);
    Workspace ws;
    std::vector<float> logits(size_t(c.vocab_size));
    for (size_t s = 0; s < prompts.size(); ++s) {
      SequenceCache seq = seq_at(0, 512);
      StepInput in{&seq, prompts[s], true};
      m.forward({&in, 1}, cache, pool, ws, logits.data());
      alone[s].push_back(logits);
      for (int k = 0; k < extra; ++k) {
        const int next = argmax(logits);
        StepInput d{&seq, {&next, 1}, true};
        m.forward({&d, 1}, cache, pool, ws, logits.data());
        alone[s].push_back(logits);
      }
    }
  }
  // Batched: sequence s joins at step s (so prefills overlap other decodes),
  // and prompts are fed in chunks of 5 tokens.
  KvCache cache = KvCache::for_model(c, 4, 512, kv);
  ThreadPool pool(threads);
  Workspace ws;
  std::vector<SequenceCache> seqs;
  for (size_t s = 0; s < prompts.size(); ++s) seqs.push_back(seq_at(int(s) * 100, 100));
  std::vector<size_t> fed(prompts.size(), 0);
  std::vector<std::vector<std::vector<float>>> batched(prompts.size());
  std::vector<int> next_tok(prompts.size());
  for (int step = 0; step < 40; ++step) {
    std::vector<StepInput> ins;
    std::vector<size_t> who;
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (int(s) > step || batched[s].size() > size_t(extra)) continue;
      if (fed[s] < prompts[s].size()) {
        const size_t n = std::min<size_t>(5, prompts[s].size() - fed[s]);
        const bool last = fed[s] + n == prompts[s].size();
        ins.push_back({&seqs[s], std::span<const int>(prompts[s]).subspan(fed[s], n), last});
        fed[s] += n;
      } else {
        ins.push_back({&seqs[s], {&next_tok[s], 1}, true});
      }
      who.push_back(s);
    }
    if (ins.empty()) break;
    std::vector<float> logits(ins.size() * size_t(c.vocab_size));
    m.forward(ins, cache, pool, ws, logits.data());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i].want_logits) continue;
      const std::vector<float> row(logits.begin() + long(i * size_t(c.vocab_size)),
                                   logits.begin() + long((i + 1) * size_t(c.vocab_size)));
      batched[who[i]].push_back(row);
      next_tok[who[i]] = argmax(row);
    }
  }
  for (size_t s = 0; s < prompts.size(); ++s) {
    ASSERT_EQ(batched[s].size(), alone[s].size()) << "sequence " << s;
    for (size_t k = 0; k < alone[s].size(); ++k)
      for (size_t i = 0; i < alone[s][k].size(); ++i)
        ASSERT_EQ(batched[s][k][i], alone[s][k][i])
            << "seq " << s << " step " << k << " logit " << i;
  }
}

TEST(BatchedForward, MixedPrefillAndDecodeEqualsOneByOneStories) {
  auto m = Model::load(test::model_path("stories260K") / "stories260K.bin", DType::F32);
  check_batched_equals_single(*m, 2);
}

TEST(BatchedForward, MixedPrefillAndDecodeEqualsOneByOneGqaRandomModel) {
  Model m(synth_checkpoint(synth_preset("tiny"), 7, DType::F32), DType::F32);
  check_batched_equals_single(m, 3);
}

TEST(BatchedForward, SixteenBitWeightsBatchedEqualsOneByOne) {
  Model m(synth_checkpoint(synth_preset("tiny"), 8, DType::F32), DType::BF16);
  check_batched_equals_single(m, 2);
}

// A GGUF's quantized matrices and embeddings stay quantized in memory
// (packed_matrix.h) and give, bit for bit, the logits of the same model with
// every weight dequantized to f32 first, in f32 and in bf16; batched as one
// by one.
TEST(QuantizedWeights, GiveTheLogitsOfTheirF32DequantizationInAnyBatch) {
  auto dequantize = [](Tensor& t) {
    if (!t.is_blocks()) return;
    Tensor f = Tensor::zeros(t.shape(), DType::F32);
    const std::vector<float> v = t.to_f32();
    std::copy(v.begin(), v.end(), f.data_mut<float>());
    t = f;
  };
  // q4_K with q6_K, q5_K with q6_K, q8_0, q4_0.
  for (const char* file :
       {"llama-q4_k_m.gguf", "qwen2-q5_k_m.gguf", "qwen3-q8_0.gguf", "llama31-q4_0.gguf"}) {
    SCOPED_TRACE(file);
    const Checkpoint ck = load_checkpoint(test::data_path(std::string("gguf/") + file));
    Checkpoint f32 = ck;
    for (LayerTensors& l : f32.layers)
      for (Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) dequantize(*t);
    dequantize(f32.tok_embedding);
    dequantize(f32.classifier);
    const Model quantized(ck, DType::F32), plain(f32, DType::F32);
    EXPECT_LT(quantized.weight_bytes(), plain.weight_bytes() * 2 / 5);
    const Model quantized_bf16(ck, DType::BF16), plain_bf16(f32, DType::BF16);
    EXPECT_LT(quantized_bf16.weight_bytes_per_step(), plain_bf16.weight_bytes_per_step() * 4 / 5);
    // Tensor shards' column slices of the output and down projections cut
    // the kinds' blocks of 256 but no group: they stay quantized too.
    size_t shards = 0;
    for (int rank = 0; rank < 2; ++rank)
      shards += Model(ck, DType::F32, ShardSpec{rank, 2}).weight_bytes_per_step();
    EXPECT_LT(shards, quantized.weight_bytes_per_step() * 11 / 10);
    for (const std::vector<int>& prompt : {std::vector<int>{1, 200, 17, 900, 31, 5}, {1, 7}}) {
      EXPECT_EQ(last_logits(quantized, prompt), last_logits(plain, prompt));
      // bf16: the weights rounded as bf16 panels round them (the embedding
      // stays exact: rows of blocks, looked up).
      Checkpoint exact_embedding = f32;
      exact_embedding.tok_embedding = ck.tok_embedding;
      EXPECT_EQ(last_logits(quantized_bf16, prompt),
                last_logits(Model(exact_embedding, DType::BF16), prompt));
    }
    check_batched_equals_single(quantized, 3);
    check_batched_equals_single(quantized_bf16, 2);
  }
}

// Integer products (model.quantized_products: int8): a sequence's logits do
// not depend on its batch, the ISA or the thread count, and stay near the
// exact ones (x's quantization moves each by well under its spread).
TEST(QuantizedWeights, Int8ProductsAreBatchInvariantAndNearTheExactLogits) {
  for (const char* file : {"llama-q4_k_m.gguf", "qwen2-q5_k_m.gguf", "qwen3-q8_0.gguf"}) {
    SCOPED_TRACE(file);
    Checkpoint ck = load_checkpoint(test::data_path(std::string("gguf/") + file));
    const Model exact(ck, DType::F32);
    ck.quant_products = QuantProducts::Int8;
    const Model int8(ck, DType::F32);
    EXPECT_LT(int8.weight_bytes(), exact.weight_bytes());
    check_batched_equals_single(int8, 3);
    const std::vector<int> prompt{1, 200, 17, 900, 31, 5};
    const std::vector<float> a = last_logits(int8, prompt), b = last_logits(exact, prompt);
    ASSERT_EQ(a.size(), b.size());
    double mean = 0.0, spread = 0.0, err = 0.0;
    for (float v : b) mean += v / double(b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      spread = std::max(spread, std::fabs(b[i] - mean));
      err = std::max(err, double(std::fabs(a[i] - b[i])));
    }
    EXPECT_GT(err, 0.0);  // integer products are not the exact ones
    EXPECT_LT(err, 0.02 * spread) << "largest logit error " << err << ", spread " << spread;
    test::IsaGuard guard;
    for (Isa isa : test::supported_isas()) {
      force_isa(isa);
      EXPECT_EQ(last_logits(int8, prompt), a) << isa_name(isa);
    }
  }
}

// Against llama.cpp's greedy ids for the GGUF fixtures (models.expected.json,
// which its own integer products give too), teacher-forced: integer
// products choose llama.cpp's token at every step where the exact logits'
// two best are more than a margin apart (most steps: these random models
// have many near ties), and at all but at most one step in all; they move no
// logit by half that margin. (Free-running, a text parts at such a tie.)
TEST(QuantizedWeights, Int8ProductsMakeLlamaCppsChoicesAwayFromNearTies) {
  std::ifstream in(test::data_path("gguf/models.expected.json"));
  const nlohmann::json expected = nlohmann::json::parse(in);
  constexpr float kMargin = 0.08f;
  for (const auto& c : expected["cases"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file);
    Checkpoint ck = load_checkpoint(test::data_path("gguf/" + file));
    // Each layer's products add their rounding: the margin is one layer's
    // (the fixtures but Gemma 3's six-layer one have one), grown as a random
    // walk's over more.
    const float margin = kMargin * std::sqrt(float(ck.config.n_layers));
    const Model exact(ck, DType::F32);
    ck.quant_products = QuantProducts::Int8;
    const Model int8(ck, DType::F32);
    std::vector<int> seq = c["prompt_ids"].get<std::vector<int>>();
    const std::vector<int> ids = c["ids"].get<std::vector<int>>();
    int decided = 0, agreed = 0;
    for (size_t i = 0; i < ids.size(); seq.push_back(ids[i++])) {
      const std::vector<float> a = last_logits(int8, seq), b = last_logits(exact, seq);
      std::vector<float> sorted = b;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      float moved = 0.0f;
      for (size_t t = 0; t < a.size(); ++t) moved = std::max(moved, std::fabs(a[t] - b[t]));
      EXPECT_LT(moved, margin / 2) << "step " << i;
      const bool same = std::max_element(a.begin(), a.end()) - a.begin() == ids[i];
      agreed += same;
      if (sorted[0] - sorted[1] <= margin) continue;
      ++decided;
      EXPECT_TRUE(same) << "step " << i;
    }
    EXPECT_GE(decided, int(ids.size()) / 2);
    EXPECT_GE(agreed, int(ids.size()) - 1);
  }
}

// A 16-bit KV cache rounds what it stores, once: every reader sees the same
// numbers, so a sequence's logits still do not depend on its batch.
TEST(BatchedForward, SixteenBitKvCacheBatchedEqualsOneByOne) {
  Model gqa(synth_checkpoint(synth_preset("tiny"), 7, DType::F32), DType::F32);
  auto stories = Model::load(test::model_path("stories260K") / "stories260K.bin", DType::F32);
  for (DType kv : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(kv));
    check_batched_equals_single(gqa, 3, kv);
    check_batched_equals_single(*stories, 2, kv);
  }
}

// The CPU engine runs a step on its pool or on one thread, whichever
// measures faster (gpu/cpu/thread_choice.h): that must not change a float.
TEST(BatchedForward, ThreadCountDoesNotChangeLogits) {
  // (weights, KV cache) pairs.
  for (auto [dt, kv] : {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::F32},
                        std::pair{DType::F16, DType::F32}, std::pair{DType::F32, DType::F16},
                        std::pair{DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + " weights, " + dtype_name(kv) + " cache");
    auto m = Model::load(test::model_path("fortune"), dt);
    const std::vector<int> prompt{1, 450, 1593, 310, 1834, 338, 5, 77, 900, 12};
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 5}) {
      KvCache cache = KvCache::for_model(m->config(), 16, 32, kv);
      ThreadPool pool(threads);
      Workspace ws;
      SequenceCache seq = seq_at(0, 32);
      std::vector<float> logits(size_t(m->config().vocab_size));
      StepInput in{&seq, prompt, true};
      m->forward({&in, 1}, cache, pool, ws, logits.data());
      outs.push_back(logits);
    }
    EXPECT_EQ(outs[0], outs[1]);
    EXPECT_EQ(outs[0], outs[2]);
  }
}

// 16-bit weights: logits stay within 2% of the f32 logits' spread (max |diff|
// / (max - min) of the f32 logits), and the greedy continuation of the
// trained model agrees for its first tokens.
TEST(SixteenBitWeights, LogitsWithinToleranceOfF32) {
  auto ck = load_checkpoint(test::model_path("fortune"));
  Model f32(ck, DType::F32), bf16(ck, DType::BF16), f16(ck, DType::F16);
  EXPECT_LT(double(bf16.weight_bytes()), 0.51 * double(f32.weight_bytes()));
  const std::vector<int> prompt{1, 450, 1593, 310, 1834, 338};
  const auto ref = last_logits(f32, prompt);
  const auto [mn, mx] = std::minmax_element(ref.begin(), ref.end());
  const float spread = *mx - *mn;
  for (const Model* m : {&bf16, &f16}) {
    const auto got = last_logits(*m, prompt);
    float worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]));
    EXPECT_LT(worst / spread, m == &f16 ? 0.002f : 0.02f) << dtype_name(m->weight_dtype());
    EXPECT_EQ(argmax(got), argmax(ref));
  }
  EXPECT_EQ(greedy(f16, prompt, 8), greedy(f32, prompt, 8));
}

// A 16-bit KV cache: a long prompt's last logits stay close to the f32
// cache's (f16 keeps 11 significant bits, bf16 8), and greedy decoding of
// the trained model continues the same way for its first tokens with f16.
TEST(SixteenBitKvCache, LogitsWithinToleranceOfF32) {
  auto m = Model::load(test::model_path("fortune"), DType::F32);
  std::vector<int> prompt{1};
  for (int i = 0; i < 120; ++i) prompt.push_back(3 + (i * 131 + 7) % (m->config().vocab_size - 3));
  const auto ref = last_logits(*m, prompt);
  const auto [mn, mx] = std::minmax_element(ref.begin(), ref.end());
  const float spread = *mx - *mn;
  for (DType kv : {DType::F16, DType::BF16}) {
    const auto got = last_logits(*m, prompt, kv);
    float worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]));
    EXPECT_GT(worst, 0.0f) << dtype_name(kv) << ": the cache should round something";
    EXPECT_LT(worst / spread, kv == DType::F16 ? 0.002f : 0.02f) << dtype_name(kv);
    EXPECT_EQ(argmax(got), argmax(ref)) << dtype_name(kv);
  }
}

TEST(StepErrors, BadIdsContextOverflowAndShortBlockTablesAreCleanErrors) {
  Model m(synth_checkpoint(synth_preset("tiny"), 1, DType::F32), DType::F32);
  const auto& c = m.config();
  KvCache cache = KvCache::for_model(c, 16, 3);  // 48 positions
  ThreadPool pool(1);
  Workspace ws;
  std::vector<float> logits(2 * size_t(c.vocab_size));
  SequenceCache a = seq_at(0, 3), b;
  const std::vector<int> bad{1, c.vocab_size};
  StepInput in{&a, bad, true};
  try {
    m.forward({&in, 1}, cache, pool, ws, logits.data());
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos);
  }
  EXPECT_EQ(a.length, 0);
  const std::vector<int> too_long(size_t(c.max_seq_len) + 1, 1);
  in = {&a, too_long, true};
  EXPECT_THROW(m.forward({&in, 1}, cache, pool, ws, logits.data()), std::invalid_argument);
  // 40 + 20 tokens: b's block table holds none of its 20 positions, so the
  // step is refused and neither sequence changes.
  const std::vector<int> p40(40, 3), p20(20, 4);
  StepInput two[2] = {{&a, p40, true}, {&b, p20, true}};
  try {
    m.forward(two, cache, pool, ws, logits.data());
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("block table holds 0 positions; the step needs 20"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(b.length, 0);
  // A block id outside the cache is refused too.
  b.blocks = {3};
  EXPECT_THROW(m.forward({&two[1], 1}, cache, pool, ws, logits.data()), std::invalid_argument);
  EXPECT_EQ(b.length, 0);
  // After the failures the cache still works.
  m.forward({two, 1}, cache, pool, ws, logits.data());
  EXPECT_EQ(a.length, 40);
}

TEST(GenerateRequests, ValidationMessages) {
  Model m(synth_checkpoint(synth_preset("tiny"), 1, DType::F32), DType::F32);
  GenerateRequest req;
  EXPECT_THROW(generate(m, 1, req), std::invalid_argument);  // empty prompt
  req.prompt = {1, 2};
  req.max_tokens = 0;
  EXPECT_THROW(generate(m, 1, req), std::invalid_argument);
  req.max_tokens = 1000;  // more than the context: stops at the context
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  const auto r = generate(m, 1, req);
  EXPECT_EQ(r.finish_reason, FinishReason::Length);
  EXPECT_EQ(int(r.ids.size()), m.config().max_seq_len - 2 + 1);
}

TEST(SynthModel, SeededAndFinite) {
  const auto c = synth_preset("tiny");
  auto a = synth_checkpoint(c, 42, DType::BF16), b = synth_checkpoint(c, 42, DType::BF16);
  EXPECT_EQ(a.layers[1].wq.to_f32(), b.layers[1].wq.to_f32());
  EXPECT_NE(synth_checkpoint(c, 43, DType::BF16).layers[1].wq.to_f32(), a.layers[1].wq.to_f32());
  Model m(a, DType::F32);
  const auto logits = last_logits(m, {1, 5, 9, 200, 17});
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_THROW(synth_preset("huge"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
