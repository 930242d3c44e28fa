// Writes the seeds of the wire_messages fuzz target: real messages between
// a coordinator and its nodes (wire_samples.h), serialized by CAF, as
// DIR/seed-NAME; the seed-* files already there are replaced. scripts/fuzz.sh
// runs it before fuzzing wire_messages, so the seeds follow the wire types.
//
//   wire_seeds tests/fuzz/corpus/wire_messages
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "wire_samples.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_seeds DIR\n");
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path dir = argv[1];
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("seed-", 0) == 0) fs::remove(e.path());
  const auto samples = troupe::fuzz::wire_samples();
  for (const auto& s : samples) {
    std::ofstream f(dir / ("seed-" + s.name), std::ios::binary);
    f.write(s.bytes.data(), std::streamsize(s.bytes.size()));
    if (!f) {
      std::fprintf(stderr, "wire_seeds: cannot write %s\n", (dir / s.name).c_str());
      return 1;
    }
  }
  std::printf("wire_seeds: %zu seeds in %s\n", samples.size(), dir.c_str());
  return 0;
}
