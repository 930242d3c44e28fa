#include "grammar/json_schema.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/number_range.h"
#include "grammar/regex.h"

namespace troupe::grammar {

namespace {

using json = nlohmann::ordered_json;

// The rules every JSON grammar shares. Between tokens of the JSON at most
// one space: compact JSON, as OpenAI's structured outputs write it. Looser
// whitespace (llama.cpp allows a newline and 20 spaces or tabs, xgrammar any)
// lets a weak model spend its max_tokens on padding and end with a cut text.
// Numbers as llama.cpp's.
const char* const kCommonRules = R"(space ::= " "?
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\"" space
json-int ::= "-"? ([0-9] | [1-9] [0-9]{0,15})
json-nat ::= [0-9] | [1-9] [0-9]{0,15}
json-frac ::= "." [0-9]{1,16}
json-exp ::= [eE] [-+]? [0-9]{1,16}
json-integer ::= json-int space
json-number ::= json-int json-frac? json-exp? space
json-boolean ::= ("true" | "false") space
json-null ::= "null" space
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" space (json-string ":" space json-value ("," space json-string ":" space json-value)*)? "}" space
json-array ::= "[" space (json-value ("," space json-value)*)? "]" space
json-digit2 ::= [0-9] [0-9]
json-date ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])
json-time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
json-hex4 ::= [0-9a-fA-F]{4}
)";

