// The Hugging Face directory loader: the input is a checkpoint directory cut
// at each "\n====\n": config.json, model.safetensors, and when there are
// more parts model.safetensors.index.json and its shards s1.safetensors,
// s2.safetensors, ... (model.safetensors is then written only when its part
// is not empty, so that the index is what is read). Loaded through
// load_checkpoint on the directory. Oracles: as fuzz_llama2c.cpp.
#include <string>

#include "fuzz_support.h"
#include "loader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const auto parts = split(as_text(data, size), kFileSeparator, 6);
  const auto dir = fresh_scratch_subdir("hf");
  scratch_file("hf/config.json", parts[0]);
  const bool indexed = parts.size() > 2;
  if (parts.size() > 1 && (!indexed || !parts[1].empty()))
    scratch_file("hf/model.safetensors", parts[1]);
  if (indexed) {
    scratch_file("hf/model.safetensors.index.json", parts[2]);
    for (size_t i = 3; i < parts.size(); ++i)
      scratch_file("hf/s" + std::to_string(i - 2) + ".safetensors", parts[i]);
  }
  Checkpoint ck;
  if (expect_only<CheckpointError>([&] { ck = load_checkpoint(dir); })) check_checkpoint(ck);
  return 0;
}
