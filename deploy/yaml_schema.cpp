#include "deploy/yaml_schema.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include "util/utf8.h"

namespace troupe::schema {

namespace {

constexpr std::string_view kPositiveInt = "a positive integer";
constexpr std::string_view kNonNegativeInt = "a non-negative integer";
constexpr std::string_view kSeconds = "a number of seconds";
constexpr std::string_view kByteCount = "a byte count (e.g. 268435456 or 256MiB)";

std::string lower_snake(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = ch == '-' ? '_' : char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Optimal-string-alignment distance: Levenshtein plus adjacent
// transpositions, the commonest typo ("bf61" for "bf16").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate a typo most likely meant: close by edit distance (case and
// '-' vs '_' ignored), or one the word starts with ("listen_addr" ->
// "listen"). Far-off words get no suggestion: a wrong hint is worse than none.
std::optional<std::string_view> closest(std::string_view word,
                                        const std::vector<std::string_view>& candidates) {
  const std::string w = lower_snake(word);
  std::optional<std::string_view> best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    const std::string c = lower_snake(candidate);
    size_t d = edit_distance(w, c);
    const size_t limit = std::max<size_t>(1, std::min(w.size(), c.size()) / 3);
    if (d > limit && c.size() >= 3 && w.starts_with(c)) d = limit;
    if (d <= limit && d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

bool is_quoted(const Node& n) {
  return n.Tag() == "!";
}

bool looks_boolean(const std::string& s) {
  static const std::set<std::string> kWords{"true", "false", "yes", "no", "on", "off"};
  return kWords.count(lower_snake(s)) != 0;
}

}  // namespace

ConfigError key_error(const std::string& source, const std::string& key, const std::string& problem,
                      int line) {
  std::string message = source + ": ";
  if (!key.empty()) message += key + ": ";
  message += problem;
  if (line > 0) message += " (line " + std::to_string(line) + ")";
  return ConfigError(message, source, key);
}

void Origin::note_line(const std::string& key, const YAML::Mark& mark) {
  if (!mark.is_null()) lines_[key] = mark.line + 1;
}

void Origin::fail(const std::string& key, const std::string& problem) const {
  const auto it = lines_.find(key);
  throw key_error(source_, key, problem, it == lines_.end() ? 0 : it->second);
}

std::string join(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates) {
  const auto match = closest(word, candidates);
  return match ? "; did you mean '" + std::string(*match) + "'?" : "";
}

// How a value reads to the user, for "expected X, got Y".
std::string describe(const Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      break;
    default:
      return "nothing";
  }
  const std::string text = "'" + n.Scalar() + "'";
  if (is_quoted(n)) return "the string " + text;
  if (looks_boolean(n.Scalar())) return "the boolean " + text;
  return text;
}

[[noreturn]] void fail_expected(const Origin& o, const std::string& key, std::string_view expected,
                                const Node& got) {
  o.fail(key, "expected " + std::string(expected) + ", got " + describe(got));
}

std::string format_number(double value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

// ---------------------------------------------------------------------------
// Scalars

namespace {

const std::string& scalar_text(const Origin& o, const Node& n, const std::string& key,
                               std::string_view expected) {
  if (!n.IsScalar()) fail_expected(o, key, expected, n);
  return n.Scalar();
}

// yaml-cpp's reader passes bytes that are not UTF-8 through, and its emitter
// writes them back as U+FFFD: such a value would not survive to_yaml(), and
// YAML text is Unicode anyway.
std::string read_string(const Origin& o, const Node& n, const std::string& key) {
  const std::string& text = scalar_text(o, n, key, "a string");
  if (!valid_utf8(text)) o.fail(key, "expected UTF-8 text, got bytes that are not valid UTF-8");
  return text;
}

// For keys whose empty value means "the default", so `tokenizer:` may be blank.
std::string read_optional_string(const Origin& o, const Node& n, const std::string& key) {
  return n.IsNull() ? std::string() : read_string(o, n, key);
}

// A quoted "123" is rejected rather than converted: YAML says it is a string,
// and accepting it would make the schema's types mean nothing.
template <typename T>
T read_integer(const Origin& o, const Node& n, const std::string& key, std::string_view expected) {
  const std::string& text = scalar_text(o, n, key, expected);
  std::string_view digits = text;
  if (digits.size() > 1 && digits[0] == '+') digits.remove_prefix(1);
  T value{};
  const char* end = digits.data() + digits.size();
  const auto [stop, ec] = std::from_chars(digits.data(), end, value);
  if (is_quoted(n) || digits.empty() || ec == std::errc::invalid_argument || stop != end) {
    fail_expected(o, key, expected, n);
  }
  if (ec == std::errc::result_out_of_range) {
    o.fail(key,
           "expected " + std::string(expected) + ", got '" + text + "', which is out of range");
  }
  return value;
}

int read_int(const Origin& o, const Node& n, const std::string& key, std::string_view expected) {
  return read_integer<int>(o, n, key, expected);
}

double read_number(const Origin& o, const Node& n, const std::string& key,
                   std::string_view expected) {
  const std::string& text = scalar_text(o, n, key, expected);
  std::string_view digits = text;
  if (digits.size() > 1 && digits[0] == '+') digits.remove_prefix(1);
  double value = 0;
  const char* end = digits.data() + digits.size();
  const auto [stop, ec] = std::from_chars(digits.data(), end, value);
  if (is_quoted(n) || digits.empty() || ec != std::errc() || stop != end || !std::isfinite(value)) {
    fail_expected(o, key, expected, n);
  }
  return value;
}

double read_seconds(const Origin& o, const Node& n, const std::string& key) {
  return read_number(o, n, key, kSeconds);
}

// Byte sizes may carry a binary unit, since nobody wants to count the digits
// of 268435456.
int64_t read_bytes(const Origin& o, const Node& n, const std::string& key) {
  const std::string& text = scalar_text(o, n, key, kByteCount);
  static const std::map<std::string, int64_t, std::less<>> kUnits{{"", 1},
                                                                  {"B", 1},
                                                                  {"KiB", int64_t(1) << 10},
                                                                  {"MiB", int64_t(1) << 20},
                                                                  {"GiB", int64_t(1) << 30},
                                                                  {"TiB", int64_t(1) << 40}};
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string_view unit = std::string_view(text).substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  const auto scale = kUnits.find(unit);
  int64_t count = 0;
  const auto [stop, ec] = std::from_chars(text.data(), text.data() + digits, count);
  if (is_quoted(n) || digits == 0 || scale == kUnits.end() || ec == std::errc::invalid_argument) {
    fail_expected(o, key, kByteCount, n);
  }
  if (ec == std::errc::result_out_of_range ||
      count > std::numeric_limits<int64_t>::max() / scale->second) {
    o.fail(key, "expected " + std::string(kByteCount) + ", got '" + text + "', which is too large");
  }
  return count * scale->second;
}

}  // namespace

Kind<int> positive_int() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            return read_int(o, n, key, kPositiveInt);
          },
          [](const int& v) {
            return v < 1 ? "expected " + std::string(kPositiveInt) + ", got " + std::to_string(v)
                         : std::string();
          },
          [](YAML::Emitter& out, const int& v) { out << v; }};
}

Kind<int> optional_index() {
  Kind<int> k = non_negative_int();
  k.problem = [](const int& v) {
    return v >= -1 ? std::string() : "expected a non-negative integer, got " + std::to_string(v);
  };
  return k;
}

Kind<int> non_negative_int() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            return read_int(o, n, key, kNonNegativeInt);
          },
          [](const int& v) {
            return v < 0 ? "expected " + std::string(kNonNegativeInt) + ", got " + std::to_string(v)
                         : std::string();
          },
          [](YAML::Emitter& out, const int& v) { out << v; }};
}

