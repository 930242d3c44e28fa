#include "deploy/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "gpu/model.h"
#include "scheduler/routing_policy.h"

namespace troupe {
namespace {

using YAML::Node;

// A layout beyond this is a typo (an extra zero), not a deployment.
constexpr int64_t kMaxDevices = 4096;

constexpr std::string_view kPositiveInt = "a positive integer";
constexpr std::string_view kNonNegativeInt = "a non-negative integer";
constexpr std::string_view kSeconds = "a number of seconds";
constexpr std::string_view kByteCount = "a byte count (e.g. 268435456 or 256MiB)";

// ---------------------------------------------------------------------------
// Error messages

ConfigError key_error(const std::string& source, const std::string& key, const std::string& problem,
                      int line) {
  std::string message = source + ": ";
  if (!key.empty()) message += key + ": ";
  message += problem;
  if (line > 0) message += " (line " + std::to_string(line) + ")";
  return ConfigError(message, source, key);
}

// Where values come from: the name that errors start with and, for a file,
// the line of each key, so that checks running after the parse (ranges,
// keys that constrain each other) can still point at the line.
class Origin {
 public:
  explicit Origin(std::string source) : source_(std::move(source)) {}

  void note_line(const std::string& key, const YAML::Mark& mark) {
    if (!mark.is_null()) lines_[key] = mark.line + 1;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    const auto it = lines_.find(key);
    throw key_error(source_, key, problem, it == lines_.end() ? 0 : it->second);
  }

