// Structured output's grammar layer: GBNF read, matched code point by code
// point and token by token, and JSON Schema turned into grammars whose
// matches are valid JSON under the schema.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/number_range.h"
#include "grammar/regex.h"
#include "grammar/token_vocabulary.h"

namespace troupe::grammar {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> parse(const std::string& text) {
  return std::make_shared<const Grammar>(Grammar::parse(text));
}

// Whether the grammar matches the whole text (fed in one piece).
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.is_complete();
}

// ... and fed one byte at a time (code points split across "tokens").
bool matches_bytewise(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  for (char c : text)
    if (!m.accept(std::string(1, c))) return false;
  return m.is_complete();
}

std::string error_of(const std::string& text) {
  try {
    Grammar::parse(text);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Grammar, LiteralsClassesGroupsAndRepetitions) {
  auto g = parse(R"(root ::= "a" [b-d]+ ("x" | "yz")? digit{2,3} .
digit ::= [0-9]  # a comment
)");
  EXPECT_TRUE(matches(g, "ab12!"));
  EXPECT_TRUE(matches(g, "abcdyz123é"));
  EXPECT_TRUE(matches(g, "adx99\n"));
  EXPECT_FALSE(matches(g, "a12!"));     // [b-d]+ needs one
  EXPECT_FALSE(matches(g, "ab1!"));     // digit{2,3}
  EXPECT_FALSE(matches(g, "ab1234!"));  // at most 3 digits, then one char
  EXPECT_FALSE(matches(g, "abxy12!"));  // "yz" whole or not at all
  EXPECT_FALSE(matches(g, "ab12"));     // the last `.` is missing
  EXPECT_TRUE(matches_bytewise(g, "abcdyz123é"));
}

TEST(Grammar, NegatedClassesEscapesAndUnicode) {
  auto g = parse(R"(root ::= "\"" [^"\\\x00-\x1F]* "\"" "\u00e9" "\t" [\]\-]
)");
  EXPECT_TRUE(matches(g, "\"héllo 😀\"é\t]"));
  EXPECT_TRUE(matches(g, "\"\"é\t-"));
  EXPECT_FALSE(matches(g, "\"a\"b\"é\t]"));
  EXPECT_FALSE(matches(g, "\"a\nb\"é\t]"));
  EXPECT_TRUE(matches_bytewise(g, "\"😀 ☃\"é\t]"));
}

TEST(Grammar, RecursionAndMultiLineRules) {
  auto g = parse(R"(
root ::=
  list
list ::= "[" (
    item ("," item)*
  )? "]"
item ::= [0-9]+ | list
)");
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[1,[2,[]],33]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  EXPECT_FALSE(matches(g, "[[1]"));
}

TEST(Grammar, BadGrammarsAreRefusedNamingWhereAndWhy) {
  EXPECT_NE(error_of("rot ::= \"a\"\n").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= a\n").find("rule 'a' is used (line 1) but never defined"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\nx ::= \"b\"").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("root ::= [ab").find("unterminated character class"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("root ::= x \"a\"\nx ::= root | \"b\"").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= (\"\" | x) root\nx ::= \"a\"").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{99999}").find("repetition count"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(error_of("root ::= *").find("needs something before it"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  // Bounded: repetitions are spelled out, so their sum is what is bounded.
  std::string big = "root ::=";
  for (int i = 0; i < 300; ++i) big += " \"a\"{4000}";
  EXPECT_NE(error_of(big).find("too large"), std::string::npos);
}

TEST(Grammar, CompletionAndContinuation) {
  auto g = parse("root ::= \"ab\" \"c\"?\n");
  Matcher m(g);
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_TRUE(m.accept("a"));
  EXPECT_FALSE(m.accept("x"));  // refused: the state stays where it was
  EXPECT_TRUE(m.accept("b"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_TRUE(m.accept("c"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());
  EXPECT_FALSE(m.accept("c"));
}

TEST(Grammar, HalfACodePointWaitsForTheNextToken) {
  auto g = parse("root ::= \"é\" [a-z]\n");  // é is C3 A9
  Matcher m(g);
  EXPECT_FALSE(m.allows("\xC3\xA8"));  // è: a whole code point, not é
  EXPECT_TRUE(m.allows("\xC3"));       // the first byte of é (or è, ...)
  EXPECT_FALSE(m.allows("\xE2"));      // the first byte of a 3-byte one: never é
  ASSERT_TRUE(m.accept("\xC3"));
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.allows("\xA8x"));  // è
  EXPECT_TRUE(m.allows("\xA9x"));
  ASSERT_TRUE(m.accept("\xA9x"));
  EXPECT_TRUE(m.is_complete());
}

// The trie walk must allow exactly the tokens that, one by one, the matcher
// allows: checked on a vocabulary with shared prefixes, multi-byte text,
// split code points and control tokens, at every state of a few texts.
TEST(Grammar, AllowedTokensAreExactlyThoseTheMatcherAllowsOneByOne) {
  std::vector<std::string> bytes = {
      "<s>",  "</s>", "{",      "}",   "\"",  "\"a",  "\"ab", "a",        "ab", "abc",  ":",
      ",",    " ",    "\n",     "1",   "12",  "-",    "true", "tr",       "ue", "null", "é",
      "\xC3", "\xA9", "\xA9\"", "{\"", "\":", "\": ", "😀",    "\xF0\x9F", "x",  ""};
  std::vector<bool> control(bytes.size(), false);
  control[0] = control[1] = true;
  const TokenVocabulary vocab(bytes, control);
  auto g = std::make_shared<const Grammar>(Grammar::parse(json_object_grammar()));
  const std::vector<std::string> texts = {"{\"a\": true, \"ab\": -12}", "{\"é😀\": null}", "{ }"};
  // One mask cache for all: states met again are answered from it.
  auto cache = std::make_shared<MaskCache>(8);
  for (const std::string& text : texts) {
    Matcher m(g, cache);
    for (size_t i = 0; i <= text.size(); ++i) {
      std::vector<uint8_t> allowed;
      m.allowed_tokens(vocab, allowed);
      for (int id = 0; id < vocab.size(); ++id) {
        const bool one = !vocab.is_control(id) && m.allows(vocab.bytes(id));
        EXPECT_EQ(allowed[size_t(id)] != 0, one)
            << "token '" << vocab.bytes(id) << "' after '" << text.substr(0, i) << "'";
      }
      if (i < text.size()) {
        ASSERT_TRUE(m.accept(text.substr(i, 1))) << text.substr(0, i + 1);
      }
    }
    EXPECT_TRUE(m.is_complete()) << text;
  }
}

std::shared_ptr<const Grammar> schema(const json& s) {
  return std::make_shared<const Grammar>(Grammar::parse(json_schema_grammar(s)));
}

TEST(JsonSchemaGrammar, ObjectsTakeTheirPropertiesInOrderRequiredOnesAlways) {
  auto g = schema(json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name"]})"));
  EXPECT_TRUE(matches(g, R"({"name": "Ann"})"));
  EXPECT_TRUE(matches(g, R"({"name": "Ann", "age": 31, "tags": ["a", "b"]})"));
  EXPECT_TRUE(matches(g, R"({"name":"Ann","tags":[]})"));
  EXPECT_TRUE(matches(g, "{ \"name\" : \"A\\u00e9\\n\" , \"age\": -4 }"));
  // Compact: one space at most between tokens, no newlines.
  EXPECT_FALSE(matches(g, "{\n  \"name\": \"A\"\n}"));
  EXPECT_FALSE(matches(g, "{  \"name\": \"A\"}"));
  EXPECT_FALSE(matches(g, R"({"age": 31})"));                  // name is required
  EXPECT_FALSE(matches(g, R"({"age": 31, "name": "Ann"})"));   // declared order
  EXPECT_FALSE(matches(g, R"({"name": "Ann", "x": 1})"));      // no other keys
  EXPECT_FALSE(matches(g, R"({"name": "Ann", "age": 3.5})"));  // an integer
  EXPECT_FALSE(matches(g, R"({"name": "Ann",})"));
  EXPECT_FALSE(matches(g, R"({"name": "A"B"})"));
  EXPECT_FALSE(matches(g, "{\"name\": \"a\nb\"}"));  // raw control characters are not JSON
}

TEST(JsonSchemaGrammar, EnumsConstsUnionsRefsAndArrays) {
  auto g = schema(json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"enum": ["x", 1, null]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
      "required": ["v"]}},
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"},
                   "kind": {"const": "tree"},
                   "size": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                   "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                            "items": false, "minItems": 2}},
    "required": ["root", "kind", "size", "pair"]})"));
  EXPECT_TRUE(matches(
      g,
      R"({"root": {"v": "x", "kids": [{"v": 1}, {"v": null, "kids": []}]}, "kind": "tree", "size": 3, "pair": ["a", true]})"));
  EXPECT_TRUE(
      matches(g, R"({"root": {"v": 1}, "kind": "tree", "size": null, "pair": ["", false]})"));
  EXPECT_FALSE(matches(g, R"({"root": {"v": 2}, "kind": "tree", "size": 3, "pair": ["a", true]})"));
  EXPECT_FALSE(matches(g, R"({"root": {"v": 1}, "kind": "bush", "size": 3, "pair": ["a", true]})"));
  EXPECT_FALSE(
      matches(g, R"({"root": {"v": 1}, "kind": "tree", "size": -3, "pair": ["a", true]})"));
  EXPECT_FALSE(matches(g, R"({"root": {"v": 1}, "kind": "tree", "size": 3, "pair": ["a"]})"));
  EXPECT_FALSE(
      matches(g, R"({"root": {"v": 1}, "kind": "tree", "size": 3, "pair": ["a", true, 1]})"));
  EXPECT_FALSE(matches(
      g,
      R"({"root": {"v": 1, "kids": [{"v": 1}, {"v": 1}, {"v": 1}]}, "kind": "tree", "size": 3, "pair": ["a", true]})"));
}