Kind<int64_t> non_negative_int64() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            return read_integer<int64_t>(o, n, key, kPositiveInt);
          },
          [](const int64_t& v) {
            return v < 0 ? "expected " + std::string(kNonNegativeInt) + ", got " + std::to_string(v)
                         : std::string();
          },
          [](YAML::Emitter& out, const int64_t& v) { out << v; }};
}

Kind<uint64_t> unsigned_int() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            return read_integer<uint64_t>(o, n, key, kNonNegativeInt);
          },
          [](const uint64_t&) { return std::string(); },
          [](YAML::Emitter& out, const uint64_t& v) { out << v; }};
}

Kind<double> seconds(bool zero_ok) {
  return {read_seconds,
          [zero_ok](const double& v) {
            if (std::isfinite(v) && (v > 0 || (zero_ok && v == 0))) return std::string();
            return std::string("expected ") + (zero_ok ? "a non-negative" : "a positive") +
                   " number of seconds" + (zero_ok ? " (0: no limit)" : "") + ", got " +
                   format_number(v);
          },
          [](YAML::Emitter& out, const double& v) { out << format_number(v); }};
}

Kind<double> seconds_at_least(double min, std::string why) {
  return {read_seconds,
          [min, why](const double& v) {
            if (std::isfinite(v) && v >= min) return std::string();
            return "expected at least " + format_number(min) + " seconds (" + why + "), got " +
                   format_number(v);
          },
          [](YAML::Emitter& out, const double& v) { out << format_number(v); }};
}

