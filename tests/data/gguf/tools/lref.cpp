// Reference: llama.cpp's tokenization and greedy continuation of a prompt.
// usage: lref MODEL.gguf N_GEN (prompt text on stdin) [--tokens-only]
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>
#include "llama.h"
int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const bool tokens_only = argc > 3 && !strcmp(argv[3], "--tokens-only");
  const bool ids_in = argc > 3 && !strcmp(argv[3], "--ids");
  std::string prompt((std::istreambuf_iterator<char>(std::cin)), {});
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  auto mp = llama_model_default_params();
  mp.vocab_only = tokens_only;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { fprintf(stderr, "load failed\n"); return 1; }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> toks;
  if (ids_in) {
    size_t pos = 0;
    while (pos < prompt.size()) { size_t e; toks.push_back(std::stoi(prompt.substr(pos), &e)); pos += e; while (pos < prompt.size() && (prompt[pos]==','||prompt[pos]=='\n'||prompt[pos]==' ')) ++pos; }
  } else {
    int n = -llama_tokenize(vocab, prompt.data(), prompt.size(), nullptr, 0, true, true);
    toks.resize(n);
    llama_tokenize(vocab, prompt.data(), prompt.size(), toks.data(), n, true, true);
  }
  for (size_t i = 0; i < toks.size(); ++i) printf("%s%d", i ? "," : "", toks[i]);
  printf("\n");
  if (tokens_only) return 0;
  const int n_gen = atoi(argv[2]);
  auto cp = llama_context_default_params();
  cp.n_ctx = toks.size() + n_gen + 8;
  cp.n_batch = cp.n_ctx;
  cp.n_threads = 2; cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  llama_batch batch = llama_batch_get_one(toks.data(), toks.size());
  std::vector<llama_token> out;
  for (int i = 0; i < n_gen; ++i) {
    if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0; const int nv = llama_vocab_n_tokens(vocab);
    for (int v = 1; v < nv; ++v) if (logits[v] > logits[best]) best = v;
    { int second = best ? 0 : 1; for (int v = 0; v < nv; ++v) if (v != best && logits[v] > logits[second]) second = v; if (getenv("GAP")) fprintf(stderr, "%d:%g ", i, logits[best] - logits[second]); }
    out.push_back(best);
    if (llama_vocab_is_eog(vocab, best)) break;
    batch = llama_batch_get_one(&out.back(), 1);
  }
  for (size_t i = 0; i < out.size(); ++i) printf("%s%d", i ? "," : "", out[i]);
  printf("\n");
  llama_free(ctx); llama_model_free(model);
}
