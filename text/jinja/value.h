#pragma once
// The values a Jinja template computes with, as Python holds them: lists and
// dicts are shared (a template's `ns.items.append(x)` is seen by every name
// bound to that list), dicts keep insertion order, and printing follows
// Python's str() and repr() (True, None, ['a', 1]), because chat templates
// were written against Python's Jinja and their output is what a model saw
// in training.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace troupe::jinja {

// A template that cannot be parsed or rendered; the message names the line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a template's own raise_exception() said: the caller's mistake (a chat
// the model's template does not accept), not the template's.
class Raised : public Error {
 public:
  using Error::Error;
};

class Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  struct Undefined {};
  struct Callable {
    std::string name;
    Function fn;
  };

  Value() = default;  // undefined
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(List l) : v_(std::make_shared<List>(std::move(l))) {}
  Value(Dict d);
  static Value function(std::string name, Function fn);
  // Jinja's Markup (what `|safe` and `|escape` return): text that another
  // text added to it with `+` is HTML-escaped into, as in Python.
  static Value markup(std::string s);
  bool is_markup() const { return flag_ && is_string(); }
  // A Python tuple: a list that prints as "(a, b)" (dict.items()' pairs).
  static Value tuple(List l);
  bool is_tuple() const { return flag_ && is_list(); }
  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_number() const { return is_int() ? double(as_int()) : std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& list() const { return *std::get<std::shared_ptr<List>>(v_); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }

  // Python's truth: empty strings, lists and dicts, 0 and None are false.
  bool truthy() const;
  // Python's str(): what {{ value }} prints (undefined prints nothing).
  std::string str() const;
  // Python's repr(): strings quoted, as inside a printed list.
  std::string repr() const;
  // Python's type name, for messages.
  std::string type_name() const;
  // Python's ==, deep for lists and dicts; 1 == 1.0 == True.
  bool operator==(const Value& other) const;
  // Python's < for numbers, strings and lists; throws Error otherwise.
  bool less(const Value& other) const;

 private:
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Callable>>
      v_;
  bool flag_ = false;  // a string: markup; a list: a tuple
};

// A Python dict with string keys (the only keys chat templates and JSON have),
// in insertion order; a few entries, so a linear search.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;

  const Value* find(std::string_view key) const;
  Value get(std::string_view key) const;  // undefined when absent
  void set(std::string key, Value value);
  bool erase(std::string_view key);
};

// A call's arguments, positional then keyword, taken out by the callee.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string callee;  // for messages

  // The argument at `index` (SIZE_MAX: by name only) or named `name`, else
  // `fallback`.
  Value take(size_t index, std::string_view name, Value fallback = {});
  // Throws when an argument was given that no take() asked for.
  void done() const;

 private:
  std::vector<bool> used_;
  size_t highest_ = 0;
};

// Python's json.dumps(value, ensure_ascii=False, indent, separators,
// sort_keys): transformers' `tojson`. indent < 0 is None (one line, ", " and
// ": " between items).
std::string to_json(const Value& value, int indent = -1, bool sort_keys = false);

// markupsafe's escape(): & < > " ' as HTML entities.
std::string escape_html(const std::string& s);

// Python's int(float): toward zero; Error for infinities, NaN and values
// past 64 bits.
int64_t float_to_int(double d);

// Decimal digits as an integer; false when they are none or do not fit.
bool parse_int64(std::string_view digits, int64_t& out);

// Python's repr() of a float: the shortest text that reads back the same.
std::string float_repr(double d);

}  // namespace troupe::jinja
