#pragma once
// Which batch sizes get a captured decode graph, and how a step is padded to
// one. A graph replays fixed launch shapes, so a decode step of n sequences
// runs the graph of the smallest captured size >= n with inert padding
// items (vLLM captures 1, 2, 4 and multiples of 8 the same way).
#include <vector>

namespace troupe::cu {

// 1, 2, 4, 8, 16, 24, ... up to max_sequences (itself included when it is
// not a multiple of 8). Empty when max_sequences < 1.
std::vector<int> graph_batch_sizes(int max_sequences);

// The smallest size in `sizes` (ascending) that holds n sequences, or 0 when
// none does (the step runs eagerly).
int padded_batch(const std::vector<int>& sizes, int n);

}  // namespace troupe::cu
