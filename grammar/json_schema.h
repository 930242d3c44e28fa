#pragma once
// JSON Schema to a GBNF grammar whose matches are JSON texts valid under the
// schema, for structured output (OpenAI's response_format json_schema, vLLM's
// guided_json, a named tool's parameters).
//
// Understood: type (one or a list), properties (in their order; those not in
// required may be left out), required, additionalProperties (false or absent:
// no other keys; true or a schema: other keys after the declared ones; an
// object without properties takes any keys), items, prefixItems, minItems,
// maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to
// #/$defs/... or #/definitions/... (recursion allowed), minLength, maxLength,
// pattern (beside it, format is an annotation and the lengths are folded into
// it where regex_to_gbnf can), format date / time / date-time / uuid /
// email / ipv4 / hostname (other formats: any string), and minimum,
// maximum, exclusiveMinimum and exclusiveMaximum on integers and numbers
// (read exactly as written; a bounded number is written without an
// exponent, with at most 16 digits either side of the point), multipleOf in
// whole steps (alone, from a lower bound of at most the step, or within
// bounds holding at most 512 multiples). Without a type, the keywords of a
// type bind the values of that type. Annotations (title, description, default,
// examples, $schema, $id, $comment, ...) are ignored. Any other keyword
// constrains in a way the grammar would not enforce, so it is refused, naming
// it and where it is.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace troupe::grammar {

class SchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The grammar of JSON texts valid under `schema` (rule `root`). Throws
// SchemaError naming the keyword and its place ("properties.age.minimum").
std::string json_schema_grammar(const nlohmann::ordered_json& schema);

// (ordered_json: properties are generated in the order the schema gives them.)

// Any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string json_object_grammar();

// One of the given strings, exactly (vLLM's guided_choice).
std::string choice_grammar(const std::vector<std::string>& choices);

}  // namespace troupe::grammar
