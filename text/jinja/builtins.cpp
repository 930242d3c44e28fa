#include "text/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace troupe::jinja {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(what);
}

bool is_py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// A string's code points as byte offsets: [i] is where code point i starts,
// and the last entry is the string's size.
std::vector<size_t> code_points(std::string_view s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto drop = [&](char c) {
    return chars.is_string() ? chars.as_string().find(c) != std::string::npos : is_py_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = char(upper ? std::toupper(static_cast<unsigned char>(c))
                   : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python's str.title(): a letter after a non-letter is upper, others lower.
std::string title(std::string s) {
  bool after_letter = false;
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    c = char(after_letter ? std::tolower(u) : std::toupper(u));
    after_letter = std::isalpha(u) != 0;
  }
  return s;
}

std::string capitalize(std::string s) {
  s = ascii_case(std::move(s), false);
  if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    const auto at = code_points(s);
    for (size_t i = 0; i + 1 < at.size(); ++i) {
      if (count < 0 || int64_t(i) < count) out += to;
      out += s.substr(at[i], at[i + 1] - at[i]);
    }
    if (count < 0 || int64_t(at.size() - 1) < count) out += to;
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (!sep.is_string()) {  // runs of white space, none empty
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && is_py_space(s[e - 1])) --e;
        out.emplace_back(s.substr(i, e - i));
        break;
      }
      const size_t start = i;
      while (i < s.size() && !is_py_space(s[i])) ++i;
      out.emplace_back(s.substr(start, i - start));
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

List rsplit(const std::string& s, const Value& sep, int64_t maxsplit) {
  if (maxsplit < 0 || !sep.is_string()) return split(s, sep, maxsplit);
  const std::string& d = sep.as_string();
  if (d.empty()) fail("empty separator");
  List out;
  size_t end = s.size();
  while (int64_t(out.size()) < maxsplit) {
    if (end < d.size()) break;
    const size_t hit = s.rfind(d, end - d.size());
    if (hit == std::string::npos) break;
    out.insert(out.begin(), Value(s.substr(hit + d.size(), end - hit - d.size())));
    end = hit;
  }
  out.insert(out.begin(), Value(s.substr(0, end)));
  return out;
}

List splitlines(const std::string& s) {
  List out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      out.emplace_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

int64_t to_int(const Value& v, const std::string& what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_float()) return float_to_int(v.as_number());
  fail(what + " must be an integer, not " + v.type_name());
}

int64_t optional_int(const Value& v, int64_t fallback, const std::string& what) {
  return v.is_undefined() || v.is_none() ? fallback : to_int(v, what);
}

// A count of spaces (indent's width, tojson's indent): 0 to 1000.
int64_t bounded(int64_t n, const std::string& what) {
  if (n < 0 || n > 1000) fail(what + " must be 0 to 1000, not " + std::to_string(n));
  return n;
}

const std::string& need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) fail(what + " must be a string, not " + v.type_name());
  return v.as_string();
}

}  // namespace

List items_of(const Value& v, const std::string& what) {
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    List keys;
    for (const auto& item : v.dict().items) keys.emplace_back(item.first);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    const auto at = code_points(v.as_string());
    for (size_t i = 0; i + 1 < at.size(); ++i)
      chars.emplace_back(v.as_string().substr(at[i], at[i + 1] - at[i]));
    return chars;
  }
  if (v.is_undefined()) return {};
  fail(what + ": '" + v.type_name() + "' object is not iterable");
}

