#include "grammar/matcher.h"

#include <algorithm>

#include "grammar/utf8.h"

namespace troupe::grammar {

namespace {

void dedupe(std::vector<std::vector<int32_t>>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

}  // namespace

std::shared_ptr<const MaskCache::Mask> MaskCache::find(
    const std::vector<std::vector<int32_t>>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(state);
  return it == map_.end() ? nullptr : it->second;
}

void MaskCache::put(const std::vector<std::vector<int32_t>>& state,
                    std::shared_ptr<const Mask> allowed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.count(state) || max_ == 0) return;
  if (order_.size() >= max_) {
    map_.erase(order_.front());
    order_.erase(order_.begin());
  }
  map_.emplace(state, std::move(allowed));
  order_.push_back(state);
}

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<MaskCache> cache)
    : grammar_(std::move(grammar)), cache_(std::move(cache)) {
  const Grammar& g = *grammar_;
  for (int32_t alt : g.alternatives(g.root())) {
    Stack s;
    if (g.elements()[size_t(alt)].kind != Grammar::Kind::End) s.push_back(alt);
    expand(std::move(s), stacks_, 0);
  }
  dedupe(stacks_);
}

// Replaces rule references on top by each of their alternatives until every
// stack has a character set on top (or is empty: root matched). The grammar
// has no left recursion, so this ends; the depth bound is a second guard.
void Matcher::expand(Stack stack, Stacks& out, int depth) const {
  const auto& el = grammar_->elements();
  if (depth > 4096) throw GrammarError("grammar: rules nest too deeply to follow");
  if (stack.empty() || el[size_t(stack.back())].kind == Grammar::Kind::Chars) {
    if (out.size() >= kMaxStacks)
      throw GrammarError("grammar: too ambiguous (more than " + std::to_string(kMaxStacks) +
                         " readings of the text at once)");
    out.push_back(std::move(stack));
    return;
  }
  const int32_t pos = stack.back();
  stack.pop_back();
  if (el[size_t(pos) + 1].kind != Grammar::Kind::End) stack.push_back(pos + 1);
  const auto& alts = grammar_->alternatives(el[size_t(pos)].arg);
  for (size_t i = 0; i < alts.size(); ++i) {
    Stack next = (i + 1 == alts.size()) ? std::move(stack) : stack;
    if (el[size_t(alts[i])].kind != Grammar::Kind::End) next.push_back(alts[i]);
    expand(std::move(next), out, depth + 1);
  }
}

Matcher::Stacks Matcher::advance(const Stacks& from, uint32_t cp) const {
  const auto& el = grammar_->elements();
  Stacks out;
  for (const Stack& s : from) {
    if (s.empty()) continue;
    const int32_t pos = s.back();
    if (!grammar_->chars(el[size_t(pos)].arg).contains(cp)) continue;
    Stack next(s.begin(), s.end() - 1);
    if (el[size_t(pos) + 1].kind != Grammar::Kind::End) next.push_back(pos + 1);
    expand(std::move(next), out, 0);
  }
  if (out.size() > 1) dedupe(out);
  return out;
}

bool Matcher::takes_prefix(const Stacks& stacks, std::string_view prefix) const {
  uint32_t lo = 0, hi = 0;
  if (!utf8_prefix_range(prefix, &lo, &hi)) return false;
  const auto& el = grammar_->elements();
  for (const Stack& s : stacks)
    if (!s.empty() && grammar_->chars(el[size_t(s.back())].arg).intersects(lo, hi)) return true;
  return false;
}

bool Matcher::step(const Stacks& from, const std::string& pending, std::string_view bytes,
                   Stacks* to, std::string* pending_out) const {
  std::string joined;
  std::string_view text = bytes;
  if (!pending.empty()) {
    joined = pending;
    joined.append(bytes);
    text = joined;
  }
  Stacks cur = from;
  size_t at = 0;
  while (at < text.size()) {
    size_t len = 0;
    const uint32_t cp = decode_utf8(text.substr(at), &len);
    if (len == 0) {
      // The rest may be the start of a code point the next token finishes.
      const std::string_view rest = text.substr(at);
      if (!takes_prefix(cur, rest)) return false;
      *to = std::move(cur);
      *pending_out = std::string(rest);
      return true;
    }
    cur = advance(cur, cp);
    if (cur.empty()) return false;
    at += len;
  }
  *to = std::move(cur);
  pending_out->clear();
  return true;
}

bool Matcher::accept(std::string_view bytes) {
  Stacks next;
  std::string pending;
  if (!step(stacks_, pending_, bytes, &next, &pending)) return false;
  stacks_ = std::move(next);
  pending_ = std::move(pending);
  return true;
}

bool Matcher::allows(std::string_view bytes) const {
  if (bytes.empty()) return false;
  Stacks next;
  std::string pending;
  return step(stacks_, pending_, bytes, &next, &pending);
}