Kind<double> non_negative_seconds(std::string zero_means) {
  return {read_seconds,
          [zero_means](const double& v) {
            if (std::isfinite(v) && v >= 0) return std::string();
            return "expected a non-negative number of seconds" +
                   (zero_means.empty() ? std::string() : " (0: " + zero_means + ")") + ", got " +
                   format_number(v);
          },
          [](YAML::Emitter& out, const double& v) { out << format_number(v); }};
}

Kind<double> number_in(double lo, double hi) {
  const std::string range = "a number in [" + format_number(lo) + ", " + format_number(hi) + "]";
  return {[range](const Origin& o, const Node& n, const std::string& key) {
            return read_number(o, n, key, range);
          },
          [lo, hi, range](const double& v) {
            return v >= lo && v <= hi ? std::string()
                                      : "expected " + range + ", got " + format_number(v);
          },
          [](YAML::Emitter& out, const double& v) { out << format_number(v); }};
}

Kind<int64_t> byte_count(bool positive) {
  return {read_bytes,
          [positive](const int64_t& v) {
            if (positive && v < 1)
              return "expected a positive byte count, got " + std::to_string(v);
            if (v < 0)
              return "expected " + std::string(kNonNegativeInt) + ", got " + std::to_string(v);
            return std::string();
          },
          [](YAML::Emitter& out, const int64_t& v) { out << v; }};
}

namespace {

// yaml-cpp writes such text as a plain scalar, which does not read back the
// same: a CR reads as a line break, edge spaces and tabs are trimmed.
// Double-quoted, every character is escaped or kept.
bool needs_double_quotes(std::string_view v) {
  const auto edge = [](char c) { return c == ' ' || c == '\t'; };
  if (!v.empty() && (edge(v.front()) || edge(v.back()))) return true;
  return std::any_of(v.begin(), v.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7F;
  });
}

void write_text(YAML::Emitter& out, const std::string& v) {
  if (needs_double_quotes(v)) out << YAML::DoubleQuoted;
  out << v;
}

}  // namespace

Kind<std::string> text() {
  return {read_string, [](const std::string&) { return std::string(); }, write_text};
}

Kind<std::string> non_empty_text() {
  Kind<std::string> k = text();
  k.problem = [](const std::string& v) { return v.empty() ? "must not be empty" : std::string(); };
  return k;
}

Kind<std::string> optional_text() {
  Kind<std::string> k = text();
  k.read = read_optional_string;
  return k;
}

Kind<bool> boolean() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            const std::string& t = scalar_text(o, n, key, "true or false");
            if (!is_quoted(n)) {
              if (t == "true" || t == "yes" || t == "on") return true;
              if (t == "false" || t == "no" || t == "off") return false;
            }
            fail_expected(o, key, "true or false", n);
          },
          [](const bool&) { return std::string(); },
          [](YAML::Emitter& out, const bool& v) { out << (v ? "true" : "false"); }};
}

Kind<std::vector<std::string>> text_list() {
  return {[](const Origin& o, const Node& n, const std::string& key) {
            if (!n.IsSequence()) fail_expected(o, key, "a list of strings such as [a, b]", n);
            std::vector<std::string> out;
            for (const Node& item : n)
              out.push_back(read_string(o, item, key + "[" + std::to_string(out.size()) + "]"));
            return out;
          },
          [](const std::vector<std::string>&) { return std::string(); },
          [](YAML::Emitter& out, const std::vector<std::string>& v) {
            out << YAML::Flow << YAML::BeginSeq;
            for (const auto& s : v) write_text(out, s);
            out << YAML::EndSeq;
          }};
}

// ---------------------------------------------------------------------------
// Documents and overrides