namespace {

// Jinja's attribute lookup for filters: "a.b.0" walks dicts and lists.
Value dotted(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    int64_t index = 0;
    if (cur.is_list() && parse_int64(part, index))
      cur = subscript(cur, Value(index));
    else
      cur = attribute(cur, part);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value bound(const Value& object, std::string name,
            std::function<Value(const Value&, Args&)> method) {
  return Value::function(
      std::move(name), [object, method = std::move(method)](Args& a) { return method(object, a); });
}

// A method that would change a value: transformers renders in Jinja's
// immutable sandbox, where calling one is a SecurityError. (So values hold no
// cycles: only a namespace changes, and it may not hold itself.)
Value unsafe(const Value& object, const std::string& name) {
  return Value::function(
      name,
      [message = "access to attribute '" + name + "' of '" + object.type_name() +
                 "' object is unsafe"](Args&) -> Value { throw Error(message); });
}

// The sort key of filters that fold case unless asked not to.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(ascii_case(v.as_string(), false));
  return v;
}

std::string indent(const std::string& text, const Value& width, bool first, bool blank) {
  const std::string pad =
      width.is_string()
          ? width.as_string()
          : std::string(size_t(bounded(optional_int(width, 4, "width"), "width")), ' ');
  const List lines = splitlines(text + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += '\n';
    if ((i > 0 || first) && (blank || !line.empty())) out += pad;
    out += line;
  }
  if (first && lines.empty()) out = pad;
  return out;
}

Value python_round(double x, int64_t digits, const std::string& method) {
  const double scale = std::pow(10.0, double(digits));
  double y = x * scale;
  if (method == "common") {
    y = std::nearbyint(y);  // Python's round(): half to even
  } else if (method == "floor") {
    y = std::floor(y);
  } else if (method == "ceil") {
    y = std::ceil(y);
  } else {
    fail("round(): method must be common, ceil or floor");
  }
  return Value(y / scale);
}

Value select(const Value& operand, Args& args, bool by_attribute, bool keep) {
  const std::string what = args.callee;
  std::string attr;
  size_t next = 0;
  if (by_attribute) attr = need_string(args.take(next++, ""), what + " attribute");
  const Value test = args.take(next++, "");
  Args test_args;
  for (size_t i = next; i < args.positional.size(); ++i)
    test_args.positional.push_back(args.positional[i]);
  args.take(args.positional.size(), "");  // the rest go to the test
  args.done();
  List out;
  if (!operand.truthy()) return Value(std::move(out));  // Jinja: `if seq:`, so none is empty
  for (const Value& item : items_of(operand, what)) {
    const Value subject = by_attribute ? dotted(item, attr) : item;
    bool pass;
    if (test.is_undefined()) {
      pass = subject.truthy();
    } else {
      Args a = test_args;
      a.callee = need_string(test, what + " test");
      pass = apply_test(test.as_string(), subject, a);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value map(const Value& operand, Args& args) {
  const Value attr = args.take(SIZE_MAX, "attribute");
  List out;
  if (!operand.truthy()) return Value(std::move(out));  // Jinja: `if seq:`, so none is empty
  if (!attr.is_undefined()) {
    const Value fallback = args.take(SIZE_MAX, "default");
    args.done();
    const std::string path = attr.is_string() ? attr.as_string() : attr.str();
    for (const Value& item : items_of(operand, "map")) {
      Value v = dotted(item, path);
      out.push_back(v.is_undefined() ? fallback : v);
    }
    return Value(std::move(out));
  }
  const std::string name = need_string(args.take(0, ""), "map filter");
  Args rest;
  rest.callee = name;
  for (size_t i = 1; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  for (const Value& item : items_of(operand, "map")) {
    Args a = rest;
    out.push_back(apply_filter(name, item, a));
  }
  return Value(std::move(out));
}

Value sorted(const Value& operand, Args& args) {
  const bool reverse = args.take(0, "reverse", Value(false)).truthy();
  const bool case_sensitive = args.take(1, "case_sensitive", Value(false)).truthy();
  const Value attr = args.take(2, "attribute");
  args.done();
  List l = items_of(operand, "sort");
  const auto key = [&](const Value& v) {
    return sort_key(attr.is_undefined() ? v : dotted(v, attr.str()), case_sensitive);
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& a, const Value& b) {
    return reverse ? key(b).less(key(a)) : key(a).less(key(b));
  });
  return Value(std::move(l));
}

Value unique(const Value& operand, Args& args) {
  const bool case_sensitive = args.take(0, "case_sensitive", Value(false)).truthy();
  const Value attr = args.take(1, "attribute");
  args.done();
  List out, seen;
  for (const Value& item : items_of(operand, "unique")) {
    const Value key =
        sort_key(attr.is_undefined() ? item : dotted(item, attr.str()), case_sensitive);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value(std::move(out));
}

Value extreme(const Value& operand, Args& args, bool largest) {
  const bool case_sensitive = args.take(0, "case_sensitive", Value(false)).truthy();
  const Value attr = args.take(1, "attribute");
  args.done();
  const List l = items_of(operand, args.callee);
  if (l.empty()) return Value();
  const Value* best = &l[0];
  const auto key = [&](const Value& v) {
    return sort_key(attr.is_undefined() ? v : dotted(v, attr.str()), case_sensitive);
  };
  for (const Value& v : l)
    if (largest ? key(*best).less(key(v)) : key(v).less(key(*best))) best = &v;
  return *best;
}

Value to_number(const Value& v, bool integer, const Value& fallback, int64_t base) {
  if (v.is_int()) return integer ? v : Value(double(v.as_int()));
  if (v.is_bool()) return integer ? Value(int64_t(v.as_bool())) : Value(double(v.as_bool()));
  if (v.is_float()) return integer ? Value(float_to_int(v.as_number())) : v;
  if (v.is_string()) {
    const std::string s = strip(v.as_string(), Value(), true, true);
    try {
      size_t used = 0;
      if (integer) {
        const int64_t i = std::stoll(s, &used, int(base));
        if (used == s.size()) return Value(i);
        const double d = std::stod(s, &used);  // Jinja's int("3.7") is 3
        if (used == s.size()) return Value(float_to_int(d));
      } else {
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value(d);
      }
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

}  // namespace

size_t utf8_length(std::string_view s) {
  return code_points(s).size() - 1;
}

Value subscript(const Value& object, const Value& key) {
  if (object.is_dict()) return key.is_string() ? object.dict().get(key.as_string()) : Value();
  if (!key.is_int() && !key.is_bool())
    return object.is_undefined() ? Value() : attribute(object, key.str());
  int64_t i = key.is_bool() ? int64_t(key.as_bool()) : key.as_int();
  if (object.is_list()) {
    const List& l = object.list();
    if (i < 0) i += int64_t(l.size());
    return i >= 0 && i < int64_t(l.size()) ? l[size_t(i)] : Value();
  }
  if (object.is_string()) {
    const auto at = code_points(object.as_string());
    const int64_t n = int64_t(at.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value(object.as_string().substr(at[size_t(i)], at[size_t(i) + 1] - at[size_t(i)]));
  }
  return Value();
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step_v) {
  const int64_t step = optional_int(step_v, 1, "a slice step");
  if (step == 0) fail("slice step cannot be zero");
  std::vector<size_t> at;
  int64_t n;
  if (object.is_list()) {
    n = int64_t(object.list().size());
  } else if (object.is_string()) {
    at = code_points(object.as_string());
    n = int64_t(at.size()) - 1;
  } else if (object.is_undefined()) {
    return Value();
  } else {
    fail("'" + object.type_name() + "' object is not subscriptable");
  }
  // Python's slice.indices().
  const auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    int64_t i = to_int(v, "a slice index");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, step > 0 ? 0 : n - 1);
  const int64_t e = bound(stop, step > 0 ? n : -1);
  List items;
  std::string text;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
    if (object.is_list())
      items.push_back(object.list()[size_t(i)]);
    else
      text += object.as_string().substr(at[size_t(i)], at[size_t(i) + 1] - at[size_t(i)]);
  }
  return object.is_list() ? Value(std::move(items)) : Value(std::move(text));
}

Value attribute(const Value& object, std::string_view name_view) {
  const std::string name(name_view);
  if (object.is_dict()) {
    if (const Value* v = object.dict().find(name)) return *v;
    if (name == "items")
      return bound(object, name, [](const Value& o, Args& a) {
        a.done();
        List out;
        for (const auto& [k, v] : o.dict().items) out.push_back(Value::tuple(List{Value(k), v}));
        return Value(std::move(out));
      });
    if (name == "keys" || name == "values")
      return bound(object, name, [keys = name == "keys"](const Value& o, Args& a) {
        a.done();
        List out;
        for (const auto& [k, v] : o.dict().items) out.push_back(keys ? Value(k) : v);
        return Value(std::move(out));
      });
    if (name == "get")
      return bound(object, name, [](const Value& o, Args& a) {
        const Value key = a.take(0, "");
        const Value fallback = a.take(1, "", Value(nullptr));
        a.done();
        const Value* v = key.is_string() ? o.dict().find(key.as_string()) : nullptr;
        return v ? *v : fallback;
      });
    if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" ||
        name == "clear")
      return unsafe(object, name);
    return Value();
  }
  if (object.is_list()) {
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
        name == "remove" || name == "clear" || name == "sort" || name == "reverse")
      return unsafe(object, name);
    if (name == "index" || name == "count")
      return bound(object, name, [index = name == "index"](const Value& o, Args& a) {
        const Value v = a.take(0, "");
        a.done();
        const List& l = o.list();
        if (!index) return Value(int64_t(std::count(l.begin(), l.end(), v)));
        const auto it = std::find(l.begin(), l.end(), v);
        if (it == l.end()) fail(v.repr() + " is not in list");
        return Value(int64_t(it - l.begin()));
      });
    return Value();
  }
  if (!object.is_string()) return Value();
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bound(object, name, [name](const Value& o, Args& a) {
      const Value chars = a.take(0, "");
      a.done();
      return Value(strip(o.as_string(), chars, name != "rstrip", name != "lstrip"));
    });
  if (name == "upper" || name == "lower")
    return bound(object, name, [upper = name == "upper"](const Value& o, Args& a) {
      a.done();
      return Value(ascii_case(o.as_string(), upper));
    });
  if (name == "title" || name == "capitalize")
    return bound(object, name, [t = name == "title"](const Value& o, Args& a) {
      a.done();
      return Value(t ? title(o.as_string()) : capitalize(o.as_string()));
    });
  if (name == "split" || name == "rsplit")
    return bound(object, name, [r = name == "rsplit"](const Value& o, Args& a) {
      const Value sep = a.take(0, "sep");
      const int64_t max = optional_int(a.take(1, "maxsplit"), -1, "maxsplit");
      a.done();
      return Value(r ? rsplit(o.as_string(), sep, max) : split(o.as_string(), sep, max));
    });
  if (name == "splitlines")
    return bound(object, name, [](const Value& o, Args& a) {
      a.done();
      return Value(splitlines(o.as_string()));
    });
  if (name == "startswith" || name == "endswith")
    return bound(object, name, [starts = name == "startswith"](const Value& o, Args& a) {
      const Value what = a.take(0, "");
      a.done();
      const std::string& s = o.as_string();
      const auto one = [&](const Value& v) {
        const std::string& p = need_string(v, starts ? "startswith" : "endswith");
        return p.size() <= s.size() && (starts ? s.compare(0, p.size(), p) == 0
                                               : s.compare(s.size() - p.size(), p.size(), p) == 0);
      };
      if (what.is_list()) return Value(std::any_of(what.list().begin(), what.list().end(), one));
      return Value(one(what));
    });
  if (name == "replace")
    return bound(object, name, [](const Value& o, Args& a) {
      const std::string from = need_string(a.take(0, ""), "replace");
      const std::string to = need_string(a.take(1, ""), "replace");
      const int64_t count = optional_int(a.take(2, "count"), -1, "count");
      a.done();
      return Value(replace(o.as_string(), from, to, count));
    });
  if (name == "find" || name == "rfind" || name == "count")
    return bound(object, name, [name](const Value& o, Args& a) {
      const std::string sub = need_string(a.take(0, ""), name);
      a.done();
      const std::string& s = o.as_string();
      const auto to_index = [&](size_t byte) {
        return byte == std::string::npos ? int64_t(-1) : int64_t(utf8_length(s.substr(0, byte)));
      };
      if (name == "find") return Value(to_index(s.find(sub)));
      if (name == "rfind") return Value(to_index(s.rfind(sub)));
      if (sub.empty()) return Value(int64_t(utf8_length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    });
  if (name == "join")
    return bound(object, name, [](const Value& o, Args& a) {
      const List parts = items_of(a.take(0, ""), "join");
      a.done();
      std::string out;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out += o.as_string();
        out += need_string(parts[i], "str.join item");
      }
      return Value(std::move(out));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower")
    return bound(object, name, [name](const Value& o, Args& a) {
      a.done();
      const std::string& s = o.as_string();
      if (s.empty()) return Value(false);
      int (*pred)(int) = name == "isdigit"   ? ::isdigit
                         : name == "isalpha" ? ::isalpha
                         : name == "isalnum" ? ::isalnum
                         : name == "isspace" ? ::isspace
                         : name == "isupper" ? ::isupper
                                             : ::islower;
      if (name == "isupper" || name == "islower") {
        bool cased = false;
        for (const char c : s) {
          if (!std::isalpha(static_cast<unsigned char>(c))) continue;
          cased = true;
          if (!pred(static_cast<unsigned char>(c))) return Value(false);
        }
        return Value(cased);
      }
      return Value(std::all_of(s.begin(), s.end(),
                               [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
    });
  if (name == "format")
    return bound(object, name, [](const Value& o, Args& a) {
      // "{}", "{0}" and "{name}" fields; no format specs.
      const std::string& s = o.as_string();
      std::string out;
      size_t auto_index = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
          out += '{';
          ++i;
        } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
          out += '}';
          ++i;
        } else if (s[i] == '{') {
          const size_t close = s.find('}', i);
          if (close == std::string::npos) fail("str.format: a '{' without '}'");
          const std::string field = s.substr(i + 1, close - i - 1);
          Value v;
          if (field.empty()) {
            v = a.take(auto_index++, "");
          } else if (int64_t index = 0; parse_int64(field, index)) {
            v = a.take(size_t(index), "");
          } else {
            v = a.take(SIZE_MAX, field);
          }
          out += v.str();
          i = close;
        } else {
          out += s[i];
        }
      }
      return Value(std::move(out));
    });
  return Value();
}

bool apply_test(std::string_view name, const Value& v, Args& args) {
  args.callee = std::string(name);
  const auto one_arg = [&]() {
    Value other = args.take(0, "");
    args.done();
    return other;
  };
  if (name == "defined") return args.done(), !v.is_undefined();
  if (name == "undefined") return args.done(), v.is_undefined();
  if (name == "none") return args.done(), v.is_none();
  if (name == "boolean") return args.done(), v.is_bool();
  if (name == "true") return args.done(), v.is_bool() && v.as_bool();
  if (name == "false") return args.done(), v.is_bool() && !v.as_bool();
  if (name == "integer") return args.done(), v.is_int();
  if (name == "float") return args.done(), v.is_float();
  if (name == "number") return args.done(), v.is_number() || v.is_bool();
  if (name == "string") return args.done(), v.is_string();
  if (name == "mapping") return args.done(), v.is_dict();
  if (name == "iterable") return args.done(), v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return args.done(), v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable")
    return args.done(), v.is_callable() || v.is_undefined();  // as Jinja's Undefined
  if (name == "lower" || name == "upper") {
    args.done();
    if (!v.is_string()) return false;
    Args none;
    return attribute(v, name == "lower" ? "islower" : "isupper").callable().fn(none).as_bool();
  }
  if (name == "odd" || name == "even") {
    args.done();
    const int64_t i = to_int(v, "odd/even");
    return (i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = to_int(one_arg(), "divisibleby");
    if (d == 0) fail("divisibleby 0");
    return to_int(v, "divisibleby") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v == one_arg();
  if (name == "ne" || name == "!=") return !(v == one_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return v.less(one_arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return one_arg().less(v);
  if (name == "le" || name == "<=") {
    const Value o = one_arg();
    return !o.less(v);
  }
  if (name == "ge" || name == ">=") {
    const Value o = one_arg();
    return !v.less(o);
  }
  if (name == "sameas") {
    const Value o = one_arg();
    if (v.is_list() && o.is_list()) return &v.list() == &o.list();
    if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
    return v.type_name() == o.type_name() && v == o;
  }
  if (name == "in") {
    const Value o = one_arg();
    if (o.is_string())
      return v.is_string() && o.as_string().find(v.as_string()) != std::string::npos;
    if (o.is_dict()) return v.is_string() && o.dict().find(v.as_string()) != nullptr;
    const List l = items_of(o, "in");
    return std::find(l.begin(), l.end(), v) != l.end();
  }
  fail("no test named '" + std::string(name) + "'");
}

Value apply_filter(std::string_view name_view, const Value& v, Args& args) {
  const std::string name(name_view);
  args.callee = name;
  const auto plain = [&]() { args.done(); };
  if (name == "safe") return plain(), v.is_markup() ? v : Value::markup(v.str());
  if (name == "string") return plain(), Value(v.str());
  if (name == "trim") {
    const Value chars = args.take(0, "chars");
    args.done();
    return Value(strip(v.str(), chars, true, true));
  }
  if (name == "upper" || name == "lower")
    return plain(), Value(ascii_case(v.str(), name == "upper"));
  if (name == "title") return plain(), Value(title(v.str()));
  if (name == "capitalize") return plain(), Value(capitalize(v.str()));
  if (name == "length" || name == "count") {
    plain();
    if (v.is_string()) return Value(int64_t(utf8_length(v.as_string())));
    if (v.is_list()) return Value(int64_t(v.list().size()));
    if (v.is_dict()) return Value(int64_t(v.dict().items.size()));
    if (v.is_undefined()) return Value(int64_t(0));
    fail("object of type '" + v.type_name() + "' has no len()");
  }
  if (name == "tojson") {
    const Value ind = args.take(0, "indent");
    const bool sort_keys = args.take(SIZE_MAX, "sort_keys", Value(false)).truthy();
    args.take(SIZE_MAX, "ensure_ascii");
    args.take(SIZE_MAX, "separators");
    args.done();
    const int64_t indent = optional_int(ind, -1, "indent");
    return Value(to_json(v, indent < 0 ? -1 : int(bounded(indent, "indent")), sort_keys));
  }
  if (name == "default" || name == "d") {
    const Value fallback = args.take(0, "default_value", Value(""));
    const bool boolean = args.take(1, "boolean", Value(false)).truthy();
    args.done();
    return v.is_undefined() || (boolean && !v.truthy()) ? fallback : v;
  }
  if (name == "join") {
    const Value sep = args.take(0, "d", Value(""));
    const Value attr = args.take(1, "attribute");
    args.done();
    std::string out;
    bool first = true;
    for (const Value& item : items_of(v, "join")) {
      if (!first) out += sep.str();
      first = false;
      out += (attr.is_undefined() ? item : dotted(item, attr.str())).str();
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    plain();
    const List l = items_of(v, name);
    if (l.empty()) return Value();
    return name == "first" ? l.front() : l.back();
  }
  if (name == "list") return plain(), Value(items_of(v, "list"));
  if (name == "reverse") {
    plain();
    if (v.is_string()) return slice(v, Value(), Value(), Value(int64_t(-1)));
    List l = items_of(v, "reverse");
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "items" || name == "dictsort") {
    const bool case_sensitive = args.take(0, "case_sensitive", Value(false)).truthy();
    const Value by = args.take(1, "by", Value("key"));
    const bool reverse = args.take(2, "reverse", Value(false)).truthy();
    args.done();
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) fail(name + " expects a mapping, not " + v.type_name());
    List out;
    for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple(List{Value(k), x}));
    if (name == "dictsort") {
      const size_t at = by.str() == "value" ? 1 : 0;
      std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
        const Value ka = sort_key(a.list()[at], case_sensitive),
                    kb = sort_key(b.list()[at], case_sensitive);
        return reverse ? kb.less(ka) : ka.less(kb);
      });
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    const std::string from = args.take(0, "old").str();
    const std::string to = args.take(1, "new").str();
    const int64_t count = optional_int(args.take(2, "count"), -1, "count");
    args.done();
    return Value(replace(v.str(), from, to, count));
  }
  if (name == "indent") {
    const Value width = args.take(0, "width");
    const bool first = args.take(1, "first", Value(false)).truthy();
    const bool blank = args.take(2, "blank", Value(false)).truthy();
    args.done();
    return Value(indent(v.str(), width, first, blank));
  }
  if (name == "int") {
    const Value fallback = args.take(0, "default", Value(int64_t(0)));
    const int64_t base = optional_int(args.take(1, "base"), 10, "base");
    args.done();
    return to_number(v, true, fallback, base);
  }
  if (name == "float") {
    const Value fallback = args.take(0, "default", Value(0.0));
    args.done();
    return to_number(v, false, fallback, 10);
  }
  if (name == "abs") {
    plain();
    if (v.is_int() && v.as_int() != INT64_MIN)
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_int()) return Value(-double(v.as_int()));
    if (v.is_float()) return Value(std::fabs(v.as_number()));
    fail("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "round") {
    const int64_t digits = optional_int(args.take(0, "precision"), 0, "precision");
    const std::string method = args.take(1, "method", Value("common")).str();
    args.done();
    if (!v.is_number() && !v.is_bool()) fail("round expects a number, not " + v.type_name());
    return python_round(v.is_bool() ? double(v.as_bool()) : v.as_number(), digits, method);
  }
  if (name == "sum") {
    const Value attr = args.take(0, "attribute");
    Value total = args.take(1, "start", Value(int64_t(0)));
    args.done();
    for (const Value& item : items_of(v, "sum")) {
      const Value x = attr.is_undefined() ? item : dotted(item, attr.str());
      int64_t sum = 0;
      if (total.is_int() && x.is_int() && !__builtin_add_overflow(total.as_int(), x.as_int(), &sum))
        total = Value(sum);
      else if ((total.is_number()) && (x.is_number()))
        total = Value(total.as_number() + x.as_number());
      else
        fail("sum(): cannot add " + x.type_name());
    }
    return total;
  }
  if (name == "min" || name == "max") return extreme(v, args, name == "max");
  if (name == "map") return map(v, args);
  if (name == "select" || name == "reject") return select(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select(v, args, true, name == "selectattr");
  if (name == "sort") return sorted(v, args);
  if (name == "unique") return unique(v, args);
  if (name == "attr") {
    const std::string attr = args.take(0, "name").str();
    args.done();
    return attribute(v, attr);
  }
  if (name == "e" || name == "escape" || name == "forceescape")
    return plain(),
           v.is_markup() && name != "forceescape" ? v : Value::markup(escape_html(v.str()));
  if (name == "wordcount") return plain(), Value(int64_t(split(v.str(), Value(), -1).size()));
  if (name == "batch") {
    const int64_t size = to_int(args.take(0, "linecount"), "batch size");
    const Value fill = args.take(1, "fill_with");
    args.done();
    if (size <= 0) fail("batch size must be positive");
    List out, cur;
    for (const Value& item : items_of(v, "batch")) {
      cur.push_back(item);
      if (int64_t(cur.size()) == size) out.emplace_back(std::exchange(cur, {}));
    }
    if (!cur.empty()) {
      if (!fill.is_undefined())
        while (int64_t(cur.size()) < size) cur.push_back(fill);
      out.emplace_back(std::move(cur));
    }
    return Value(std::move(out));
  }
  if (name == "pprint") return plain(), Value(v.repr());
  fail("no filter named '" + name + "'");
}

const Dict& builtin_globals() {
  static const Dict globals = [] {
    Dict g;
    g.set("range", Value::function("range", [](Args& a) {
            const Value x = a.take(0, ""), y = a.take(1, ""), z = a.take(2, "");
            a.done();
            int64_t start = 0, stop, step = 1;
            if (y.is_undefined()) {
              stop = to_int(x, "range()");
            } else {
              start = to_int(x, "range()");
              stop = to_int(y, "range()");
              step = optional_int(z, 1, "range() step");
            }
            if (step == 0) fail("range() arg 3 must not be zero");
            List out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
              if (out.size() >= 1'000'000) fail("range(): more than 1,000,000 items");
              out.emplace_back(i);
            }
            return Value(std::move(out));
          }));
    const auto keywords_to_dict = [](Args& a) {
      Dict d;
      const Value from = a.take(0, "");
      if (from.is_dict()) d = from.dict();
      for (auto& [k, v] : a.keyword) d.set(k, v);
      a.keyword.clear();
      a.done();
      return Value(std::move(d));
    };
    g.set("namespace", Value::function("namespace", keywords_to_dict));
    g.set("dict", Value::function("dict", keywords_to_dict));
    g.set("raise_exception", Value::function("raise_exception", [](Args& a) -> Value {
            throw Raised(a.take(0, "").str());
          }));
    return g;
  }();
  return globals;
}

}  // namespace troupe::jinja