TEST(JsonSchemaGrammar, StringLengthsFormatsAndOpenObjects) {
  auto g = schema(json::parse(R"({"type": "object", "properties": {
      "code": {"type": "string", "minLength": 2, "maxLength": 3},
      "day": {"type": "string", "format": "date"},
      "id": {"type": "string", "format": "uuid"},
      "extra": {"type": "object"}},
    "required": ["code", "day", "id", "extra"], "additionalProperties": {"type": "number"}})"));
  const std::string base = R"("day": "2026-12-06", "id": "123e4567-e89b-12d3-a456-426614174000")";
  EXPECT_TRUE(matches(g, "{\"code\": \"ab\", " + base + R"(, "extra": {"any": [1, {}]}})"));
  EXPECT_TRUE(matches(g, "{\"code\": \"abc\", " + base + R"(, "extra": {}, "more": 1.5e3})"));
  EXPECT_FALSE(matches(g, "{\"code\": \"a\", " + base + R"(, "extra": {}})"));
  EXPECT_FALSE(matches(g, "{\"code\": \"abcd\", " + base + R"(, "extra": {}})"));
  EXPECT_FALSE(matches(g, "{\"code\": \"ab\", " + base + R"(, "extra": {}, "more": "x"})"));
  EXPECT_FALSE(matches(
      g,
      R"({"code": "ab", "day": "2026-13-06", "id": "123e4567-e89b-12d3-a456-426614174000", "extra": {}})"));
}