bool Matcher::is_complete() const {
  if (!pending_.empty()) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool Matcher::can_continue() const {
  for (const Stack& s : stacks_)
    if (!s.empty()) return true;
  return false;
}

// The states met during one walk, each with the character sets its readings
// take next; where a code point leads depends only on which of those sets
// hold it, so each (state, sets that hold it) is advanced once.
struct Matcher::Walk {
  struct State {
    Stacks stacks;
    std::vector<const CharSet*> tops;
    std::vector<std::pair<uint64_t, int>> next;  // (mask, state or -1), a few
  };
  std::vector<State> states;
  std::map<Stacks, int> ids;

  int intern(Stacks stacks, const Grammar& g) {
    auto it = ids.find(stacks);
    if (it != ids.end()) return it->second;
    State st;
    for (const Stack& s : stacks)
      if (!s.empty()) st.tops.push_back(&g.chars(g.elements()[size_t(s.back())].arg));
    st.stacks = stacks;
    const int id = int(states.size());
    states.push_back(std::move(st));
    ids.emplace(std::move(stacks), id);
    return id;
  }
};

void Matcher::walk(const TokenVocabulary& vocab, int node, int set, Walk& w,
                   std::vector<uint8_t>& allowed) const {
  const TokenVocabulary::Node& n = vocab.nodes()[size_t(node)];
  for (uint32_t p = n.partial_begin; p < n.partial_end; ++p) {
    const auto& [rest, id] = vocab.partials()[p];
    if (takes_prefix(w.states[size_t(set)].stacks, rest)) allowed[size_t(id)] = 1;
  }
  for (uint32_t e = n.edges_begin; e < n.edges_end; ++e) {
    const uint32_t cp = vocab.edges()[e].cp;
    const int32_t child = vocab.edges()[e].node;
    const auto& tops = w.states[size_t(set)].tops;
    uint64_t mask = 0;
    bool any = false;
    for (size_t j = 0; j < tops.size(); ++j)
      if (tops[j]->contains(cp)) {
        any = true;
        if (j < 64) mask |= uint64_t(1) << j;
      }
    if (!any) continue;
    int next = -2;
    if (tops.size() <= 64) {
      for (const auto& [m, to] : w.states[size_t(set)].next)
        if (m == mask) {
          next = to;
          break;
        }
      if (next == -2) {
        Stacks after = advance(w.states[size_t(set)].stacks, cp);
        next = after.empty() ? -1 : w.intern(std::move(after), *grammar_);
        w.states[size_t(set)].next.emplace_back(mask, next);  // (intern may move states)
      }
    } else {
      Stacks after = advance(w.states[size_t(set)].stacks, cp);
      next = after.empty() ? -1 : w.intern(std::move(after), *grammar_);
    }
    if (next < 0) continue;
    const TokenVocabulary::Node& c = vocab.nodes()[size_t(child)];
    for (uint32_t i = c.ids_begin; i < c.ids_end; ++i) allowed[size_t(vocab.ids()[i])] = 1;
    walk(vocab, child, next, w, allowed);
  }
}

void Matcher::allowed_tokens(const TokenVocabulary& vocab, std::vector<uint8_t>& allowed) const {
  if (!pending_.empty()) {
    // After half a code point only a token that starts with continuation
    // bytes can go on, and those are the vocabulary's loose ones (not UTF-8
    // on their own): checked one by one.
    allowed.assign(size_t(vocab.size()), 0);
    for (int32_t id : vocab.loose())
      if (allows(vocab.bytes(id))) allowed[size_t(id)] = 1;
    return;
  }
  if (cache_) {
    if (auto hit = cache_->find(stacks_); hit && hit->tokens == size_t(vocab.size())) {
      allowed.resize(hit->tokens);
      for (size_t id = 0; id < hit->tokens; ++id)
        allowed[id] = (hit->bits[id / 64] >> (id % 64)) & 1;
      return;
    }
  }
  allowed.assign(size_t(vocab.size()), 0);
  Walk w;
  walk(vocab, 0, w.intern(stacks_, *grammar_), w, allowed);
  if (cache_) {
    auto mask = std::make_shared<MaskCache::Mask>();
    mask->tokens = allowed.size();
    mask->bits.assign((allowed.size() + 63) / 64, 0);
    for (size_t id = 0; id < allowed.size(); ++id)
      if (allowed[id]) mask->bits[id / 64] |= uint64_t(1) << (id % 64);
    cache_->put(stacks_, std::move(mask));
  }
}

std::string grammar_problem(std::string_view gbnf) {
  try {
    Matcher(std::make_shared<const Grammar>(Grammar::parse(gbnf)));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return {};
}

}  // namespace troupe::grammar
