#pragma once
// A small toolkit for typed YAML schemas, so that each key of a
// configuration is declared once: its name, the member it fills, how its
// value reads (with the type named in errors), the range it must be in, and
// how it is written back. From those declarations come the reader (unknown
// keys answered with "did you mean", duplicate keys refused), the range
// checks, the YAML writer and dotted-key overrides (`batching.max_batch_tokens`,
// `devices[2].threads`). Every error names the source, the key and, for a
// file, the line. Nothing here knows Troupe's keys (deploy/config.cpp does).
#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

// A configuration error: what() is "SOURCE: KEY.PATH: problem", with
// " (line N)" when the key came from a file. key() is the dotted path, empty
// for errors about the whole document (YAML syntax, an unreadable file).
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(const std::string& message, std::string source, std::string key)
      : std::invalid_argument(message), source_(std::move(source)), key_(std::move(key)) {}
  const std::string& source() const { return source_; }
  const std::string& key() const { return key_; }

 private:
  std::string source_;
  std::string key_;
};

namespace schema {

using YAML::Node;

// Where values come from: the name that errors start with and, for a file,
// the line of each key, so that checks running after the parse (ranges,
// keys that constrain each other) can still point at the line.
class Origin {
 public:
  explicit Origin(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }
  void note_line(const std::string& key, const YAML::Mark& mark);
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;

 private:
  std::string source_;
  std::map<std::string, int> lines_;
};

// "SOURCE: KEY: problem (line N)" (key and line when there are).
ConfigError key_error(const std::string& source, const std::string& key, const std::string& problem,
                      int line);

std::string join(const std::vector<std::string_view>& items);
// "; did you mean 'X'?" for the candidate a typo most likely meant, or "".
std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates);
// How a value reads to the user, for "expected X, got Y".
std::string describe(const Node& n);
[[noreturn]] void fail_expected(const Origin& o, const std::string& key, std::string_view expected,
                                const Node& got);
// The shortest text that reads back as the same double.
std::string format_number(double value);

// How a value of type T reads, what range it must be in, and how it is
// written back.
template <class T>
struct Kind {
  // Reads the node (wrong types fail naming what was expected).
  std::function<T(const Origin&, const Node&, const std::string& key)> read;
  // "" when the value is acceptable, else the problem ("expected a positive
  // integer, got 0").
  std::function<std::string(const T&)> problem;
  std::function<void(YAML::Emitter&, const T&)> write;
};

Kind<int> positive_int();
Kind<int> non_negative_int();
// A non-negative index, or -1 for "unset" (its default).
Kind<int> optional_index();
Kind<int64_t> non_negative_int64();  // read as "a positive integer"; 0 left to a cross-key check
Kind<uint64_t> unsigned_int();
// Seconds; with zero_is_no_limit, 0 means "no limit".
Kind<double> seconds(bool zero_is_no_limit);
// Non-negative seconds whose 0 means `zero_means` in messages ("the start
// of the load"; empty: nothing is said about 0): a time or a length where 0
// is not "no limit".
Kind<double> non_negative_seconds(std::string zero_means);
// Seconds of at least `min`, `why` saying why in the message.
Kind<double> seconds_at_least(double min, std::string why);
// A number within [lo, hi] (factors, fractions, rates).
Kind<double> number_in(double lo, double hi);
// Bytes with an optional binary unit (256MiB); `positive` refuses 0.
Kind<int64_t> byte_count(bool positive);
Kind<std::string> text();
Kind<std::string> non_empty_text();
// A string whose empty value means "the default", so the key may be blank.
Kind<std::string> optional_text();
Kind<bool> boolean();
// A list of strings, written in flow style: [a, b].
Kind<std::vector<std::string>> text_list();

// One of a fixed set of names.
template <class E>
Kind<E> one_of(std::vector<std::pair<std::string_view, E>> names);

// The keys of one map (a section, or an entry of a list).
template <class S>
class Fields {
 public:
  // The map is written as {a: 1, b: 2} rather than one key per line.
  Fields& flow(bool on = true);
  // A scalar key; `omit_zero`: not written when the value is 0 (its default
  // "none").
  template <class T>
  Fields& add(std::string_view key, T S::*member, Kind<T> kind, bool omit_zero = false);
  // A nested map.
  template <class T>
  Fields& section(std::string_view key, T S::*member, const Fields<T>& fields);
  // A list of maps, each read through `fields` ("key[N]" in errors); a list
  // given replaces the whole list. The expectations name the shapes in
  // errors ("a list of devices such as [...]", "a device such as {...}").
  template <class T>
  Fields& list(std::string_view key, std::vector<T> S::*member, const Fields<T>& fields,
               std::string list_expected, std::string item_expected);
  // Runs after a map of this kind was read, with the keys it gave: for keys
  // that constrain each other within one map.
  Fields& after_read(
      std::function<void(const Origin&, const std::string& path, S&, const std::set<std::string>&)>
          fn);

  std::vector<std::string_view> keys() const;
  // Reads the keys present; absent keys keep their values (which is what
  // makes every key optional and lets overrides reuse the readers).
  void read(Origin& o, const Node& map, const std::string& path, S& s) const;
  // Every key's range check, nested maps and lists included.
  void check(const Origin& o, const std::string& path, const S& s) const;
  void write(YAML::Emitter& out, const S& s) const;
  // Reads `value` into one key given as a dotted path from this map
  // ("batching.max_batch_tokens", "devices[2].threads", "devices[2]").
  void override_key(Origin& o, const std::string& dotted_key, const Node& value, S& s) const;

 private:
  struct Entry {
    std::string_view key;
    std::function<void(Origin&, const Node&, const std::string& path, S&)> read;
    std::function<void(const Origin&, const std::string& path, const S&)> check;
    std::function<void(YAML::Emitter&, const S&)> write;
    // Lists only: reads an override into entry N (`rest` empty: the entry).
    std::function<void(Origin&, size_t index, const std::string& entry_path,
                       const std::string& rest, const Node&, S&)>
        override_entry;
  };
  const Entry* find(std::string_view key) const;

  std::vector<Entry> entries_;
  bool flow_ = false;
  std::function<void(const Origin&, const std::string&, S&, const std::set<std::string>&)>
      after_read_;
};

// ---- documents and overrides ----

// Parses one YAML document (a second document, or yaml-cpp's pathological
// inputs, are syntax errors naming the line and column).
Node load_document(const std::string& text, const std::string& source);
// Runs `body`, turning anything yaml-cpp throws into a ConfigError.
void guarded(const std::string& source, const std::function<void()>& body);
// An override's value: flow YAML when it starts with '{' or '[', else the
// text verbatim (so "a #1" is not cut at a comment).
Node override_value(const Origin& o, const std::string& key, const std::string& value);
// "a.b.c" -> {a, b, c}; empty parts fail naming the key.
std::vector<std::string> split_key(const Origin& o, const std::string& key);
// {a: {b: value}} for {a, b}.
Node nest(const std::vector<std::string>& parts, size_t first, const Node& value);
// "name[N]" or "name[N].rest" -> (name, N, rest).
struct ListKey {
  std::string name;
  size_t index = 0;
  std::string entry;  // "name[N]"
  std::string rest;   // what follows "name[N].", empty for the entry itself
};
std::optional<ListKey> list_key(const std::string& key);

}  // namespace schema
}  // namespace troupe

#include "deploy/yaml_schema.inl"
