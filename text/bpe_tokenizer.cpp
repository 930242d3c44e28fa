#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "text/added_tokens.h"
#include "text/bpe_merge.h"
#include "text/unicode.h"

namespace troupe {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern, what ByteLevel's use_regex splits with.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves,
// the others for U+0100 onwards, in order, so that every byte is a visible
// character in the vocabulary's spelling ("Ġ" is the space).
const std::vector<char32_t>& byte_to_char() {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> t(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

// A vocabulary spelling as the bytes it stands for; nullopt when it holds a
// character outside the byte alphabet (no byte sequence produces it).
std::optional<std::string> spelling_to_bytes(std::string_view spelling) {
  static const std::unordered_map<char32_t, char> inverse = [] {
    std::unordered_map<char32_t, char> m;
    const auto& t = byte_to_char();
    for (int b = 0; b < 256; ++b) m[t[size_t(b)]] = char(b);
    return m;
  }();
  std::string out;
  for (char32_t c : unicode::decode_utf8(spelling).points) {
    const auto it = inverse.find(c);
    if (it == inverse.end()) return std::nullopt;
    out += it->second;
  }
  return out;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior behavior_of(const std::string& s, const std::string& name) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  throw std::runtime_error("tokenizer: '" + name + "': unknown split behavior '" + s + "'");
}

// A piece of a pre-token: [begin, end) in bytes, and whether it matched.
struct Span {
  size_t begin, end;
  bool matched;
};

// The spans as the pieces a behavior keeps, folded as tokenizers'
// SplitDelimiterBehavior folds them: a match joins its neighbour only when
// that neighbour is no match itself.
void apply_behavior(std::string_view text, const std::vector<Span>& spans, Behavior behavior,
                    std::vector<std::string>& out) {
  const auto piece = [&](const Span& s) { return text.substr(s.begin, s.end - s.begin); };
  bool previous_match = false;
  if (behavior == Behavior::MergedWithNext) {  // folded from the end
    std::vector<std::string> backwards;
    for (size_t i = spans.size(); i-- > 0;) {
      if (spans[i].matched && !previous_match && !backwards.empty())
        backwards.back().insert(0, piece(spans[i]));
      else
        backwards.emplace_back(piece(spans[i]));
      previous_match = spans[i].matched;
    }
    out.insert(out.end(), std::make_move_iterator(backwards.rbegin()),
               std::make_move_iterator(backwards.rend()));
    return;
  }
  const size_t first = out.size();  // this text's pieces start here
  for (const Span& s : spans) {
    const bool has_last = out.size() > first;
    switch (behavior) {
      case Behavior::Removed:
        if (!s.matched) out.emplace_back(piece(s));
        break;
      case Behavior::Isolated:
        out.emplace_back(piece(s));
        break;
      case Behavior::Contiguous:
        if (s.matched == previous_match && has_last)
          out.back() += piece(s);
        else
          out.emplace_back(piece(s));
        break;
      case Behavior::MergedWithPrevious:
        if (s.matched && !previous_match && has_last)
          out.back() += piece(s);
        else
          out.emplace_back(piece(s));
        break;
      case Behavior::MergedWithNext:
        break;  // above
    }
    previous_match = s.matched;
  }
}

std::string str_or_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return {};
}

}  // namespace

struct BpeTokenizer::PreStep {
  enum class Kind { Split, Digits, ByteLevel };
  explicit PreStep(Kind k) : kind(k) {}
  Kind kind;
  std::optional<PretokenRegex> regex;  // Split by regex; ByteLevel with use_regex
  std::string literal;                 // Split by a string
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool individual_digits = false;
  bool add_prefix_space = false;