// A required key without a schema of its own takes additionalProperties'
// (any value without one), as JSON Schema reads it.
TEST(JsonSchemaGrammar, RequiredKeysWithoutPropertiesTakeAdditionalProperties) {
  auto any = schema(json::parse(R"({"type": "object", "required": ["x"]})"));
  EXPECT_TRUE(matches(any, R"({"x": [1, "a"]})"));
  EXPECT_TRUE(matches(any, R"({"x": null, "y": 2})"));
  EXPECT_FALSE(matches(any, R"({"y": 2})"));
  EXPECT_FALSE(matches(any, "{}"));
  auto numbers = schema(json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}},
      "required": ["n"], "additionalProperties": {"type": "number"}})"));
  EXPECT_TRUE(matches(numbers, R"({"a": "s", "n": 2})"));
  EXPECT_TRUE(matches(numbers, R"({"n": 2.5})"));
  EXPECT_FALSE(matches(numbers, R"({"n": "two"})"));
  EXPECT_FALSE(matches(numbers, R"({"a": "s"})"));
}

// minimum, maximum and their exclusive forms on integers: exactly the
// integers in the range match, checked number by number around its edges.
TEST(JsonSchemaGrammar, IntegerBoundsAllowExactlyTheIntegersInRange) {
  struct Range {
    const char* schema;
    long lo, hi;  // inclusive; kOpen for none
  };
  constexpr long kOpen = 1L << 60;
  const std::vector<Range> ranges = {
      {R"({"type": "integer", "minimum": 1, "maximum": 5})", 1, 5},
      {R"({"type": "integer", "minimum": 0, "maximum": 100})", 0, 100},
      {R"({"type": "integer", "minimum": 7, "maximum": 1234})", 7, 1234},
      {R"({"type": "integer", "minimum": 95, "maximum": 205})", 95, 205},
      {R"({"type": "integer", "minimum": -42, "maximum": 17})", -42, 17},
      {R"({"type": "integer", "minimum": -300, "maximum": -120})", -300, -120},
      {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", 1, 9},
      {R"({"type": "integer", "minimum": 2.5, "maximum": 8.5})", 3, 8},
      {R"({"type": "integer", "minimum": 18})", 18, kOpen},
      {R"({"type": "integer", "maximum": -3})", -kOpen, -3},
      {R"({"type": "integer", "maximum": 12})", -kOpen, 12},
  };
  for (const Range& r : ranges) {
    auto g = schema(json::parse(r.schema));
    const long from = (r.lo == -kOpen ? r.hi : r.lo) - 150;
    const long to = (r.hi == kOpen ? r.lo : r.hi) + 1500;
    for (long v = from; v <= to; ++v) {
      const bool in = (r.lo == -kOpen || v >= r.lo) && (r.hi == kOpen || v <= r.hi);
      ASSERT_EQ(matches(g, std::to_string(v)), in) << r.schema << ": " << v;
    }
    EXPECT_FALSE(matches(g, "007")) << r.schema;
    EXPECT_FALSE(matches(g, "-0")) << r.schema;
  }
  EXPECT_TRUE(
      matches(schema(json::parse(R"({"type": "integer", "minimum": 18})")), "9999999999999999"));
  // zod's z.number().int(): the safe integers, bounds exact past a double's.
  auto safe = schema(json::parse(
      R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})"));
  for (const char* in : {"9007199254740991", "-9007199254740991", "0", "-17", "999999999999999"})
    EXPECT_TRUE(matches(safe, in)) << in;
  for (const char* out : {"9007199254740992", "-9007199254740992", "9999999999999999"})
    EXPECT_FALSE(matches(safe, out)) << out;
  auto exact = schema(json::parse(R"({"type": "integer", "exclusiveMaximum": 9007199254740993})"));
  EXPECT_TRUE(matches(exact, "9007199254740992"));
  EXPECT_FALSE(matches(exact, "9007199254740993"));
  auto wide = schema(json::parse(R"({"type": "integer", "minimum": 5, "maximum": 1e20})"));
  EXPECT_TRUE(matches(wide, "9999999999999999"));
  EXPECT_FALSE(matches(wide, "4"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type": "integer", "minimum": 1e20})")),
               SchemaError);
  EXPECT_THROW(json_schema_grammar(
                   json::parse(R"({"type": "integer", "exclusiveMinimum": 9999999999999999})")),
               SchemaError);
  EXPECT_THROW(
      json_schema_grammar(json::parse(R"({"type": "integer", "minimum": 5, "maximum": 4})")),
      SchemaError);
}