namespace {

std::string at(const YAML::Mark& mark) {
  return "line " + std::to_string(mark.line + 1) + ", column " + std::to_string(mark.column + 1);
}

// Sees where each document starts and nothing else.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> last;
  void OnDocumentStart(const YAML::Mark& mark) override { last = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Refuses a second document. Not YAML::LoadAll: in yaml-cpp 0.7 it loops
// forever, growing memory, on a stray ',' (jbeder/yaml-cpp#1040, fixed by
// #1319 in 2024), because the parser keeps reporting an empty document at
// the same place; here that shows as a document starting where the last did.
void check_single_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  if (!parser.HandleNextDocument(starts)) return;
  const YAML::Mark first = *starts.last;
  if (!parser.HandleNextDocument(starts)) return;
  const YAML::Mark second = *starts.last;
  if (second.pos == first.pos) {
    const size_t pos = size_t(std::max(first.pos, 0));
    const std::string token = pos < text.size() ? std::string(1, text[pos]) : "end of input";
    throw YAML::ParserException(first, "unexpected '" + token + "'");
  }
  throw YAML::ParserException(second, "expected one YAML document, but another starts here");
}

}  // namespace

Node load_document(const std::string& text, const std::string& source) {
  try {
    check_single_document(text);
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw key_error(source, "", "YAML syntax error at " + at(e.mark) + ": " + e.msg, 0);
  }
}

// Everything yaml-cpp might still throw while walking nodes becomes a
// ConfigError, so callers only ever see one exception type.
void guarded(const std::string& source, const std::function<void()>& body) {
  try {
    body();
  } catch (const YAML::Exception& e) {
    throw key_error(source, "", e.what(), 0);
  }
}

// "[host]:port", an IPv6 listen address, which would read as a flow list.
bool is_bracketed_host_port(const std::string& v) {
  const size_t close = v.find("]:");
  if (v.empty() || v.front() != '[' || close == std::string::npos || close + 2 == v.size())
    return false;
  for (size_t i = 1; i < close; ++i)
    if (!(std::isxdigit(static_cast<unsigned char>(v[i])) || v[i] == ':' || v[i] == '.'))
      return false;
  for (size_t i = close + 2; i < v.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(v[i]))) return false;
  return true;
}

// Flow syntax for sections and lists; anything else is taken verbatim, so a
// value such as "a #1" is not cut at a YAML comment (nor "[::1]:8080" read as
// a list).
Node override_value(const Origin& o, const std::string& key, const std::string& value) {
  if (value.empty() || (value.front() != '{' && value.front() != '[') ||
      is_bracketed_host_port(value))
    return Node(value);
  try {
    check_single_document(value);
    return YAML::Load(value);
  } catch (const YAML::ParserException& e) {
    o.fail(key, "YAML syntax error in the value at " + at(e.mark) + ": " + e.msg);
  }
}

std::vector<std::string> split_key(const Origin& o, const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty()) {
      o.fail(key, "not a key; expected a dotted path such as batching.max_batch_tokens");
    }
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// {a: {b: value}} for "a.b", so the override goes through the file's readers.
// Built by recursion rather than by reassigning one Node: yaml-cpp's Node
// assignment rebinds shared data, which makes loops of it easy to get wrong.
Node nest(const std::vector<std::string>& parts, size_t first, const Node& value) {
  if (first == parts.size()) return value;
  Node map(YAML::NodeType::Map);
  map[parts[first]] = nest(parts, first + 1, value);
  return map;
}

std::optional<ListKey> list_key(const std::string& key) {
  const size_t open = key.find('[');
  if (open == std::string::npos || open == 0) return std::nullopt;
  const size_t close = key.find(']', open);
  if (close == std::string::npos) return std::nullopt;
  const std::string_view digits = std::string_view(key).substr(open + 1, close - open - 1);
  size_t index = 0;
  const auto [stop, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || stop != digits.data() + digits.size())
    return std::nullopt;
  const std::string_view tail = std::string_view(key).substr(close + 1);
  if (!tail.empty() && tail.front() != '.') return std::nullopt;
  ListKey k;
  k.name = key.substr(0, open);
  k.index = index;
  k.entry = key.substr(0, close + 1);
  if (!tail.empty()) {
    k.rest = std::string(tail.substr(1));
    if (k.rest.empty()) return std::nullopt;  // "devices[0]." is not a key
  }
  return k;
}

}  // namespace troupe::schema
