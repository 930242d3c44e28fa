// The llama2.c checkpoint loader: the input as a `.bin` file through
// load_checkpoint, as `troupe serve` loads model.path. Oracles: only
// CheckpointError escapes; a loaded checkpoint has the shapes its config
// says, every tensor byte is inside the file, and the model builds from it.
#include "fuzz_support.h"
#include "loader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const auto path = scratch_file("model.bin", as_text(data, size));
  Checkpoint ck;
  if (expect_only<CheckpointError>([&] { ck = load_checkpoint(path); })) check_checkpoint(ck);
  return 0;
}