// minimum, maximum and their exclusive forms on numbers: exactly the numbers
// in the range match, checked on every number of up to two decimals (and
// some of three) from -12.99 to 12.99, against the bounds in thousandths.
TEST(JsonSchemaGrammar, NumberBoundsAllowExactlyTheNumbersInRange) {
  struct Range {
    const char* schema;
    std::optional<long> lo, hi;  // in thousandths
    bool lo_in = true, hi_in = true;
  };
  const std::vector<Range> ranges = {
      {R"({"minimum": 0.5, "maximum": 2.25})", 500, 2250},
      {R"({"exclusiveMinimum": 0, "exclusiveMaximum": 1})", 0, 1000, false, false},
      {R"({"minimum": -1.5, "maximum": 1.5})", -1500, 1500},
      {R"({"minimum": -3.75, "exclusiveMaximum": -1.2})", -3750, -1200, true, false},
      {R"({"minimum": 1, "maximum": 1})", 1000, 1000},
      {R"({"minimum": 0.1, "maximum": 0.1})", 100, 100},
      {R"({"minimum": 2.5})", 2500, std::nullopt},
      {R"({"exclusiveMaximum": -0.25})", std::nullopt, -250, true, false},
      {R"({"minimum": 0, "maximum": 1})", 0, 1000},
      {R"({"exclusiveMinimum": 9.999, "maximum": 10.001})", 9999, 10001, false, true},
      {R"({"minimum": 0.125, "exclusiveMaximum": 0.126})", 125, 126, true, false},
      {R"({"maximum": 0})", std::nullopt, 0},
      {R"({"exclusiveMinimum": -2, "maximum": 11.5})", -2000, 11500, false, true},
      {R"({"minimum": 3, "exclusiveMinimum": 3, "maximum": 5, "exclusiveMaximum": 4.5})", 3000,
       4500, false, false},
      {R"({"minimum": 1e-2, "maximum": 12e-1})", 10, 1200},
  };
  std::vector<std::string> fractions = {"",    "001", "005", "125", "250", "255",
                                        "333", "500", "749", "750", "751", "999"};
  for (int f = 0; f < 100; ++f) {
    if (f < 10) fractions.push_back(std::to_string(f));
    fractions.push_back(std::string(f < 10 ? "0" : "").append(std::to_string(f)));
  }
  for (const Range& r : ranges) {
    json sch = json::parse(r.schema);
    sch["type"] = "number";
    auto g = schema(sch);
    for (const char* sign : {"", "-"})
      for (int whole = 0; whole <= 12; ++whole)
        for (const std::string& frac : fractions) {
          std::string text = std::string(sign).append(std::to_string(whole));
          if (!frac.empty()) text.append(".").append(frac);
          long v = whole * 1000 + (frac.empty() ? 0 : std::stol((frac + "000").substr(0, 3)));
          if (*sign) v = -v;
          bool in = (!r.lo || (r.lo_in ? v >= *r.lo : v > *r.lo)) &&
                    (!r.hi || (r.hi_in ? v <= *r.hi : v < *r.hi));
          if (*sign && v == 0) in = false;  // "-0" is never written
          ASSERT_EQ(matches(g, text), in) << r.schema << ": " << text;
        }
    EXPECT_FALSE(matches(g, "01")) << r.schema;
  }
  // Past the thousandths, and far out.
  auto g =
      schema(json::parse(R"({"type": "number", "minimum": 0.125, "exclusiveMaximum": 0.126})"));
  EXPECT_TRUE(matches(g, "0.12500000000001"));
  EXPECT_TRUE(matches(g, "0.1259999"));
  EXPECT_FALSE(matches(g, "0.1249999"));
  EXPECT_FALSE(matches(g, "1.25e-1")) << "a bounded number has no exponent";
  g = schema(json::parse(R"({"type": "number", "exclusiveMinimum": 0})"));
  EXPECT_TRUE(matches(g, "9999999999999999.5"));
  EXPECT_TRUE(matches(g, "0.0000000000000001"));
  EXPECT_FALSE(matches(g, "0.0000000000000000"));
  // As pydantic writes a confloat(ge=0, le=1) field.
  g = schema(json::parse(R"({"type": "object", "properties": {"p": {"type": "number",
      "minimum": 0, "maximum": 1, "title": "P"}}, "required": ["p"]})"));
  EXPECT_TRUE(matches(g, R"({"p": 0.75})"));
  EXPECT_TRUE(matches(g, R"({"p": 1})"));
  EXPECT_FALSE(matches(g, R"({"p": 1.01})"));
  EXPECT_FALSE(matches(g, R"({"p": -0.5})"));
  EXPECT_THROW(json_schema_grammar(
                   json::parse(R"({"type": "number", "minimum": 3, "exclusiveMaximum": 3})")),
               SchemaError);
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type": "number", "minimum": 1e-20})")),
               SchemaError);
  // Bounds past every number written are none on their open side.
  g = schema(json::parse(R"({"type": "number", "maximum": 1e300})"));
  EXPECT_TRUE(matches(g, "-123.5e7"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"type": "number", "minimum": 1e300})")),
               SchemaError);
}

