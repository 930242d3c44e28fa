#pragma once
// The merge loop both BPE readers share (a tokenizer.json's and llama2.c's):
// adjacent symbols join, the best pair first and the leftmost among equals,
// until no pair joins. A heap of candidate pairs over a linked list, so a
// long word costs n log n, not the n^2 of rescanning it after every merge.
#include <cstddef>
#include <functional>
#include <optional>
#include <queue>
#include <vector>

namespace troupe {

struct PairMerge {
  double priority;  // lower merges first
  int id;           // the symbol the pair becomes
};

// `ids` merged in place; `merge(left, right)` says whether and how a pair
// joins (std::optional<PairMerge>).
template <class MergeOf>
void merge_pairs(std::vector<int>& ids, const MergeOf& merge) {
  if (ids.size() < 2) return;
  struct Symbol {
    int id, prev, next;
  };
  std::vector<Symbol> sym(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    sym[i] = {ids[i], int(i) - 1, i + 1 < ids.size() ? int(i) + 1 : -1};
  struct Candidate {
    double priority;
    int pos, left, right, id;
    bool operator>(const Candidate& o) const {
      return priority != o.priority ? priority > o.priority : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int pos) {
    if (pos < 0 || sym[size_t(pos)].next < 0) return;
    const int l = sym[size_t(pos)].id, r = sym[size_t(sym[size_t(pos)].next)].id;
    if (const std::optional<PairMerge> m = merge(l, r)) queue.push({m->priority, pos, l, r, m->id});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) consider(int(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& s = sym[size_t(c.pos)];
    // Stale: one of the pair merged with something else since.
    if (s.id != c.left || s.next < 0 || sym[size_t(s.next)].id != c.right) continue;
    const int gone_at = s.next;
    const int after = sym[size_t(gone_at)].next;
    sym[size_t(gone_at)].id = -1;  // its candidates are stale now
    s.id = c.id;
    s.next = after;
    if (after >= 0) sym[size_t(after)].prev = c.pos;
    consider(s.prev);
    consider(c.pos);
  }
  size_t n = 0;
  for (int i = 0; i >= 0; i = sym[size_t(i)].next) ids[n++] = sym[size_t(i)].id;
  ids.resize(n);
}

}  // namespace troupe
