#pragma once
// A Jinja template's source as a flat list of tokens: the text between tags,
// and each tag's opening, its expression tokens and its close. Whitespace
// control is applied here, as Jinja's own lexer does with the options
// transformers renders chat templates with: trim_blocks and lstrip_blocks on,
// keep_trailing_newline off, newlines normalised to "\n", and the "-" and "+"
// modifiers on a tag's either side.
#include <string>
#include <string_view>
#include <vector>

namespace troupe::jinja {

enum class Tok {
  Text,        // literal output
  OutputOpen,  // {{
  BlockOpen,   // {%
  Close,       // }} or %}
  Name,        // also the keywords (if, for, and, not, ...)
  String,      // a literal's value, escapes resolved
  Int,
  Float,
  Op,  // punctuation and operators: ( ) [ ] { } , . : | ~ + - * / // % ** = == != < <= > >=
  End,
};

struct Token {
  Tok kind = Tok::End;
  std::string text;
  int line = 1;
};

// Throws Error naming the line for an unclosed tag, comment or string, or a
// character no expression has.
std::vector<Token> lex(std::string_view source);

}  // namespace troupe::jinja
