// The safetensors reader on its own: the input as a file through
// read_safetensors, then what it read written back by write_safetensors and
// read again. Oracles: only CheckpointError escapes; every tensor viewing
// the file lies inside the mapping and reads whole; the round trip gives the
// same names, dtypes, shapes, bytes and metadata.
#include <cstring>

#include "fuzz_support.h"
#include "gpu/checkpoint.h"
#include "gpu/loaders/safetensors.h"

namespace troupe::fuzz {
namespace {

void check_inside(const SafetensorsFile& f) {
  const auto* begin = f.mapping->data();
  const auto* end = begin + f.mapping->size();
  for (const auto& [name, t] : f.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    // A view into the file, or (misaligned data) a copy elsewhere.
    if (p >= begin && p <= end && t.nbytes() > size_t(end - p))
      violated("tensor '" + name + "' views past the end of its file");
    volatile float sink = 0;
    for (float v : t.to_f32()) sink = sink + v;
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.nbytes() == 0) return true;
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const auto path = scratch_file("model.safetensors", as_text(data, size));
  SafetensorsFile f;
  if (!expect_only<CheckpointError>([&] { f = read_safetensors(path); })) return 0;
  check_inside(f);

  std::vector<std::pair<std::string, Tensor>> tensors(f.tensors.begin(), f.tensors.end());
  const auto copy = scratch_dir() / "copy.safetensors";
  write_safetensors(copy, tensors, f.metadata);
  const SafetensorsFile g = read_safetensors(copy);
  if (g.metadata != f.metadata) violated("metadata changed in a write/read round trip");
  if (g.tensors.size() != f.tensors.size()) violated("tensor count changed in a round trip");
  for (const auto& [name, t] : f.tensors) {
    const Tensor* u = g.find(name);
    if (!u || !same_bytes(t, *u)) violated("tensor '" + name + "' changed in a round trip");
  }
  return 0;
}
