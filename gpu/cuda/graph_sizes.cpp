#include "gpu/cuda/graph_sizes.h"

#include <algorithm>

namespace troupe::cu {

std::vector<int> graph_batch_sizes(int max_sequences) {
  std::vector<int> sizes;
  for (int s : {1, 2, 4})
    if (s <= max_sequences) sizes.push_back(s);
  for (int s = 8; s <= max_sequences; s += 8) sizes.push_back(s);
  if (max_sequences > 0 && sizes.back() != max_sequences) sizes.push_back(max_sequences);
  return sizes;
}

int padded_batch(const std::vector<int>& sizes, int n) {
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), n);
  return it == sizes.end() || n < 1 ? 0 : *it;
}

}  // namespace troupe::cu