// multipleOf (whole steps): exactly the multiples, unbounded (read digit by
// digit by their remainder) or within bounds (listed).
TEST(JsonSchemaGrammar, MultipleOfAllowsExactlyTheMultiples) {
  struct Case {
    const char* schema;
    long step, lo, hi;  // the range checked is [lo, hi]
    std::optional<long> min, max;
  };
  const std::vector<Case> cases = {
      {R"({"type": "integer", "multipleOf": 5})", 5, -300, 300, std::nullopt, std::nullopt},
      {R"({"type": "integer", "multipleOf": 3, "minimum": 0})", 3, -60, 400, 0, std::nullopt},
      {R"({"type": "integer", "multipleOf": 7, "minimum": 1})", 7, -60, 400, 1, std::nullopt},
      {R"({"type": "integer", "multipleOf": 12, "exclusiveMaximum": 0})", 12, -400, 60,
       std::nullopt, -1},
      {R"({"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100})", 5, -50, 200, 0,
       100},
      {R"({"type": "number", "multipleOf": 25, "minimum": -80.5, "maximum": 130})", 25, -200, 300,
       -80, 130},
      {R"({"type": "integer", "multipleOf": 1, "minimum": 2})", 1, -20, 40, 2, std::nullopt},
      {R"({"type": "integer", "multipleOf": 13})", 13, 0, 3000, std::nullopt, std::nullopt},
  };
  for (const Case& c : cases) {
    auto g = schema(json::parse(c.schema));
    for (long v = c.lo; v <= c.hi; ++v) {
      const bool in = v % c.step == 0 && (!c.min || v >= *c.min) && (!c.max || v <= *c.max);
      ASSERT_EQ(matches(g, std::to_string(v)), in) << c.schema << ": " << v;
    }
    EXPECT_FALSE(matches(g, "-0")) << c.schema;
    EXPECT_FALSE(matches(g, "0" + std::to_string(c.step))) << c.schema;
  }
  for (const char* refused :
       {R"({"type": "number", "multipleOf": 0.5})", R"({"type": "integer", "multipleOf": 0})",
        R"({"type": "integer", "multipleOf": 20000})",
        R"({"type": "integer", "multipleOf": 5, "minimum": 11})",
        R"({"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100000})",
        R"({"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 4})"})
    EXPECT_THROW(json_schema_grammar(json::parse(refused)), SchemaError) << refused;
}

