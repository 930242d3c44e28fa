#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace troupe::jinja {

namespace {

template <class Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value(nullptr);
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value(double(u)) : Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(value_from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), value_from_json(it.value()));
      return Value(std::move(d));
    }
    default:
      return Value();
  }
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;  // ensure_ascii=False: the rest as it is
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  const auto newline = [&](int level) {
    out += '\n';
    out.append(size_t(indent) * size_t(level), ' ');
  };
  if (v.is_undefined() || v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_number();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : float_repr(d);
  } else if (v.is_string()) {
    append_json_string(out, v.as_string());
  } else if (v.is_list()) {
    const List& l = v.list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out += indent < 0 ? ", " : ",";
      if (indent >= 0) newline(depth + 1);
      append_json(out, l[i], indent, sort_keys, depth + 1);
    }
    if (indent >= 0) newline(depth);
    out += ']';
  } else if (v.is_dict()) {
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : v.dict().items) items.push_back(&item);
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](const auto* a, const auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += indent < 0 ? ", " : ",";
      if (indent >= 0) newline(depth + 1);
      append_json_string(out, items[i]->first);
      out += ": ";
      append_json(out, items[i]->second, indent, sort_keys, depth + 1);
    }
    if (indent >= 0) newline(depth);
    out += '}';
  } else {
    throw Error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

std::string repr_string(const std::string& s) {
  // Python picks single quotes unless the text has one and no double quote.
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

int compare_lists(const List& a, const List& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    return a[i].less(b[i]) ? -1 : 1;
  }
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}

}  // namespace

Value::Value(Dict d) : v_(std::make_shared<Dict>(std::move(d))) {}

Value Value::function(std::string name, Function fn) {
  Value v;
  v.v_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.flag_ = true;
  return v;
}

Value Value::tuple(List l) {
  Value v(std::move(l));
  v.flag_ = true;
  return v;
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  return value_from_json(j);
}
Value Value::from_json(const nlohmann::json& j) {
  return value_from_json(j);
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_number() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !list().empty();
  if (is_dict()) return !dict().items.empty();
  return true;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  // Python writes 1e16 and up, and below 1e-4, in exponent form ("1e+16"),
  // everything else positionally with at least one decimal ("2.0").
  const double mag = std::fabs(d);
  if (mag != 0 && (mag >= 1e16 || mag < 1e-4)) {
    const auto e = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    s.assign(buf, e.ptr);
    const size_t at = s.find('e');
    const int e10 = std::stoi(s.substr(at + 1));
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
    return s.substr(0, at) + tail;
  }
  const auto f = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
  s.assign(buf, f.ptr);
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string Value::str() const {
  if (is_undefined()) return {};
  if (is_string()) return as_string();
  return repr();
}

std::string Value::repr() const {
  if (is_undefined()) return {};
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return float_repr(as_number());
  if (is_string()) return repr_string(as_string());
  if (is_list()) {
    std::string out = is_tuple() ? "(" : "[";
    for (size_t i = 0; i < list().size(); ++i) {
      if (i > 0) out += ", ";
      out += list()[i].repr();
    }
    if (is_tuple()) return out + (list().size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : dict().items) {
      if (!first) out += ", ";
      first = false;
      out += repr_string(k) + ": " + v.repr();
    }
    return out + "}";
  }
  return "<function " + callable().name + ">";
}

std::string Value::type_name() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  if (is_dict()) return "dict";
  return "function";
}

bool Value::operator==(const Value& o) const {
  const auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  const auto number = [](const Value& v) {
    return v.is_bool() ? double(v.as_bool()) : v.as_number();
  };
  if (numeric(*this) && numeric(o)) {
    if (is_int() && o.is_int()) return as_int() == o.as_int();
    return number(*this) == number(o);
  }
  if (v_.index() != o.v_.index()) return false;
  if (is_undefined() || is_none()) return true;
  if (is_string()) return as_string() == o.as_string();
  if (is_list()) return list() == o.list();
  if (is_dict()) {
    const Dict& a = dict();
    const Dict& b = o.dict();
    if (a.items.size() != b.items.size()) return false;
    for (const auto& [k, v] : a.items) {
      const Value* w = b.find(k);
      if (!w || !(v == *w)) return false;
    }
    return true;
  }
  return &callable() == &o.callable();
}

bool Value::less(const Value& o) const {
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    if (is_int() && o.is_int()) return as_int() < o.as_int();
    const double a = is_bool() ? double(as_bool()) : as_number();
    const double b = o.is_bool() ? double(o.as_bool()) : o.as_number();
    return a < b;
  }
  if (is_string() && o.is_string()) return as_string() < o.as_string();
  if (is_list() && o.is_list()) return compare_lists(list(), o.list()) < 0;
  throw Error("'<' not supported between instances of '" + type_name() + "' and '" + o.type_name() +
              "'");
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& item : items)
    if (item.first == key) return &item.second;
  return nullptr;
}

Value Dict::get(std::string_view key) const {
  const Value* v = find(key);
  return v ? *v : Value();
}

void Dict::set(std::string key, Value value) {
  for (auto& item : items)
    if (item.first == key) {
      item.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

bool Dict::erase(std::string_view key) {
  for (auto it = items.begin(); it != items.end(); ++it)
    if (it->first == key) {
      items.erase(it);
      return true;
    }
  return false;
}

Value Args::take(size_t index, std::string_view name, Value fallback) {
  used_.resize(keyword.size());
  if (index != SIZE_MAX) highest_ = std::max(highest_, index + 1);  // SIZE_MAX: keyword only
  for (size_t i = 0; i < keyword.size(); ++i)
    if (!name.empty() && keyword[i].first == name) {
      used_[i] = true;
      return keyword[i].second;
    }
  if (index < positional.size()) return positional[index];
  return fallback;
}

void Args::done() const {
  if (positional.size() > highest_)
    throw Error(callee + "() takes at most " + std::to_string(highest_) + " arguments (" +
                std::to_string(positional.size()) + " given)");
  for (size_t i = 0; i < keyword.size(); ++i)
    if (i >= used_.size() || !used_[i])
      throw Error(callee + "() got an unexpected keyword argument '" + keyword[i].first + "'");
}

int64_t float_to_int(double d) {
  if (!(d > -9.2233720368547758e18 && d < 9.2233720368547758e18))
    throw Error("cannot convert float " + float_repr(d) + " to a 64-bit integer");
  return int64_t(d);
}

bool parse_int64(std::string_view digits, int64_t& out) {
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), out);
  return r.ec == std::errc() && r.ptr == digits.data() + digits.size() && !digits.empty();
}

std::string to_json(const Value& value, int indent, bool sort_keys) {
  std::string out;
  append_json(out, value, indent, sort_keys, 0);
  return out;
}

}  // namespace troupe::jinja
