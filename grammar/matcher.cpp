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

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
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

void Matcher::walk(const TokenVocabulary& vocab, int node, const Stacks& stacks,
                   std::vector<uint8_t>& allowed) const {
  const TokenVocabulary::Node& n = vocab.trie()[size_t(node)];
  for (const auto& [rest, id] : n.partial)
    if (takes_prefix(stacks, rest)) allowed[size_t(id)] = 1;
  const auto& el = grammar_->elements();
  for (const auto& [cp, child] : n.children) {
    // Cheap test first: does any reading take cp at all?
    bool any = false;
    for (const Stack& s : stacks)
      if (!s.empty() && grammar_->chars(el[size_t(s.back())].arg).contains(cp)) {
        any = true;
        break;
      }
    if (!any) continue;
    const Stacks next = advance(stacks, cp);
    if (next.empty()) continue;
    for (int32_t id : vocab.trie()[size_t(child)].ids) allowed[size_t(id)] = 1;
    walk(vocab, child, next, allowed);
  }
}

void Matcher::allowed_tokens(const TokenVocabulary& vocab, std::vector<uint8_t>& allowed) const {
  allowed.assign(size_t(vocab.size()), 0);
  if (!pending_.empty()) {
    // After half a code point, every token's bytes go on from those: check
    // them one by one (rare: a character split across tokens).
    for (int id = 0; id < vocab.size(); ++id)
      if (!vocab.is_control(id) && allows(vocab.bytes(id))) allowed[size_t(id)] = 1;
    return;
  }
  walk(vocab, 0, stacks_, allowed);
}

}  // namespace troupe::grammar