 private:
  std::string source_;
  std::map<std::string, int> lines_;
};

std::string join(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

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

std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates) {
  const auto match = closest(word, candidates);
  return match ? "; did you mean '" + std::string(*match) + "'?" : "";
}

bool is_quoted(const Node& n) {
  return n.Tag() == "!";
}

bool looks_boolean(const std::string& s) {
  static const std::set<std::string> kWords{"true", "false", "yes", "no", "on", "off"};
  return kWords.count(lower_snake(s)) != 0;
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

// ---------------------------------------------------------------------------
// Scalars

const std::string& scalar_text(const Origin& o, const Node& n, const std::string& key,
                               std::string_view expected) {
  if (!n.IsScalar()) fail_expected(o, key, expected, n);
  return n.Scalar();
}

std::string read_string(const Origin& o, const Node& n, const std::string& key) {
  return scalar_text(o, n, key, "a string");
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

double read_seconds(const Origin& o, const Node& n, const std::string& key) {
  const std::string& text = scalar_text(o, n, key, kSeconds);
  std::string_view digits = text;
  if (digits.size() > 1 && digits[0] == '+') digits.remove_prefix(1);
  double value = 0;
  const char* end = digits.data() + digits.size();
  const auto [stop, ec] = std::from_chars(digits.data(), end, value);
  if (is_quoted(n) || digits.empty() || ec != std::errc() || stop != end || !std::isfinite(value)) {
    fail_expected(o, key, kSeconds, n);
  }
  return value;
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

template <typename E>
struct Named {
  std::string_view name;
  E value;
};

template <typename E, size_t N>
std::vector<std::string_view> names_of(const std::array<Named<E>, N>& table) {
  std::vector<std::string_view> names;
  for (const auto& entry : table) names.push_back(entry.name);
  return names;
}

template <typename E, size_t N>
E read_enum(const Origin& o, const Node& n, const std::string& key,
            const std::array<Named<E>, N>& table) {
  const std::string expected = "one of " + join(names_of(table));
  const std::string& text = scalar_text(o, n, key, expected);
  for (const auto& entry : table) {
    if (entry.name == text) return entry.value;
  }
  o.fail(key, "expected " + expected + ", got " + describe(n) + suggestion(text, names_of(table)));
}

template <typename E, size_t N>
std::string_view name_in(const std::array<Named<E>, N>& table, E value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

constexpr std::array<Named<DeviceKind>, 3> kDeviceKinds{
    {{"cpu", DeviceKind::Cpu}, {"cuda", DeviceKind::Cuda}, {"auto", DeviceKind::Auto}}};
constexpr std::array<Named<TimeoutAction>, 2> kTimeoutActions{
    {{"reject", TimeoutAction::Reject}, {"keep", TimeoutAction::Keep}}};
constexpr std::array<Named<spdlog::level::level_enum>, 7> kLogLevels{
    {{"trace", spdlog::level::trace},
     {"debug", spdlog::level::debug},
     {"info", spdlog::level::info},
     {"warn", spdlog::level::warn},
     {"error", spdlog::level::err},
     {"critical", spdlog::level::critical},
     {"off", spdlog::level::off}}};

DType read_dtype(const Origin& o, const Node& n, const std::string& key) {
  static const std::vector<std::string_view> kNames{"f32", "bf16", "f16"};
  const std::string expected = "one of " + join(kNames);
  const std::string& text = scalar_text(o, n, key, expected);
  if (const auto dtype = parse_dtype(text)) return *dtype;
  o.fail(key, "expected " + expected + ", got " + describe(n) + suggestion(text, kNames));
}

// ---------------------------------------------------------------------------
// Maps

struct Field {
  std::string_view key;
  std::function<void(const Node& value, const std::string& key_path)> read;
};

std::string child_key(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

// Reads the keys of `map` through `fields`; keys not present keep their
// current values, which is what makes every key optional and lets overrides
// reuse the same readers.
void read_fields(Origin& o, const Node& map, const std::string& path,
                 const std::vector<Field>& fields) {
  if (map.IsNull()) return;  // "batching:" with nothing under it: all defaults
  std::vector<std::string_view> known;
  for (const Field& f : fields) known.push_back(f.key);
  if (!map.IsMap()) fail_expected(o, path, "a map (keys: " + join(known) + ")", map);
  std::set<std::string> seen;
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) o.fail(path, "expected key names, got " + describe(entry.first));
    const std::string& name = entry.first.Scalar();
    const std::string key = child_key(path, name);
    o.note_line(key, entry.first.Mark());
    if (!seen.insert(name).second) o.fail(key, "duplicate key");
    const auto field =
        std::find_if(fields.begin(), fields.end(), [&](const Field& f) { return f.key == name; });
    if (field == fields.end()) {
      const std::string hint = suggestion(name, known);
      o.fail(key, "unknown key" + (hint.empty() ? "; known keys: " + join(known) : hint));
    }
    field->read(entry.second, key);
  }
}

void read_model(Origin& o, const Node& n, const std::string& path, ModelSection& m) {
  read_fields(
      o, n, path,
      {{"path", [&](const Node& v, const std::string& k) { m.path = read_string(o, v, k); }},
       {"tokenizer",
        [&](const Node& v, const std::string& k) { m.tokenizer = read_optional_string(o, v, k); }},
       {"dtype", [&](const Node& v, const std::string& k) { m.dtype = read_dtype(o, v, k); }},
       {"name",
        [&](const Node& v, const std::string& k) { m.name = read_optional_string(o, v, k); }}});
}

void read_server(Origin& o, const Node& n, const std::string& path, ServerSection& s) {
  read_fields(
      o, n, path,
      {{"listen", [&](const Node& v, const std::string& k) { s.listen = read_string(o, v, k); }},
       {"max_body_bytes",
        [&](const Node& v, const std::string& k) { s.max_body_bytes = read_bytes(o, v, k); }},
       {"request_timeout_s",
        [&](const Node& v, const std::string& k) { s.request_timeout_s = read_seconds(o, v, k); }},
       {"max_tokens_limit",
        [&](const Node& v, const std::string& k) {
          s.max_tokens_limit = read_int(o, v, k, kPositiveInt);
        }},
       {"io_threads", [&](const Node& v, const std::string& k) {
          s.io_threads = read_int(o, v, k, kPositiveInt);
        }}});
}

void read_parallel(Origin& o, const Node& n, const std::string& path, ParallelLayout& p) {
  auto count = [&](int& out) {
    return
        [&o, &out](const Node& v, const std::string& k) { out = read_int(o, v, k, kPositiveInt); };
  };
  read_fields(o, n, path,
              {{"replicas", count(p.replicas)},
               {"pipeline", count(p.pipeline)},
               {"tensor", count(p.tensor)}});
}

void read_device(Origin& o, const Node& n, const std::string& path, DeviceSpec& d) {
  if (n.IsNull()) fail_expected(o, path, "a device such as {kind: cpu, threads: 2}", n);
  read_fields(
      o, n, path,
      {{"kind",
        [&](const Node& v, const std::string& k) { d.kind = read_enum(o, v, k, kDeviceKinds); }},
       {"threads",
        [&](const Node& v, const std::string& k) { d.threads = read_int(o, v, k, kPositiveInt); }},
       {"memory",
        [&](const Node& v, const std::string& k) { d.memory_bytes = read_bytes(o, v, k); }}});
}

// A list in the file replaces the whole list: entries are positional, so
// merging two lists entry by entry would be a guess.
void read_devices(Origin& o, const Node& n, const std::string& key, std::vector<DeviceSpec>& out) {
  if (!n.IsSequence())
    fail_expected(o, key, "a list of devices such as [{kind: cpu, threads: 2}]", n);
  std::vector<DeviceSpec> devices;
  for (const Node& item : n) {
    const std::string item_key = key + "[" + std::to_string(devices.size()) + "]";
    o.note_line(item_key, item.Mark());
    read_device(o, item, item_key, devices.emplace_back());
  }
  out = std::move(devices);
}

void read_batching(Origin& o, const Node& n, const std::string& path, BatchingSection& b) {
  auto count = [&](int& out) {
    return
        [&o, &out](const Node& v, const std::string& k) { out = read_int(o, v, k, kPositiveInt); };
  };
  read_fields(o, n, path,
              {{"max_batch_sequences", count(b.max_batch_sequences)},
               {"max_batch_tokens", count(b.max_batch_tokens)},
               {"prefill_chunk_tokens", count(b.prefill_chunk_tokens)},
               {"max_waiting", [&](const Node& v, const std::string& k) {
                  b.max_waiting = read_int(o, v, k, kNonNegativeInt);
                }}});
}

// The sizing given here replaces any earlier one (the defaults, or the file
// when this is an override), so only giving both in one place is an error.
void read_kv_cache(Origin& o, const Node& n, const std::string& path, KvCacheSection& kv) {
  bool blocks_given = false;
  bool bytes_given = false;
  read_fields(o, n, path,
              {{"block_tokens",
                [&](const Node& v, const std::string& k) {
                  kv.block_tokens = read_int(o, v, k, kPositiveInt);
                }},
               {"blocks",
                [&](const Node& v, const std::string& k) {
                  kv.blocks = read_integer<int64_t>(o, v, k, kPositiveInt);
                  blocks_given = true;
                }},
               {"bytes", [&](const Node& v, const std::string& k) {
                  kv.bytes = read_bytes(o, v, k);
                  bytes_given = true;
                }}});
  if (blocks_given && bytes_given) {
    o.fail(path,
           "blocks and bytes are both set; give one of them (with bytes, the block count "
           "follows from the model's KV size per token)");
  }
  if (bytes_given) kv.blocks = 0;
  if (blocks_given) kv.bytes = 0;
}

void read_routing(Origin& o, const Node& n, const std::string& path, RoutingSection& r) {
  read_fields(
      o, n, path,
      {{"policy", [&](const Node& v, const std::string& k) { r.policy = read_string(o, v, k); }},
       {"seed", [&](const Node& v, const std::string& k) {
          r.seed = read_integer<uint64_t>(o, v, k, kNonNegativeInt);
        }}});
}

void read_admission(Origin& o, const Node& n, const std::string& path, AdmissionSection& a) {
  read_fields(
      o, n, path,
      {{"max_queue", [&](const Node& v,
                         const std::string& k) { a.max_queue = read_int(o, v, k, kPositiveInt); }},
       {"priority_levels",
        [&](const Node& v, const std::string& k) {
          a.priority_levels = read_int(o, v, k, kPositiveInt);
        }},
       {"queue_timeout_s",
        [&](const Node& v, const std::string& k) { a.queue_timeout_s = read_seconds(o, v, k); }},
       {"on_timeout", [&](const Node& v, const std::string& k) {
          a.on_timeout = read_enum(o, v, k, kTimeoutActions);
        }}});
}

void read_supervision(Origin& o, const Node& n, const std::string& path, SupervisionSection& s) {
  read_fields(o, n, path,
              {{"max_restarts",
                [&](const Node& v, const std::string& k) {
                  s.max_restarts = read_int(o, v, k, kNonNegativeInt);
                }},
               {"within_s",
                [&](const Node& v, const std::string& k) { s.within_s = read_seconds(o, v, k); }}});
}

void read_logging(Origin& o, const Node& n, const std::string& path, LoggingSection& l) {
  read_fields(o, n, path, {{"level", [&](const Node& v, const std::string& k) {
                              l.level = read_enum(o, v, k, kLogLevels);
                            }}});
}

void read_root(Origin& o, const Node& root, Config& c) {
  // Each section reader takes (origin, node, key path, section).
  auto section = [&](auto reader, auto& part) {
    return [&o, reader, &part](const Node& v, const std::string& k) { reader(o, v, k, part); };
  };
  read_fields(o, root, "",
              {{"model", section(read_model, c.model)},
               {"server", section(read_server, c.server)},
               {"parallel", section(read_parallel, c.parallel)},
               {"devices", section(read_devices, c.devices)},
               {"batching", section(read_batching, c.batching)},
               {"kv_cache", section(read_kv_cache, c.kv_cache)},
               {"routing", section(read_routing, c.routing)},
               {"admission", section(read_admission, c.admission)},
               {"supervision", section(read_supervision, c.supervision)},
               {"logging", section(read_logging, c.logging)}});
}

// ---------------------------------------------------------------------------
// Validation: every range check and every check spanning keys, in one place
// so that configs built in code get the same checks as files.

void check_positive(const Origin& o, const std::string& key, int64_t value) {
  if (value < 1)
    o.fail(key, "expected " + std::string(kPositiveInt) + ", got " + std::to_string(value));
}

void check_non_negative(const Origin& o, const std::string& key, int64_t value) {
  if (value < 0) {
    o.fail(key, "expected " + std::string(kNonNegativeInt) + ", got " + std::to_string(value));
  }
}

std::string format_number(double value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

// `zero_ok`: 0 means "no limit" for this key.
void check_seconds(const Origin& o, const std::string& key, double value, bool zero_ok) {
  if (std::isfinite(value) && (value > 0 || (zero_ok && value == 0))) return;
  o.fail(key, std::string("expected ") + (zero_ok ? "a non-negative" : "a positive") +
                  " number of seconds" + (zero_ok ? " (0: no limit)" : "") + ", got " +
                  format_number(value));
}

void validate_model(const Origin& o, const ModelSection& m) {
  if (m.path.empty()) o.fail("model.path", "must not be empty");
}

void validate_server(const Origin& o, const ServerSection& s) {
  try {
    parse_listen(s.listen);
  } catch (const std::invalid_argument& e) {
    o.fail("server.listen", e.what());
  }
  if (s.max_body_bytes < 1) {
    o.fail("server.max_body_bytes",
           "expected a positive byte count, got " + std::to_string(s.max_body_bytes));
  }
  check_seconds(o, "server.request_timeout_s", s.request_timeout_s, true);
  check_positive(o, "server.max_tokens_limit", s.max_tokens_limit);
  check_positive(o, "server.io_threads", s.io_threads);
}

std::string layout_text(const ParallelLayout& p) {
  return "{replicas: " + std::to_string(p.replicas) + ", pipeline: " + std::to_string(p.pipeline) +
         ", tensor: " + std::to_string(p.tensor) + "}";
}

void validate_parallel(const Origin& o, const ParallelLayout& p) {
  check_positive(o, "parallel.replicas", p.replicas);
  check_positive(o, "parallel.pipeline", p.pipeline);
  check_positive(o, "parallel.tensor", p.tensor);
  const int64_t devices = int64_t(p.replicas) * p.pipeline * p.tensor;
  if (devices > kMaxDevices) {
    o.fail("parallel", layout_text(p) + " needs " + std::to_string(devices) + " devices; at most " +
                           std::to_string(kMaxDevices) + " are supported");
  }
}

void validate_devices(const Origin& o, const Config& c) {
  const size_t n = c.devices.size();
  const auto needed = size_t(c.parallel.device_count());
  if (n != 1 && n != needed) {
    o.fail("devices", "has " + std::to_string(n) + " entries, but parallel " +
                          layout_text(c.parallel) + " needs " + std::to_string(needed) +
                          " (one per device) or 1 (applied to every device)");
  }
  for (size_t i = 0; i < n; ++i) {
    check_positive(o, "devices[" + std::to_string(i) + "].threads", c.devices[i].threads);
    check_non_negative(o, "devices[" + std::to_string(i) + "].memory", c.devices[i].memory_bytes);
  }
}

void validate_batching(const Origin& o, const BatchingSection& b) {
  check_positive(o, "batching.max_batch_sequences", b.max_batch_sequences);
  check_positive(o, "batching.max_batch_tokens", b.max_batch_tokens);
  check_positive(o, "batching.prefill_chunk_tokens", b.prefill_chunk_tokens);
  check_non_negative(o, "batching.max_waiting", b.max_waiting);
  if (b.prefill_chunk_tokens > b.max_batch_tokens) {
    o.fail("batching.prefill_chunk_tokens",
           std::to_string(b.prefill_chunk_tokens) + " is more than batching.max_batch_tokens (" +
               std::to_string(b.max_batch_tokens) + "): a prefill chunk must fit in one batch");
  }
}

void validate_kv_cache(const Origin& o, const KvCacheSection& kv) {
  check_positive(o, "kv_cache.block_tokens", kv.block_tokens);
  check_non_negative(o, "kv_cache.blocks", kv.blocks);
  check_non_negative(o, "kv_cache.bytes", kv.bytes);
  if (kv.blocks > 0 && kv.bytes > 0) {
    o.fail("kv_cache", "blocks and bytes are both set; give one of them");
  }
  if (kv.blocks == 0 && kv.bytes == 0) {
    o.fail("kv_cache.blocks", "expected a positive integer, got 0 (or give kv_cache.bytes)");
  }
}

void validate_routing(const Origin& o, const RoutingSection& r) {
  const auto& names = routing_policy_names();
  if (std::find(names.begin(), names.end(), r.policy) != names.end()) return;
  const std::vector<std::string_view> known(names.begin(), names.end());
  o.fail("routing.policy", "expected one of " + join(known) + ", got '" + r.policy + "'" +
                               suggestion(r.policy, known));
}

void validate_admission(const Origin& o, const AdmissionSection& a) {
  check_positive(o, "admission.max_queue", a.max_queue);
  check_positive(o, "admission.priority_levels", a.priority_levels);
  check_seconds(o, "admission.queue_timeout_s", a.queue_timeout_s, true);
}

void validate_supervision(const Origin& o, const SupervisionSection& s) {
  check_non_negative(o, "supervision.max_restarts", s.max_restarts);
  check_seconds(o, "supervision.within_s", s.within_s, false);
}

void validate(const Origin& o, const Config& c) {
  validate_model(o, c.model);
  validate_server(o, c.server);
  validate_parallel(o, c.parallel);
  validate_devices(o, c);
  validate_batching(o, c.batching);
  validate_kv_cache(o, c.kv_cache);
  validate_routing(o, c.routing);
  validate_admission(o, c.admission);
  validate_supervision(o, c.supervision);
}

// ---------------------------------------------------------------------------
// Documents and overrides

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
template <typename F>
void guarded(const std::string& source, F&& body) {
  try {
    body();
  } catch (const YAML::Exception& e) {
    throw key_error(source, "", e.what(), 0);
  }
}

// Flow syntax for sections and lists; anything else is taken verbatim, so a
// value such as "a #1" is not cut at a YAML comment.
Node override_value(const Origin& o, const std::string& key, const std::string& value) {
  if (value.empty() || (value.front() != '{' && value.front() != '[')) return Node(value);
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

// "devices[N]" or "devices[N].rest" -> (N, rest); nullopt for other keys.
struct DeviceEntryKey {
  size_t index;
  std::string entry;                // "devices[N]"
  std::optional<std::string> rest;  // what follows "devices[N].", if anything
};

std::optional<DeviceEntryKey> device_entry_key(const std::string& key) {
  constexpr std::string_view kPrefix = "devices[";
  if (!key.starts_with(kPrefix)) return std::nullopt;
  const size_t close = key.find(']', kPrefix.size());
  if (close == std::string::npos) return std::nullopt;
  const std::string_view digits =
      std::string_view(key).substr(kPrefix.size(), close - kPrefix.size());
  size_t index = 0;
  const auto [stop, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || stop != digits.data() + digits.size()) {
    return std::nullopt;
  }
  const std::string_view tail = std::string_view(key).substr(close + 1);
  if (!tail.empty() && tail.front() != '.') return std::nullopt;
  DeviceEntryKey parsed{index, key.substr(0, close + 1), std::nullopt};
  if (!tail.empty()) parsed.rest = std::string(tail.substr(1));
  return parsed;
}

void apply_one(Origin& o, Config& c, const std::string& key, const std::string& text) {
  const Node value = override_value(o, key, text);
  const auto device = device_entry_key(key);
  if (!device) {
    read_root(o, nest(split_key(o, key), 0, value), c);
    return;
  }
  if (device->index >= c.devices.size()) {
    o.fail(device->entry, "no such entry; devices has " + std::to_string(c.devices.size()));
  }
  const Node entry_value = device->rest ? nest(split_key(o, *device->rest), 0, value) : value;
  read_device(o, entry_value, device->entry, c.devices[device->index]);
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API

const char* device_kind_name(DeviceKind k) {
  return name_in(kDeviceKinds, k).data();
}

Config default_config() {
  return Config{};
}

Config parse_config(const std::string& yaml_text, const std::string& source_name) {
  Origin origin(source_name);
  Config config;
  guarded(source_name, [&] {
    read_root(origin, load_document(yaml_text, source_name), config);
    validate(origin, config);
  });
  return config;
}

Config load_config(const std::filesystem::path& file) {
  const std::string source = file.string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw key_error(source, "", "cannot read the config file: it does not exist", 0);
  }
  if (std::filesystem::is_directory(file, ec)) {
    throw key_error(source, "", "cannot read the config file: it is a directory", 0);
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (!(in && text << in.rdbuf())) {
    throw key_error(source, "", "cannot read the config file", 0);
  }
  return parse_config(text.str(), source);
}

void apply_overrides(Config& config,
                     const std::vector<std::pair<std::string, std::string>>& key_values,
                     const std::string& source_name) {
  Origin origin(source_name);
  Config updated = config;  // untouched when any override fails
  guarded(source_name, [&] {
    for (const auto& [key, value] : key_values) apply_one(origin, updated, key, value);
    validate(origin, updated);
  });
  config = std::move(updated);
}

void apply_override(Config& config, const std::string& dotted_key, const std::string& value,
                    const std::string& source_name) {
  apply_overrides(config, {{dotted_key, value}}, source_name);
}

void validate_config(const Config& config, const std::string& source_name) {
  validate(Origin(source_name), config);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  auto number = [](double v) { return format_number(v); };
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "path" << YAML::Value << c.model.path;
  out << YAML::Key << "tokenizer" << YAML::Value << c.model.tokenizer;
  out << YAML::Key << "dtype" << YAML::Value << dtype_name(c.model.dtype);
  out << YAML::Key << "name" << YAML::Value << c.model.name;
  out << YAML::EndMap;

  out << YAML::Key << "server" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen" << YAML::Value << c.server.listen;
  out << YAML::Key << "max_body_bytes" << YAML::Value << c.server.max_body_bytes;
  out << YAML::Key << "request_timeout_s" << YAML::Value << number(c.server.request_timeout_s);
  out << YAML::Key << "max_tokens_limit" << YAML::Value << c.server.max_tokens_limit;
  out << YAML::Key << "io_threads" << YAML::Value << c.server.io_threads;
  out << YAML::EndMap;

  out << YAML::Key << "parallel" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "replicas" << YAML::Value << c.parallel.replicas;
  out << YAML::Key << "pipeline" << YAML::Value << c.parallel.pipeline;
  out << YAML::Key << "tensor" << YAML::Value << c.parallel.tensor;
  out << YAML::EndMap;

  out << YAML::Key << "devices" << YAML::Value << YAML::BeginSeq;
  for (const DeviceSpec& d : c.devices) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value << device_kind_name(d.kind);
    out << YAML::Key << "threads" << YAML::Value << d.threads;
    if (d.memory_bytes != 0) out << YAML::Key << "memory" << YAML::Value << d.memory_bytes;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;

  out << YAML::Key << "batching" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "max_batch_sequences" << YAML::Value << c.batching.max_batch_sequences;
  out << YAML::Key << "max_batch_tokens" << YAML::Value << c.batching.max_batch_tokens;
  out << YAML::Key << "prefill_chunk_tokens" << YAML::Value << c.batching.prefill_chunk_tokens;
  out << YAML::Key << "max_waiting" << YAML::Value << c.batching.max_waiting;
  out << YAML::EndMap;

  out << YAML::Key << "kv_cache" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "block_tokens" << YAML::Value << c.kv_cache.block_tokens;
  if (c.kv_cache.blocks != 0) out << YAML::Key << "blocks" << YAML::Value << c.kv_cache.blocks;
  if (c.kv_cache.bytes != 0) out << YAML::Key << "bytes" << YAML::Value << c.kv_cache.bytes;
  out << YAML::EndMap;

  out << YAML::Key << "routing" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "policy" << YAML::Value << c.routing.policy;
  out << YAML::Key << "seed" << YAML::Value << c.routing.seed;
  out << YAML::EndMap;

  out << YAML::Key << "admission" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "max_queue" << YAML::Value << c.admission.max_queue;
  out << YAML::Key << "priority_levels" << YAML::Value << c.admission.priority_levels;
  out << YAML::Key << "queue_timeout_s" << YAML::Value << number(c.admission.queue_timeout_s);
  out << YAML::Key << "on_timeout" << YAML::Value
      << std::string(name_in(kTimeoutActions, c.admission.on_timeout));
  out << YAML::EndMap;

  out << YAML::Key << "supervision" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "max_restarts" << YAML::Value << c.supervision.max_restarts;
  out << YAML::Key << "within_s" << YAML::Value << number(c.supervision.within_s);
  out << YAML::EndMap;

  out << YAML::Key << "logging" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "level" << YAML::Value << std::string(name_in(kLogLevels, c.logging.level));
  out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::pair<std::string, uint16_t> parse_listen(const std::string& listen) {
  const std::string usage =
      "expected host:port (e.g. 127.0.0.1:8080, or [::1]:8080 for IPv6), got '" + listen + "'";
  std::string host;
  std::string port;
  if (!listen.empty() && listen.front() == '[') {
    // Brackets keep an IPv6 address's colons apart from the port's.
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      throw std::invalid_argument(usage);
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument(usage);
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      throw std::invalid_argument(usage + "; an IPv6 address needs brackets");
    }
  }
  const bool host_ok =
      !host.empty() && std::none_of(host.begin(), host.end(), [](unsigned char ch) {
        return std::isspace(ch) || ch == '/' || ch == '[' || ch == ']';
      });
  if (!host_ok) throw std::invalid_argument(usage);
  unsigned long value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || !std::isdigit(static_cast<unsigned char>(port.front())) ||
      ec == std::errc::invalid_argument || end != port.data() + port.size()) {
    throw std::invalid_argument(usage);
  }
  if (ec == std::errc::result_out_of_range || value > 65535) {
    throw std::invalid_argument("port " + port + " is out of range (0-65535; 0 = any free port)");
  }
  return {host, uint16_t(value)};
}

int device_index(const ParallelLayout& parallel, int replica, int stage, int shard) {
  if (replica < 0 || replica >= parallel.replicas || stage < 0 || stage >= parallel.pipeline ||
      shard < 0 || shard >= parallel.tensor) {
    throw std::out_of_range("device_index: (replica " + std::to_string(replica) + ", stage " +
                            std::to_string(stage) + ", shard " + std::to_string(shard) +
                            ") is outside the layout " + layout_text(parallel));
  }
  return (replica * parallel.pipeline + stage) * parallel.tensor + shard;
}

const DeviceSpec& device_spec(const Config& config, int device_index) {
  if (device_index < 0 || device_index >= config.parallel.device_count() ||
      config.devices.empty()) {
    throw std::out_of_range("device " + std::to_string(device_index) + " is outside the layout " +
                            layout_text(config.parallel));
  }
  if (config.devices.size() == 1) return config.devices.front();
  return config.devices.at(size_t(device_index));
}

int threads_for_device(const Config& config, int device_index) {
  return device_spec(config, device_index).threads;
}

std::string served_model_name(const Config& config) {
  if (!config.model.name.empty()) return config.model.name;
  std::filesystem::path p = std::filesystem::path(config.model.path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "models/fortune/"
  // Only weight-file extensions go: a directory such as "llama-3.2-1b" has a
  // "." in its name that is not an extension.
  const std::string ext = p.extension().string();
  const std::string name = ext == ".bin" || ext == ".safetensors" || ext == ".gguf"
                               ? p.stem().string()
                               : p.filename().string();
  return name.empty() || name == "." || name == ".." ? "model" : name;
}

std::filesystem::path tokenizer_path(const Config& config,
                                     const std::filesystem::path& beside_weights) {
  return config.model.tokenizer.empty() ? beside_weights
                                        : std::filesystem::path(config.model.tokenizer);
}

AdmissionQueueOptions admission_queue_options(const Config& config) {
  AdmissionQueueOptions options;
  options.max_size = size_t(config.admission.max_queue);
  options.priority_levels = size_t(config.admission.priority_levels);
  options.max_wait_s = config.admission.queue_timeout_s;
  options.on_timeout = config.admission.on_timeout;
  return options;
}

void validate_layout_for_model(const Config& config, const ModelConfig& model) {
  try {
    check_layout_fits(model, config.parallel.pipeline, config.parallel.tensor);
  } catch (const LayoutMisfit& e) {
    const std::string key =
        e.axis() == LayoutMisfit::Axis::Tensor ? "parallel.tensor" : "parallel.pipeline";
    throw ConfigError(std::string(e.what()) + " (model " + config.model.path + ")",
                      config.model.path, key);
  }
}

}  // namespace troupe
