#pragma once
// A regular expression as a GBNF expression matching the same strings whole
// (vLLM's guided_regex, a JSON schema's `pattern`).
//
// Understood: literals, `.` (any character but a newline), classes `[a-z_]`
// and `[^...]`, `\d \w \s \D \W \S`, escaped metacharacters and `\n \r \t
// \f \v \0 \xHH \uHHHH`, groups `(...)` and `(?:...)`, `|`, and `* + ? {m}
// {m,} {m,n}` (a lazy `?` after them changes nothing here). `^` at the start
// and `$` at the end are allowed and change nothing: the match is whole.
// Anything else (lookaround, backreferences, `\b`, named groups, flags) is
// refused with a GrammarError naming it.
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace troupe::grammar {

// How many characters the strings may have (JSON Schema's minLength and
// maxLength beside a pattern); -1: no bound.
struct RegexLength {
  int min = -1, max = -1;
};

// `json_string`: the expression matches the regex's strings as they are
// written inside a JSON string: `"`, `\` and control characters as their
// escapes (`\"`, `\\`, `\n`, `\u0001`, ...). `length`: only the strings of
// that many characters; taken where the regex's strings all have such
// lengths, or its one part of variable length is a repeated character (as
// in ^[A-Z][a-z]*$); otherwise refused.
std::string regex_to_gbnf(std::string_view regex, bool json_string = false,
                          RegexLength length = {});

}  // namespace troupe::grammar
