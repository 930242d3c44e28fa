#pragma once
// Jinja's grammar over the lexer's tokens, as far as chat templates use it:
// if/elif/else, for (with loop filters and else), set (names, tuples,
// namespace attributes, blocks), macro, break/continue, filter blocks, do,
// and transformers' {% generation %}; expressions with Jinja's precedence,
// filters, tests, calls, slices and literals. Anything else (extends,
// include, call blocks, recursive loops) is refused, naming it and the line.
#include <string_view>

#include "text/jinja/ast.h"

namespace troupe::jinja {

Body parse(std::string_view source);

}  // namespace troupe::jinja