// Without a type, the keywords of a type bind the values of that type.
TEST(JsonSchemaGrammar, KeywordsOfATypeBindItsValuesWithoutAType) {
  auto g = schema(json::parse(R"({"minimum": 3, "maxLength": 2})"));
  EXPECT_TRUE(matches(g, "5"));
  EXPECT_FALSE(matches(g, "2"));
  EXPECT_TRUE(matches(g, R"("ab")"));
  EXPECT_FALSE(matches(g, R"("abc")"));
  EXPECT_TRUE(matches(g, "true"));
  EXPECT_TRUE(matches(g, R"({"x": [1, 2]})"));
}

TEST(NumberRange, DecimalsAreReadExactlyAsJsonWritesThem) {
  auto text = [](const std::string& t) {
    const Decimal d = parse_decimal(t);
    return std::string(d.negative ? "-" : "") + d.whole + "|" + d.fraction;
  };
  EXPECT_EQ(text("0"), "0|");
  EXPECT_EQ(text("-0.0"), "0|");
  EXPECT_EQ(text("12.50"), "12|5");
  EXPECT_EQ(text("-0.125"), "-0|125");
  EXPECT_EQ(text("1e-05"), "0|00001");
  EXPECT_EQ(text("2.5E+3"), "2500|");
  EXPECT_EQ(text("1234e-2"), "12|34");
  EXPECT_EQ(text("007"), "7|");
  for (const char* bad : {"", "-", "1.", ".5", "1e", "1e+", "0x1", "1.5.2", "1e99999"})
    EXPECT_THROW(parse_decimal(bad), std::invalid_argument) << bad;
  EXPECT_EQ(text("1e-17"), "0|00000000000000001");
  EXPECT_EQ(text("1e+16"), "10000000000000000|");
}

std::shared_ptr<const Grammar> regex(const std::string& re, bool json = false) {
  return std::make_shared<const Grammar>(Grammar::parse("root ::= " + regex_to_gbnf(re, json)));
}

// Regular expressions (guided_regex, a schema's pattern) match their strings whole.
TEST(RegexGrammar, MatchesWhatTheRegexMatchesWhole) {
  struct Case {
    const char* re;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"^[A-Z]{2}-\\d{3,4}$", {"AB-123", "ZZ-0000"}, {"ab-123", "AB-12", "AB-12345", " AB-123"}},
      {"(cat|dog)s?", {"cat", "dogs", "cats"}, {"bird", "catss", ""}},
      {"a(?:b|c)*d", {"ad", "abcbd"}, {"abd e", "ae"}},
      {"\\w+@\\w+\\.com", {"me@x.com", "a_1@b2.com"}, {"me@x.org", "@x.com", "me@x.com."}},
      {"[^\\s,]+(,[^\\s,]+)*", {"a,b,c", "x"}, {"a, b", "a,,b", ","}},
      {"x.y", {"x-y", "xéy"}, {"x\ny", "xy"}},
      {"\\(\\d+\\)|\\[\\]|\\$|\\u00e9", {"(12)", "[]", "$", "é"}, {"()", "12"}},
      {"colou?r{1,2}?", {"color", "colourr"}, {"colourrr"}},
      {"", {""}, {"a"}},
      {"\\ud83d\\ude00+", {"😀", "😀😀"}, {"", "x"}},
      {"(a?b){0,3}(c|)", {"", "bb", "abbc", "c"}, {"aa", "bbbb"}},
  };
  for (const Case& c : cases) {
    auto g = regex(c.re);
    for (const std::string& t : c.yes) EXPECT_TRUE(matches(g, t)) << c.re << " on '" << t << "'";
    for (const std::string& t : c.no) EXPECT_FALSE(matches(g, t)) << c.re << " on '" << t << "'";
  }
  // Inside a JSON string: quotes, backslashes and control characters as escapes.
  auto j = regex("[a\"\\\\]+\\n?", true);
  EXPECT_TRUE(matches(j, "a\\\"\\\\a\\n"));  // a\"\\a\n as JSON writes a"\a + newline
  EXPECT_FALSE(matches(j, "a\"a"));
  EXPECT_FALSE(matches(j, "a\n"));
  auto any = regex("[^x]{3}", true);
  EXPECT_TRUE(matches(any, "\\u0001\\tb"));
  EXPECT_FALSE(matches(any, "\tbb"));
  // (a lone surrogate: found by fuzz_grammar, it made text that is not UTF-8)
  for (const char* bad : {"(?=a)", "(a", "a{2", "a**", "\\1", "\\bword", "[z-a]", "a^b", "*a",
                          "\"e\\ud83d}", "\\ude00", "a{6,5}", "a{99999}", "(|a)+", "(a?b*)*x"}) {
    EXPECT_THROW(regex_to_gbnf(bad), GrammarError) << bad;
  }
}