  // `pieces` split further by this step.
  void apply(std::vector<std::string>& pieces) const {
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (std::string& piece : pieces) {
      if (kind == Kind::ByteLevel) {
        if (add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
        if (!regex) {
          out.push_back(std::move(piece));
          continue;
        }
      }
      split(piece, out);
    }
    pieces = std::move(out);
  }

 private:
  void split(std::string_view text, std::vector<std::string>& out) const {
    std::vector<Span> spans;
    const auto add = [&](size_t b, size_t e, bool m) {
      if (e > b) spans.push_back({b, e, m != invert});
    };
    size_t last = 0;
    if (kind == Kind::Split && !regex) {
      for (size_t at = literal.empty() ? std::string_view::npos : text.find(literal);
           at != std::string_view::npos; at = text.find(literal, at + literal.size())) {
        add(last, at, false);
        add(at, at + literal.size(), true);
        last = at + literal.size();
      }
    } else {
      const unicode::CodePoints cps = unicode::decode_utf8(text);
      if (kind == Kind::Digits) {
        using G = unicode::GeneralCategory;
        for (size_t i = 0; i < cps.points.size(); ++i) {
          const auto cat = unicode::general_category(cps.points[i]);
          if (cat < G::Nd || cat > G::No) continue;
          add(last, cps.offsets[i], false);
          add(cps.offsets[i], cps.offsets[i + 1], true);
          last = cps.offsets[i + 1];
        }
      } else {
        for (size_t pos = 0; pos < cps.points.size();) {
          const auto m = regex->find(cps.points, pos);
          if (!m) break;
          if (m->end == m->begin) {  // an empty match splits nothing
            pos = m->begin + 1;
            continue;
          }
          add(last, cps.offsets[m->begin], false);
          add(cps.offsets[m->begin], cps.offsets[m->end], true);
          last = cps.offsets[m->end];
          pos = m->end;
        }
      }
    }
    add(last, text.size(), false);
    const Behavior b = kind == Kind::Digits && !individual_digits ? Behavior::Contiguous : behavior;
    apply_behavior(text, spans, b, out);
  }
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

namespace {

[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  throw std::runtime_error("tokenizer: '" + name + "': " + what);
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::parse(std::string_view text, const std::string& name,
                                                  std::string_view config_text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    refuse(name, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    refuse(name, "not a Hugging Face tokenizer.json (no \"model\" object)");
  const json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") refuse(name, "model type '" + type + "' is not supported (only BPE)");

  const auto null_or = [](const json& o, const char* key) {
    return !o.contains(key) || o[key].is_null();
  };
  if (!null_or(model, "dropout") && model["dropout"].get<double>() != 0.0)
    refuse(name, "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!null_or(model, key) && !model[key].get<std::string>().empty())
      refuse(name, std::string("BPE ") + key + " is not supported");

  // Byte-level: the pre-tokenizer and the decoder map bytes to the vocabulary's
  // alphabet and back. Anything else is SentencePiece-style (Metaspace,
  // byte_fallback), which this reader does not compute.
  auto t = std::make_unique<BpeTokenizer>();
  bool byte_level = false;
  std::function<void(const json&)> add_pre = [&](const json& p) {
    if (p.is_null()) return;
    const std::string kind = p.value("type", std::string());
    if (kind == "Sequence") {
      for (const json& s : p.at("pretokenizers")) add_pre(s);
    } else if (kind == "ByteLevel") {
      byte_level = true;
      PreStep step{PreStep::Kind::ByteLevel};
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) step.regex.emplace(kGpt2Pattern);
      t->pre_steps_.push_back(std::move(step));
    } else if (kind == "Split") {
      PreStep step{PreStep::Kind::Split};
      const json& pattern = p.at("pattern");
      if (pattern.contains("Regex")) {
        try {
          step.regex.emplace(pattern["Regex"].get<std::string>());
        } catch (const std::invalid_argument& e) {
          refuse(name, e.what());
        }
      } else {
        step.literal = pattern.at("String").get<std::string>();
      }
      step.behavior = behavior_of(p.value("behavior", std::string("Isolated")), name);
      step.invert = p.value("invert", false);
      t->pre_steps_.push_back(std::move(step));
    } else if (kind == "Digits") {
      PreStep step{PreStep::Kind::Digits};
      step.individual_digits = p.value("individual_digits", false);
      t->pre_steps_.push_back(std::move(step));
    } else {
      refuse(name,
             "pre-tokenizer '" + kind +
                 "' is not supported (only ByteLevel, Split, "
                 "Digits and Sequence; a SentencePiece-style tokenizer needs its tokenizer.model)");
    }
  };
  try {
    add_pre(j.value("pre_tokenizer", json()));
    std::function<void(const json&)> add_norm = [&](const json& n) {
      if (n.is_null()) return;
      const std::string kind = n.value("type", std::string("?"));
      if (kind == "Sequence") {
        for (const json& s : n.at("normalizers")) add_norm(s);
      } else if (kind == "NFC") {
        t->nfc_ = true;
      } else {
        refuse(name, "normalizer '" + kind + "' is not supported (only NFC)");
      }
    };
    add_norm(j.value("normalizer", json()));
    const json& dec = j.value("decoder", json());
    const std::string dec_type = dec.is_null() ? "none" : dec.value("type", std::string("?"));
    if (dec_type != "ByteLevel")
      refuse(name, "decoder '" + dec_type + "' is not supported (only ByteLevel)");
    if (!byte_level) refuse(name, "not a byte-level BPE (no ByteLevel pre-tokenizer)");
    if (model.value("byte_fallback", false)) refuse(name, "BPE byte_fallback is not supported");
    t->ignore_merges_ = model.value("ignore_merges", false);
    t->fuse_unk_ = model.value("fuse_unk", false);

    // The vocabulary, then the added tokens (ids may run past it).
    const json& vocab = model.at("vocab");
    int size = 0;
    for (const auto& [spelling, id] : vocab.items()) size = std::max(size, id.get<int>() + 1);
    const json& added = j.value("added_tokens", json::array());
    for (const json& a : added) size = std::max(size, a.at("id").get<int>() + 1);
    if (size <= 0) refuse(name, "the vocabulary is empty");
    if (size > (1 << 24)) refuse(name, "the vocabulary is too large");
    t->pieces_.assign(size_t(size), std::string());
    t->bytes_.assign(size_t(size), std::string());
    t->special_.assign(size_t(size), false);
    std::fill(std::begin(t->byte_token_), std::end(t->byte_token_), -1);
    std::unordered_map<std::string, int> by_spelling;
    for (const auto& [spelling, jid] : vocab.items()) {
      const int id = jid.get<int>();
      if (id < 0) refuse(name, "token '" + spelling + "' has a negative id");
      t->pieces_[size_t(id)] = spelling;
      by_spelling[spelling] = id;
      if (auto b = spelling_to_bytes(spelling)) {
        if (b->size() == 1) t->byte_token_[uint8_t((*b)[0])] = id;
        t->by_bytes_.emplace(*b, id);
        t->bytes_[size_t(id)] = std::move(*b);
      } else {
        t->bytes_[size_t(id)] = spelling;
      }
    }
    for (const json& a : added) {
      const int id = a.at("id").get<int>();
      if (id < 0) refuse(name, "an added token has a negative id");
      AddedToken token = added_token_from_json(a, id);
      t->pieces_[size_t(id)] = token.token.spelling;
      t->bytes_[size_t(id)] = token.token.spelling;
      t->special_[size_t(id)] = token.special;
      t->added_.add(std::move(token.token));
    }

    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const auto it = by_spelling.find(model["unk_token"].get<std::string>());
      if (it == by_spelling.end())
        refuse(name, "the unknown token '" + model["unk_token"].get<std::string>() +
                         "' is not in the vocabulary");
      t->unk_ = it->second;
    }

    // Merges: "a b" strings (older files) or ["a", "b"] pairs; rank = order.
    const json& merges = model.value("merges", json::array());
    int rank = 0;
    for (const json& m : merges) {
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) refuse(name, "merge '" + s + "' is not two tokens");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        left = m.at(0).get<std::string>();
        right = m.at(1).get<std::string>();
      }
      const auto l = by_spelling.find(left), r = by_spelling.find(right),
                 merged = by_spelling.find(left + right);
      if (l == by_spelling.end() || r == by_spelling.end() || merged == by_spelling.end())
        refuse(name, "merge '" + left + " " + right + "' names a token not in the vocabulary");
      const uint64_t key = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(r->second);
      t->merges_.emplace(key, Merge{rank++, merged->second});
    }

    // The post-processor's special tokens around a single sequence.
    std::function<void(const json&)> add_post = [&](const json& p) {
      if (p.is_null()) return;
      const std::string kind = p.value("type", std::string());
      if (kind == "Sequence") {
        for (const json& s : p.at("processors")) add_post(s);
      } else if (kind == "TemplateProcessing") {
        const json& specials = p.value("special_tokens", json::object());
        bool after = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          const std::string sname = item.at("SpecialToken").at("id").get<std::string>();
          if (!specials.contains(sname))
            refuse(name, "the post-processor's token '" + sname + "' is not defined");
          for (const json& id : specials[sname].at("ids"))
            (after ? t->suffix_ : t->prefix_).push_back(id.get<int>());
        }
      } else if (kind == "BertProcessing" || kind == "RobertaProcessing") {
        t->prefix_.push_back(p.at("cls").at(1).get<int>());
        t->suffix_.push_back(p.at("sep").at(1).get<int>());
      } else if (kind != "ByteLevel") {
        refuse(name, "post-processor '" + kind + "' is not supported");
      }
    };
    add_post(j.value("post_processor", json()));
    for (const std::vector<int>* added : {&t->prefix_, &t->suffix_})
      for (int id : *added)
        if (id < 0 || id >= size) refuse(name, "the post-processor's token id is out of range");

    if (!config_text.empty()) {
      const json config = json::parse(config_text, nullptr, false);
      if (config.is_object() && config.contains("eos_token")) {
        const std::string eos = str_or_content(config["eos_token"]);
        if (const auto it = std::find(t->pieces_.begin(), t->pieces_.end(), eos);
            !eos.empty() && it != t->pieces_.end())
          t->eos_ = int(it - t->pieces_.begin());
      }
    }
  } catch (const json::exception& e) {
    refuse(name, std::string("malformed tokenizer.json: ") + e.what());
  }
  return t;
}

void BpeTokenizer::pre_tokenize(std::string_view text, std::vector<std::string>& pieces) const {
  pieces.assign(1, std::string(text));
  for (const PreStep& step : pre_steps_) step.apply(pieces);
}

void BpeTokenizer::bpe(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_ || word.size() == 1) {
    if (const auto it = by_bytes_.find(std::string(word)); it != by_bytes_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // One symbol per byte; a byte the vocabulary cannot spell is its unknown
  // token, or where it has none, left out: what the tokenizers library does
  // (SmolLM2's vocabulary lacks a few bytes). Then the pair of lowest rank
  // merges first, as tokenizers does.
  std::vector<int> sym;
  sym.reserve(word.size());
  for (const char ch : word) {
    int id = byte_token_[uint8_t(ch)];
    if (id < 0) {
      if (unk_ < 0 || (fuse_unk_ && !sym.empty() && sym.back() == unk_)) continue;
      id = unk_;
    }
    sym.push_back(id);
  }
  merge_pairs(sym, [&](int l, int r) -> std::optional<PairMerge> {
    const auto it = merges_.find((uint64_t(uint32_t(l)) << 32) | uint32_t(r));
    if (it == merges_.end()) return std::nullopt;
    return PairMerge{double(it->second.rank), it->second.id};
  });
  ids.insert(ids.end(), sym.begin(), sym.end());
}

std::vector<std::string> BpeTokenizer::pre_tokenize_str(std::string_view text) const {
  std::vector<std::string> pieces;
  if (nfc_)
    pre_tokenize(unicode::nfc(text), pieces);
  else
    pre_tokenize(text, pieces);
  return pieces;
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int>& ids) const {
  for (const std::string& p : pre_tokenize_str(text)) bpe(p, ids);
}

std::vector<int> BpeTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int> ids;
  if (add_special) ids = prefix_;
  added_.split(
      text, [&](std::string_view plain) { encode_ordinary(plain, ids); },
      [&](int id) { ids.push_back(id); });
  if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

}  // namespace troupe