const std::set<std::string> kAnnotations = {
    "title", "description", "default",    "examples",  "$schema",
    "$id",   "$comment",    "deprecated", "readOnly",  "writeOnly",
    "$defs", "definitions", "strict",     "nullable_", "discriminator"};

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& root) : root_(root) {}

  std::string compile() {
    const std::string top = expr(root_, "", 0);
    return "root ::= " + top + "\n" + rules_ + kCommonRules;
  }

 private:
  const json& root_;
  std::string rules_;
  int next_ = 0;
  std::map<std::string, std::string> refs_;  // $ref -> its rule's name

  [[noreturn]] static void fail(const std::string& where, const std::string& what) {
    throw SchemaError("json schema" + (where.empty() ? std::string() : " at " + where) + ": " +
                      what);
  }
  static std::string at(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }

  std::string next_name() {
    std::string name = "s";  // (not "s" + ...: GCC 12 warns wrongly of an overlap)
    name += std::to_string(next_++);
    return name;
  }
  std::string rule(const std::string& body) {
    const std::string name = next_name();
    rules_ += name + " ::= " + body + "\n";
    return name;
  }

  static std::string literal_value(const json& v) {
    return gbnf_literal(v.dump(-1, ' ', false, json::error_handler_t::strict)) + " space";
  }

  // A GBNF expression for the values the schema allows.
  std::string expr(const json& s, const std::string& where, int depth) {
    if (depth > 64) fail(where, "nested more than 64 levels");
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(where, "the schema false allows nothing");
      return "json-value";
    }
    if (!s.is_object()) fail(where, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      static const std::set<std::string> known = {"type",
                                                  "properties",
                                                  "required",
                                                  "additionalProperties",
                                                  "items",
                                                  "prefixItems",
                                                  "minItems",
                                                  "maxItems",
                                                  "enum",
                                                  "const",
                                                  "anyOf",
                                                  "oneOf",
                                                  "allOf",
                                                  "$ref",
                                                  "minLength",
                                                  "maxLength",
                                                  "format",
                                                  "minimum",
                                                  "exclusiveMinimum",
                                                  "maximum",
                                                  "exclusiveMaximum",
                                                  "pattern",
                                                  "multipleOf"};
      if (!known.count(k) && !kAnnotations.count(k))
        fail(at(where, k), "'" + k + "' is not supported in structured output");
      (void)v;
    }
    if (s.contains("$ref")) return ref(s["$ref"], at(where, "$ref"), depth);
    if (s.contains("const")) return "(" + literal_value(s["const"]) + ")";
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(at(where, "enum"), "must be a non-empty array");
      std::string alts;
      for (const json& v : e) alts += (alts.empty() ? "" : " | ") + literal_value(v);
      return "(" + alts + ")";
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) {
        const json& list = s[key];
        if (!list.is_array() || list.empty())
          fail(at(where, key), "must be a non-empty array of schemas");
        std::string alts;
        for (size_t i = 0; i < list.size(); ++i)
          alts +=
              (i ? " | " : "") + expr(merged(s, list[i], key),
                                      at(where, key) + "[" + std::to_string(i) + "]", depth + 1);
        return "(" + alts + ")";
      }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1)
        fail(at(where, "allOf"), "only an allOf of one schema is supported");
      return expr(merged(s, list[0], "allOf"), at(where, "allOf[0]"), depth + 1);
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("additionalProperties"))
        return object(s, where, depth);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, where, depth);
      // Keywords of a type bind the values of that type: any value, those
      // of their type under them.
      for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                              "multipleOf", "minLength", "maxLength", "pattern", "format"})
        if (s.contains(key)) {
          std::string alts;
          for (const char* t : {"string", "number", "boolean", "null", "object", "array"})
            alts += (alts.empty() ? "" : " | ") + typed(s, t, where, depth);
          return "(" + alts + ")";
        }
      return "json-value";
    }
    const json& type = s["type"];
    if (type.is_array()) {
      if (type.empty()) fail(at(where, "type"), "an empty list of types allows nothing");
      std::string alts;
      for (const json& t : type) {
        if (!t.is_string()) fail(at(where, "type"), "types must be strings");
        alts += (alts.empty() ? "" : " | ") + typed(s, t.get<std::string>(), where, depth);
      }
      return "(" + alts + ")";
    }
    if (!type.is_string()) fail(at(where, "type"), "must be a string or a list of strings");
    return typed(s, type.get<std::string>(), where, depth);
  }

  // The schema's own keywords, less `key`, with those of `branch` over them:
  // {"type": "object", "anyOf": [{"required": [...]}]} reads as the branches.
  static json merged(const json& s, const json& branch, const char* key) {
    json out = s;
    out.erase(key);
    if (!branch.is_object()) return branch;
    for (const auto& [k, v] : branch.items()) out[k] = v;
    return out;
  }

  std::string ref(const json& r, const std::string& where, int depth) {
    if (!r.is_string()) fail(where, "must be a string");
    const std::string target = r.get<std::string>();
    auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    const json* node = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (target.rfind(p, 0) == 0) {
        const std::string section = p.substr(2, p.size() - 3);
        const std::string name = target.substr(p.size());
        if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
          node = &root_[section][name];
      }
    }
    if (target == "#") node = &root_;
    if (!node) fail(where, "'" + target + "' names no schema under #/$defs or #/definitions");
    // The rule's name is known before its body, so recursion refers to it.
    const std::string name = next_name();
    refs_[target] = name;
    const std::string body = expr(*node, target, depth + 1);
    rules_ += name + " ::= " + body + "\n";
    return name;
  }

  std::string typed(const json& s, const std::string& type, const std::string& where, int depth) {
    if (type == "object") return object(s, where, depth);
    if (type == "array") return array(s, where, depth);
    if (type == "string") return string(s, where);
    if (type == "integer") return integer(s, where);
    if (type == "number") return number(s, where);
    if (type == "boolean") return "json-boolean";
    if (type == "null") return "json-null";
    fail(at(where, "type"), "unknown type '" + type + "'");
  }

  // A schema's minimum, maximum and their exclusive forms, exactly as its
  // text writes them, the tighter of two on one side. A bound past every
  // number a grammar writes (16 digits before the point) on its open side is
  // no bound (zod writes an integer's as +-(2^53 - 1)); on the other, it
  // allows none.
  struct Bounds {
    std::optional<NumberBound> lo, hi;
  };
  static Bounds bounds(const json& s, const std::string& where) {
    Bounds out;
    auto bound = [&](const char* key, bool lower, bool exclusive) {
      if (!s.contains(key)) return;
      if (!s[key].is_number()) fail(at(where, key), "must be a number");
      NumberBound b;
      try {
        b.value = parse_decimal(s[key].dump());
      } catch (const std::invalid_argument& e) {
        fail(at(where, key), e.what());
      }
      b.inclusive = !exclusive;
      if (b.value.whole.size() > kMaxDigits) {
        if (b.value.negative == lower) return;
        fail(at(where, key), "allows no number of at most 16 digits before the point");
      }
      std::optional<NumberBound>& slot = lower ? out.lo : out.hi;
      if (!slot || (lower ? is_looser(slot->value, slot->inclusive, b.value, b.inclusive)
                          : is_looser(b.value, !b.inclusive, slot->value, !slot->inclusive)))
        slot = b;
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    return out;
  }
  static constexpr size_t kMaxDigits = 16;  // json-int's, json-frac's

  // Whether the lower bound (a, a_inclusive) is looser than (b,
  // b_inclusive): a < b, or equal with a inclusive and b not. (Upper bounds
  // ask it with the inclusions turned.)
  static bool is_looser(const Decimal& a, bool a_inclusive, const Decimal& b, bool b_inclusive) {
    const int c = compare(a, b);
    return c < 0 || (c == 0 && a_inclusive && !b_inclusive);
  }
  static int compare(const Decimal& a, const Decimal& b) {
    if (a.negative != b.negative) return a.negative ? -1 : 1;
    const int sign = a.negative ? -1 : 1;
    if (a.whole.size() != b.whole.size()) return a.whole.size() < b.whole.size() ? -sign : sign;
    if (a.whole != b.whole) return a.whole < b.whole ? -sign : sign;
    if (a.fraction != b.fraction) return a.fraction < b.fraction ? -sign : sign;
    return 0;
  }

  // Numbers in the range, spelled digit by digit without an exponent (which
  // no bound needs).
  std::string number(const json& s, const std::string& where) {
    // A multiple of a whole step is a whole number.
    if (s.contains("multipleOf")) return integer(s, where);
    const Bounds b = bounds(s, where);
    if (!b.lo && !b.hi) return "json-number";
    for (const auto* x : {&b.lo, &b.hi})
      if (*x && (*x)->value.fraction.size() > kMaxDigits)
        fail(where.empty() ? "minimum" : where, "bounds finer than 10^-16 are not supported");
    const std::string range = decimal_range(b.lo, b.hi);
    if (range.empty()) fail(where.empty() ? "minimum" : where, "the bounds allow no number");
    return "(" + range + " space)";
  }

  // The first (lower) or last (upper) integer within a bound.
  static int64_t integer_edge(const NumberBound& b, bool lower) {
    const int64_t whole = std::stoll(b.value.whole);
    const int64_t v = b.value.negative ? -whole : whole;  // toward zero
    const bool part = !b.value.fraction.empty();
    const int64_t floor = part && b.value.negative ? v - 1 : v;
    const int64_t ceil = part && !b.value.negative ? v + 1 : v;
    if (lower) return b.inclusive ? ceil : floor + 1;
    return b.inclusive ? floor : ceil - 1;
  }

  // Integers in [min, max] (either side open), from minimum, maximum and
  // their exclusive forms, spelled digit by digit as JSON writes them.
  std::string integer(const json& s, const std::string& where) {
    constexpr int64_t kLargest = 9'999'999'999'999'999;  // json-int's 16 digits
    const Bounds b = bounds(s, where);
    const int64_t step = multiple_of(s, where);
    if (!b.lo && !b.hi && step == 1) return "json-integer";
    std::optional<int64_t> lo, hi;
    if (b.lo) lo = integer_edge(*b.lo, true);
    if (b.hi) hi = integer_edge(*b.hi, false);
    if ((lo && hi && *lo > *hi) || (lo && *lo > kLargest) || (hi && *hi < -kLargest))
      fail(where.empty() ? "minimum" : where, "the bounds allow no integer");
    std::vector<std::string> alts;
    if (!hi || *hi >= 0) {
      const std::string m = magnitudes(lo ? std::max<int64_t>(*lo, 0) : 0, hi, step, where);
      if (!m.empty()) alts.push_back(m);
    }
    if (!lo || *lo < 0) {
      // -1 .. -n: "-" and a positive number from max(1, -hi) up to -lo.
      const int64_t from = hi && *hi < 0 ? -*hi : 1;
      std::optional<int64_t> to;
      if (lo) to = -*lo;
      const std::string m = magnitudes(from, to, step, where);
      if (!m.empty()) alts.push_back("\"-\" " + m);
    }
    if (alts.empty()) fail(where.empty() ? "multipleOf" : where, "the bounds allow no multiple");
    std::string out;
    for (const std::string& a : alts) out += (out.empty() ? "" : " | ") + a;
    return "((" + out + ") space)";
  }

  // multipleOf: a whole step (1 when absent).
  static int64_t multiple_of(const json& s, const std::string& where) {
    if (!s.contains("multipleOf")) return 1;
    const json& v = s["multipleOf"];
    Decimal d;
    if (v.is_number()) d = parse_decimal(v.dump());
    if (!v.is_number() || d.negative || !d.fraction.empty() || d.whole == "0" ||
        d.whole.size() > 5 || std::stoll(d.whole) > kMaxStep)
      fail(at(where, "multipleOf"), "only whole steps from 1 to 10000 are supported");
    return std::stoll(d.whole);
  }
  static constexpr int64_t kMaxStep = 10000;
  static constexpr int64_t kMaxListed = 512;

  // Non-negative integers in [from, to] (to absent: any) that are multiples
  // of step, or "" for none: listed when bounded, else read digit by digit
  // by their remainder.
  std::string magnitudes(int64_t from, std::optional<int64_t> to, int64_t step,
                         const std::string& where) {
    if (step == 1) return natural_range(from, to);
    const int64_t first = (from + step - 1) / step * step;
    if (to) {
      if (first > *to) return "";
      if ((*to - first) / step >= kMaxListed)
        fail(at(where, "multipleOf"),
             "with bounds holding more than 512 multiples is not supported");
      std::string out;
      for (int64_t v = first; v <= *to; v += step)
        out += (out.empty() ? "" : " | ") + gbnf_literal(std::to_string(v));
      return "(" + out + ")";
    }
    if (from > step)
      fail(at(where, "multipleOf"), "with a lower bound past the first multiple is not supported");
    return multiples(step, from == 0);
  }

  // The multiples of k as JSON writes them (zero only `with_zero`): each
  // rule one remainder of the digits so far, the number ending only at 0.
  std::string multiples(int64_t k, bool with_zero) {
    const std::string base = next_name();
    auto name = [&](int64_t r) { return base + "-" + std::to_string(r); };
    // Digits that take remainder r to each next one, as a class.
    auto after = [&](int64_t r, int first_digit) {
      std::map<int64_t, std::string> by_next;
      for (int d = first_digit; d <= 9; ++d) by_next[(r * 10 + d) % k] += char('0' + d);
      std::string out;
      for (const auto& [next, digits] : by_next)
        out.append(out.empty() ? "[" : " | [").append(digits).append("] ").append(name(next));
      return out;
    };
    for (int64_t r = 0; r < k; ++r)
      rules_ += name(r) + " ::= " + after(r, 0) + (r == 0 ? " | \"\"" : "") + "\n";
    return "(" + std::string(with_zero ? "\"0\" | " : "") + after(0, 1) + ")";
  }

  static int count(const json& s, const char* key, const std::string& where) {
    if (!s.contains(key)) return -1;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > 4096)
      fail(at(where, key), "must be an integer in [0, 4096]");
    return int(v.get<long long>());
  }

  std::string string(const json& s, const std::string& where) {
    const int min = count(s, "minLength", where), max = count(s, "maxLength", where);
    if (s.contains("pattern")) {
      // With a pattern, a format is what JSON Schema makes it by default, an
      // annotation: zod writes both for its dates, e-mails and uuids, the
      // pattern being the stricter.
      if (!s["pattern"].is_string()) fail(at(where, "pattern"), "must be a string");
      if (max >= 0 && min > max) fail(at(where, "minLength"), "is more than maxLength");
      try {
        return "(\"\\\"\" " +
               regex_to_gbnf(s["pattern"].get<std::string>(), true, RegexLength{min, max}) +
               " \"\\\"\" space)";
      } catch (const GrammarError& e) {
        fail(at(where, "pattern"), e.what());
      }
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail(at(where, "format"), "must be a string");
      const std::string f = s["format"].get<std::string>();
      if (f == "date") return "(\"\\\"\" json-date \"\\\"\" space)";
      if (f == "time") return "(\"\\\"\" json-time \"\\\"\" space)";
      if (f == "date-time") return "(\"\\\"\" json-date \"T\" json-time \"\\\"\" space)";
      if (f == "uuid")
        return "(\"\\\"\" json-hex4 json-hex4 \"-\" json-hex4 \"-\" json-hex4 \"-\" json-hex4 "
               "\"-\" json-hex4 json-hex4 json-hex4 \"\\\"\" space)";
      // OpenAI's other string formats but duration and ipv6: an e-mail
      // address as a dot-atom at a domain of labels (RFC 5322's common form),
      // IPv4 in dotted decimal, a hostname of RFC 1123 labels.
      static const std::map<std::string, std::string> kFormatPatterns = {
          {"email",
           R"([A-Za-z0-9_'+\-]+(?:\.[A-Za-z0-9_'+\-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,})"},
          {"ipv4",
           R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
          {"hostname",
           R"([A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*)"},
      };
      if (const auto it = kFormatPatterns.find(f); it != kFormatPatterns.end())
        return "(\"\\\"\" " + regex_to_gbnf(it->second, true) + " \"\\\"\" space)";
    }
    if (min < 0 && max < 0) return "json-string";
    if (max >= 0 && min > max) fail(at(where, "minLength"), "is more than maxLength");
    const std::string reps =
        "{" + std::to_string(min < 0 ? 0 : min) + "," + (max < 0 ? "" : std::to_string(max)) + "}";
    return "(\"\\\"\" json-char" + reps + " \"\\\"\" space)";
  }

  std::string array(const json& s, const std::string& where, int depth) {
    int min = count(s, "minItems", where);
    const int max = count(s, "maxItems", where);
    if (min < 0) min = 0;
    if (max >= 0 && min > max) fail(at(where, "minItems"), "is more than maxItems");
    std::vector<std::string> fixed;  // prefixItems
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) fail(at(where, "prefixItems"), "must be an array of schemas");
      for (size_t i = 0; i < p.size(); ++i)
        fixed.push_back(
            expr(p[i], at(where, "prefixItems") + "[" + std::to_string(i) + "]", depth + 1));
    }
    std::string item = "json-value";
    bool more = true;  // items after the prefix
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>())
        more = false;
      else
        item = rule(expr(it, at(where, "items"), depth + 1));
    }
    if (fixed.empty()) {
      if (max == 0) return "(\"[\" space \"]\" space)";
      // first item, then "," item up to max - 1 more; at least min in all.
      const std::string tail_min = std::to_string(min > 0 ? min - 1 : 0);
      const std::string tail_max = max < 0 ? "" : std::to_string(max - 1);
      const std::string list =
          item + " (\",\" space " + item + "){" + tail_min + "," + tail_max + "}";
      return "(\"[\" space " + (min > 0 ? list : "(" + list + ")?") + " \"]\" space)";
    }
    // A tuple: the prefix items in order, the first `min` of them required.
    std::string body;
    const int n = int(fixed.size());
    if (min > n && !more) fail(at(where, "minItems"), "is more than prefixItems allows");
    // Nested optional tails: items k.. of the prefix, then the rest.
    std::string rest;
    if (more) {
      const int extra_min = min > n ? min - n : 0;
      const std::string extra_max = max < 0 ? "" : std::to_string(max > n ? max - n : 0);
      if (max < 0 || max > n)
        rest = "(\",\" space " + item + "){" + std::to_string(extra_min) + "," + extra_max + "}";
    }
    std::string tail = rest;
    for (int k = n - 1; k >= 1; --k) {
      const std::string piece = "\",\" space " + fixed[size_t(k)] + " " + tail;
      tail = k < min ? piece : "(" + piece + ")?";
    }
    body = fixed[0] + " " + tail;
    if (min == 0) body = "(" + body + ")?";
    return "(\"[\" space " + body + " \"]\" space)";
  }

  std::string object(const json& s, const std::string& where, int depth) {
    json props = s.contains("properties") ? s["properties"] : json::object();
    if (!props.is_object()) fail(at(where, "properties"), "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(at(where, "required"), "must be an array of names");
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail(at(where, "required"), "must be an array of names");
        const std::string name = r.get<std::string>();
        // A required key without a schema of its own takes
        // additionalProperties' (any value without one); none allowed
        // leaves no object that could have it.
        if (!props.contains(name)) {
          const json* ap =
              s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
          if (ap && ap->is_boolean() && !ap->get<bool>())
            fail(at(where, "required"), "'" + name +
                                            "' is required but neither among the properties nor "
                                            "allowed by additionalProperties: false");
          props[name] = ap && ap->is_object() ? *ap : json::object();
        }
        required.insert(name);
      }
    }
    // Other keys: a schema for their values, or none allowed.
    std::string extra;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>()))
        extra = "json-string \":\" space " +
                (ap.is_boolean() ? std::string("json-value")
                                 : rule(expr(ap, at(where, "additionalProperties"), depth + 1)));
    } else if (!s.contains("properties")) {
      extra = "json-string \":\" space json-value";
    }
    std::vector<std::pair<std::string, bool>> kvs;  // (key: value expression, required)
    for (const auto& [k, v] : props.items()) {
      const std::string value = expr(v, at(at(where, "properties"), k), depth + 1);
      kvs.emplace_back(gbnf_literal(json(k).dump()) + " space \":\" space " + value,
                       required.count(k) > 0);
    }
    // first_k: members from k on, none written yet; after_k: some written, so
    // the next one starts with a comma. Optional members may be skipped.
    std::string first = extra.empty() ? "" : "(" + extra + " (\",\" space " + extra + ")*)?";
    std::string after = extra.empty() ? "" : "(\",\" space " + extra + ")*";
    for (int k = int(kvs.size()) - 1; k >= 0; --k) {
      const auto& [kv, req] = kvs[size_t(k)];
      const std::string after_name = after.empty() ? "" : rule(after);
      const std::string first_name = req || first.empty() ? "" : rule(first);
      const std::string a = "\",\" space " + kv + (after_name.empty() ? "" : " " + after_name);
      const std::string f = kv + (after_name.empty() ? "" : " " + after_name);
      if (req) {
        first = f;
        after = a;
      } else {
        first = "(" + f + ")" + (first_name.empty() ? "?" : " | " + first_name);
        after = "(" + a + ")" + (after_name.empty() ? "?" : " | " + after_name);
      }
    }
    return "(\"{\" space " + (first.empty() ? "" : "(" + first + ") ") + "\"}\" space)";
  }
};

}  // namespace

std::string json_schema_grammar(const nlohmann::ordered_json& schema) {
  return SchemaCompiler(schema).compile();
}

std::string json_object_grammar() {
  return std::string("root ::= json-object\n") + kCommonRules;
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string alts;
  for (const std::string& c : choices) alts += (alts.empty() ? "" : " | ") + gbnf_literal(c);
  if (alts.empty()) alts = "\"\"";
  return "root ::= " + alts + "\n";
}

}  // namespace troupe::grammar
