#pragma once
// A parsed Jinja template: statements holding expressions. Plain data; the
// parser builds it (parser.h), the interpreter walks it (template.h).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace troupe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using Keywords = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]], each bound may be null
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs)
    Test,     // args[0] is [not] name(args[1..])
    Unary,    // name ("-", "+", "not") args[0]
    Binary,   // args[0] name args[1]: arithmetic, "~", comparisons, "in", "not in"
    And,
    Or,
    Cond,  // args[0] if args[1] else args[2] (null: undefined)
    List,
    Tuple,
    Dict,  // args: key, value, key, value, ...
  };
  Kind kind = Kind::Literal;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  Keywords kwargs;
  bool negated = false;  // Test: "is not"
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches, else_body
    For,       // for targets in expr [if cond]: body, else_body
    Set,       // set targets = expr, or set targets[0].attr = expr
    SetBlock,  // set targets[0] %}body{% endset
    Macro,     // macro name(params): body
    Break,
    Continue,
    FilterBlock,  // filter expr (a Filter chain over the body): body
    Do,           // do expr
    Scope,        // a block rendered as it is ({% generation %})
  };
  Kind kind = Kind::Text;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // a default may be null
};

// The name a FilterBlock's chain reads the rendered body from.
inline constexpr const char* kFilterInput = "\x01filter-input";

}  // namespace troupe::jinja