TEST(JsonSchemaGrammar, APatternHoldsTheStringsContent) {
  auto g = schema(json::parse(R"({"type": "object", "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}}, "required": ["code"]})"));
  EXPECT_TRUE(matches(g, R"({"code": "ABC-12"})"));
  EXPECT_FALSE(matches(g, R"({"code": "AB-12"})"));
  EXPECT_FALSE(matches(g, R"({"code": "ABC-123"})"));
  EXPECT_THROW(json_schema_grammar(json::parse(R"j({"type": "string", "pattern": "(?<n>a)"})j")),
               SchemaError);
  // Beside a pattern a format is an annotation (zod writes both).
  g = schema(json::parse(R"({"type": "string", "format": "date", "pattern": "^\\d{4}$"})"));
  EXPECT_TRUE(matches(g, R"("2024")"));
  EXPECT_FALSE(matches(g, R"("2024-01-01")"));
  // OpenAI's string formats.
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>>
      formats = {
          {"email",
           {"a@b.co", "first.last+tag@mail.example.org", "o'neil@x-y.io"},
           {"a@b", "@b.co", "a..b@c.de", "a@-b.de", "a b@c.de", "a@b.c"}},
          {"ipv4", {"0.0.0.0", "192.168.1.255", "10.20.30.40"}, {"256.1.1.1", "1.2.3", "01.2.3.4"}},
          {"hostname", {"localhost", "a-b.example.com", "x1"}, {"-a.com", "a-.com", "a..b", ""}},
      };
  for (const auto& [format, in, out] : formats) {
    auto f = schema(json{{"type", "string"}, {"format", format}});
    for (const std::string& t : in) EXPECT_TRUE(matches(f, "\"" + t + "\"")) << format << ": " << t;
    for (const std::string& t : out)
      EXPECT_FALSE(matches(f, "\"" + t + "\"")) << format << ": " << t;
  }
  // minLength and maxLength beside it (pydantic's constr, zod's .max().regex()).
  g = schema(json::parse(R"({"type": "string", "maxLength": 5, "pattern": "^[a-z\"]+$"})"));
  EXPECT_TRUE(matches(g, R"("abcde")"));
  EXPECT_TRUE(matches(g, R"("ab\"de")")) << "an escaped quote is one character";
  EXPECT_FALSE(matches(g, R"("abcdef")"));
  EXPECT_FALSE(matches(g, R"("ab\"def")"));
  EXPECT_FALSE(matches(g, R"("")"));
}

// minLength/maxLength folded into a pattern: exactly its strings of those
// lengths, where its one part of variable length is a repeated character.
TEST(RegexGrammar, ALengthFoldsIntoThePatternsRepeatedCharacter) {
  auto within = [](const std::string& re, int min, int max) {
    return std::make_shared<const Grammar>(
        Grammar::parse("root ::= " + regex_to_gbnf(re, false, RegexLength{min, max})));
  };
  struct Case {
    std::string re;
    int min, max;
    std::vector<std::string> in, out;
  };
  const std::vector<Case> cases = {
      {"^[a-z]+$", -1, 5, {"a", "abcde"}, {"", "abcdef"}},
      {"^[A-Z][a-z]*$", 3, 6, {"Abc", "Abcdef"}, {"Ab", "Abcdefg", "abc"}},
      {"^\\d{3}-\\w{2,}$", 6, 8, {"123-ab", "123-abcd"}, {"123-a", "123-abcde", "12-abcd"}},
      {"^\\d{5}$", -1, 10, {"12345"}, {"1234", "123456"}},
      {"^(?:ab|cd)+$", 2, -1, {"ab", "abcd"}, {""}},
      {"^[a-z]*$", 2, -1, {"ab", "abcdefghij"}, {"", "a"}},
  };
  for (const Case& c : cases) {
    auto g = within(c.re, c.min, c.max);
    for (const std::string& t : c.in) EXPECT_TRUE(matches(g, t)) << c.re << ": " << t;
    for (const std::string& t : c.out) EXPECT_FALSE(matches(g, t)) << c.re << ": " << t;
  }
  // What it cannot fold is refused, saying so.
  for (const auto& [re, min, max] :
       std::vector<std::tuple<std::string, int, int>>{{"^(?:ab|c)+$", -1, 4},
                                                      {"^a+b+$", -1, 4},
                                                      {"^x?a+$", -1, 4},
                                                      {"^\\d{5}$", -1, 3},
                                                      {"^a|bb$", 2, 2}})
    EXPECT_THROW(regex_to_gbnf(re, false, RegexLength{min, max}), GrammarError) << re;
}

TEST(JsonSchemaGrammar, WhatItCannotEnforceIsRefusedNamingTheKeyword) {
  auto error = [](const char* text) {
    try {
      json_schema_grammar(json::parse(text));
    } catch (const SchemaError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error(R"j({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?!x)"}}})j")
          .find("properties.a.pattern"),
      std::string::npos);
  EXPECT_NE(
      error(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems' is not supported"),
      std::string::npos);
  EXPECT_NE(error(R"({"type": "number", "minimum": 1e-20})").find("finer than 10^-16"),
            std::string::npos);
  EXPECT_NE(error(R"({"$ref": "#/$defs/nope"})").find("names no schema"), std::string::npos);
  EXPECT_NE(error(R"({"type": "object", "properties": {"a": {}}, "required": ["x"],
                      "additionalProperties": false})")
                .find("'x' is required"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "date"})").find("unknown type 'date'"), std::string::npos);
  EXPECT_NE(error("false").find("allows nothing"), std::string::npos);
  EXPECT_EQ(error(R"({"title": "T", "description": "d", "type": "string", "default": "x"})"), "");
}

TEST(JsonSchemaGrammar, JsonObjectAndChoices) {
  auto obj = std::make_shared<const Grammar>(Grammar::parse(json_object_grammar()));
  EXPECT_TRUE(matches(obj, R"({"a": [1, 2.5e-3, "x", true, null, {"b": {}}]})"));
  EXPECT_FALSE(matches(obj, R"([1])"));
  EXPECT_FALSE(matches(obj, R"({"a": 01})"));
  auto choice =
      std::make_shared<const Grammar>(Grammar::parse(choice_grammar({"yes", "no \"way\""})));
  EXPECT_TRUE(matches(choice, "yes"));
  EXPECT_TRUE(matches(choice, "no \"way\""));
  EXPECT_FALSE(matches(choice, "yes "));
}

// Every JSON text a random walk through the grammar produces parses as JSON
// and is valid under the schema's shape.
TEST(JsonSchemaGrammar, RandomWalksThroughTheGrammarAreValidJson) {
  const json s = json::parse(R"({"type": "object", "properties": {
      "n": {"type": "number"}, "s": {"type": "string", "maxLength": 5},
      "l": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
    "required": ["n", "l"]})");
  auto g = schema(s);
  std::vector<std::string> pieces;
  for (const char* p : {"{", "}", "[", "]", "\"", ",", ":", " ", "\n", "0", "1", "9", "-", ".", "a",
                        "b", "n", "s", "l",  // (no exponents: 1e999 is
                                             // JSON but no double)
                        "\\n", "\\u00e9", "\"n\"", "\"s\"", "\"l\"", "é"})
    pieces.push_back(p);
  std::vector<bool> control(pieces.size(), false);
  const TokenVocabulary vocab(pieces, control);
  std::mt19937 rng(7);
  int complete = 0;
  for (int walk = 0; walk < 200; ++walk) {
    Matcher m(g);
    std::string text;
    for (int step = 0; step < 200 && !(m.is_complete() && !m.can_continue()); ++step) {
      if (m.is_complete() && rng() % 4 == 0) break;
      std::vector<uint8_t> allowed;
      m.allowed_tokens(vocab, allowed);
      std::vector<int> ids;
      for (int id = 0; id < vocab.size(); ++id)
        if (allowed[size_t(id)]) ids.push_back(id);
      ASSERT_FALSE(ids.empty()) << "stuck after: " << text;
      const int id = ids[rng() % ids.size()];
      ASSERT_TRUE(m.accept(vocab.bytes(id)));
      text += vocab.bytes(id);
    }
    if (!m.is_complete()) continue;
    ++complete;
    const json v = json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    ASSERT_TRUE(v.is_object()) << text;
    EXPECT_TRUE(v.contains("n") && v["n"].is_number()) << text;
    ASSERT_TRUE(v.contains("l") && v["l"].is_array()) << text;
    EXPECT_LE(v["l"].size(), 3u) << text;
    for (const json& x : v["l"]) EXPECT_TRUE(x.is_number_integer()) << text;
    if (v.contains("s")) {
      EXPECT_LE(v["s"].get<std::string>().size(), 10u) << text;
    }
  }
  EXPECT_GT(complete, 20);
}

}  // namespace
}  // namespace troupe::grammar
