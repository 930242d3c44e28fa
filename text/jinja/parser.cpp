#include "text/jinja/parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "text/jinja/lexer.h"

namespace troupe::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body run() {
    std::string end;
    Body body = statements({}, end);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool at_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Op && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Name && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("line " + std::to_string(peek().line) + ": " + what);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Tok::Close:
        return "the end of the tag";
      case Tok::End:
        return "the end of the template";
      case Tok::Text:
        return "text";
      case Tok::String:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) fail("expected '" + std::string(op) + "', found " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().kind != Tok::Name) fail("expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_close() {
    if (peek().kind != Tok::Close) fail("expected the end of the tag, found " + describe(peek()));
    next();
  }

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements until a block tag whose keyword is one of `ends`; that keyword
  // goes into `found`, the tag's remaining tokens are left for the caller.
  Body statements(std::initializer_list<std::string_view> ends, std::string& found) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::End) {
        if (ends.size() == 0) return body;
        fail("the template ended inside a block: expected {% " + std::string(*(ends.end() - 1)) +
             " %}");
      }
      if (t.kind == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = t.line;
        s->text = next().text;
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind == Tok::OutputOpen) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = t.line;
        s->expr = expression();
        expect_close();
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind != Tok::BlockOpen) fail("unexpected " + describe(t));
      next();
      const std::string keyword = peek().kind == Tok::Name ? peek().text : "";
      for (const std::string_view end : ends)
        if (keyword == end) {
          next();
          found = keyword;
          return body;
        }
      body.push_back(statement());
    }
  }

  std::unique_ptr<Stmt> statement() {
    const Nested nested(*this);
    const int line = peek().line;
    const std::string keyword = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string found;
    if (keyword == "if") {
      s->kind = Stmt::Kind::If;
      ExprPtr cond = expression();
      expect_close();
      while (true) {
        Body body = statements({"elif", "else", "endif"}, found);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (found == "elif") {
          cond = expression();
          expect_close();
          continue;
        }
        expect_close();
        if (found == "else") {
          s->else_body = statements({"endif"}, found);
          expect_close();
        }
        break;
      }
    } else if (keyword == "for") {
      s->kind = Stmt::Kind::For;
      do s->targets.push_back(expect_name());
      while (accept_op(","));
      if (!accept_name("in")) fail("expected 'in' in a for loop, found " + describe(peek()));
      s->expr = shallow(tuple_or_expression(false));
      if (accept_name("if")) s->cond = shallow(or_expr());
      if (at_name("recursive")) fail("recursive loops are not supported");
      expect_close();
      s->body = statements({"else", "endfor"}, found);
      expect_close();
      if (found == "else") {
        s->else_body = statements({"endfor"}, found);
        expect_close();
      }
    } else if (keyword == "set") {
      s->targets.push_back(expect_name());
      if (accept_op(".")) {
        s->attr = expect_name();
      } else {
        while (accept_op(",")) s->targets.push_back(expect_name());
      }
      if (accept_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = tuple_or_expression(true);
        expect_close();
      } else {
        if (s->targets.size() != 1 || !s->attr.empty()) fail("a block set takes one name");
        s->kind = Stmt::Kind::SetBlock;
        if (accept_op("|")) s->expr = filter_chain(line);
        expect_close();
        s->body = statements({"endset"}, found);
        expect_close();
      }
    } else if (keyword == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->name = expect_name();
      expect_op("(");
      while (!at_op(")")) {
        std::string param = expect_name();
        ExprPtr fallback;
        if (accept_op("=")) fallback = expression();
        s->params.emplace_back(std::move(param), std::move(fallback));
        if (!accept_op(",")) break;
      }
      expect_op(")");
      expect_close();
      s->body = statements({"endmacro"}, found);
      if (peek().kind == Tok::Name) next();  // {% endmacro name %}
      expect_close();
    } else if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_close();
    } else if (keyword == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->expr = filter_chain(line);
      expect_close();
      s->body = statements({"endfilter"}, found);
      expect_close();
    } else if (keyword == "do") {
      s->kind = Stmt::Kind::Do;
      s->expr = tuple_or_expression(true);
      expect_close();
    } else if (keyword == "generation") {
      // transformers' AssistantTracker: marks the assistant's text, renders it.
      s->kind = Stmt::Kind::Scope;
      expect_close();
      s->body = statements({"endgeneration"}, found);
      expect_close();
    } else {
      throw Error("line " + std::to_string(line) + ": the tag '" + keyword +
                  "' is not supported in chat templates");
    }
    return s;
  }

  // `|f(a)|g` over the body's text, for {% filter %} and {% set x | f %}.
  ExprPtr filter_chain(int line) {
    auto input = make(Expr::Kind::Name, line);
    input->name = kFilterInput;
    ExprPtr e = filter(std::move(input));
    while (accept_op("|")) e = filter(std::move(e));
    return e;
  }

  // "a, b" as a list where Jinja takes a tuple (for's iterable, set's value).
  ExprPtr tuple_or_expression(bool with_condexpr) {
    const int line = peek().line;
    ExprPtr first = with_condexpr ? expression() : or_expr();
    if (!at_op(",")) return first;
    auto tuple = make(Expr::Kind::Tuple, line);
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == Tok::Close) break;
      tuple->args.push_back(with_condexpr ? expression() : or_expr());
    }
    return tuple;
  }

  // Nesting (brackets, unary operators, blocks) is bounded, and so is an
  // expression's tree, so that neither parsing nor rendering nor freeing it
  // recurses without bound: no chat template comes near kMaxNesting.
  static constexpr int kMaxNesting = 200;
  struct Nested {
    Parser& p;
    explicit Nested(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting)
        p.fail("nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nested() { --p.nesting_; }
  };

  static size_t tree_depth(const Expr& root) {
    size_t deepest = 0;
    std::vector<std::pair<const Expr*, size_t>> todo{{&root, 1}};
    while (!todo.empty()) {
      const auto [e, d] = todo.back();
      todo.pop_back();
      deepest = std::max(deepest, d);
      for (const auto& a : e->args)
        if (a) todo.emplace_back(a.get(), d + 1);
      for (const auto& [k, v] : e->kwargs)
        if (v) todo.emplace_back(v.get(), d + 1);
    }
    return deepest;
  }

  ExprPtr expression() {
    const Nested nested(*this);
    const bool outermost = !in_expression_;
    in_expression_ = true;
    ExprPtr e = conditional();
    if (outermost) {
      in_expression_ = false;
      e = shallow(std::move(e));
    }
    return e;
  }

  ExprPtr shallow(ExprPtr e) {
    if (tree_depth(*e) > size_t(kMaxNesting))
      fail("an expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    return e;
  }

  ExprPtr conditional() {
    ExprPtr e = or_expr();
    while (at_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Kind::Cond, line);
      cond->args.push_back(std::move(e));
      cond->args.push_back(or_expr());
      cond->args.push_back(accept_name("else") ? expression() : nullptr);
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) {
      const int line = next().line;
      e = binary(Expr::Kind::Or, "or", std::move(e), and_expr(), line);
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) {
      const int line = next().line;
      e = binary(Expr::Kind::And, "and", std::move(e), not_expr(), line);
    }
    return e;
  }

  ExprPtr not_expr() {
    if (at_name("not")) {
      const Nested nested(*this);
      const int line = next().line;
      auto e = make(Expr::Kind::Unary, line);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }

  // Python's chained comparisons: a < b < c is a < b and b < c (b computed twice
  // here, which a template cannot tell apart).
  ExprPtr compare() {
    ExprPtr e = math1();
    ExprPtr chain;
    const Expr* last = e.get();
    ExprPtr left = std::move(e);
    while (true) {
      std::string op;
      const int line = peek().line;
      if (peek().kind == Tok::Op &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op("<=") || at_op(">") || at_op(">="))) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      ExprPtr right = math1();
      const Expr* right_raw = right.get();
      ExprPtr cmp;
      if (!chain) {
        cmp = binary(Expr::Kind::Binary, op, std::move(left), std::move(right), line);
        chain = std::move(cmp);
      } else {
        // Re-parse is not possible, so a chained middle operand is copied by
        // reference through a literal-free clone of its tokens' meaning.
        cmp = binary(Expr::Kind::Binary, op, clone(*last), std::move(right), line);
        chain = binary(Expr::Kind::And, "and", std::move(chain), std::move(cmp), line);
      }
      last = right_raw;
    }
    return chain ? std::move(chain) : std::move(left);
  }

  static ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>();
    c->kind = e.kind;
    c->line = e.line;
    c->value = e.value;
    c->name = e.name;
    c->negated = e.negated;
    for (const auto& a : e.args) c->args.push_back(a ? clone(*a) : nullptr);
    for (const auto& [k, v] : e.kwargs) c->kwargs.emplace_back(k, v ? clone(*v) : nullptr);
    return c;
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (at_op("+") || at_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), concat(), op.line);
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (at_op("~")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, "~", std::move(e), math2(), line);
    }
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), power(), op.line);
    }
    return e;
  }

  ExprPtr power() {
    ExprPtr e = unary(true);
    while (at_op("**")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, "**", std::move(e), unary(true), line);
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Nested nested(*this);
      const Token& op = next();
      e = make(Expr::Kind::Unary, op.line);
      e->name = op.text;
      e->args.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters_and_tests(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token& t = peek();
    const int line = t.line;
    switch (t.kind) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(Value(true), line);
        if (t.text == "false" || t.text == "False") return literal(Value(false), line);
        if (t.text == "none" || t.text == "None") return literal(Value(nullptr), line);
        auto e = make(Expr::Kind::Name, line);
        e->name = t.text;
        return e;
      }
      case Tok::String: {
        std::string s = next().text;
        while (peek().kind == Tok::String) s += next().text;  // "a" "b" is "ab"
        return literal(Value(std::move(s)), line);
      }
      case Tok::Int: {
        const std::string text = next().text;
        int64_t i = 0;
        if (parse_int64(text, i)) return literal(Value(i), line);
        return literal(Value(std::strtod(text.c_str(), nullptr)), line);  // past int64: a float
      }
      case Tok::Float:  // strtod: 1e999 is inf, as Python reads it
        return literal(Value(std::strtod(next().text.c_str(), nullptr)), line);
      case Tok::Op:
        if (accept_op("(")) {
          if (accept_op(")")) return make(Expr::Kind::Tuple, line);
          ExprPtr e = expression();
          if (at_op(",")) {
            auto tuple = make(Expr::Kind::Tuple, line);
            tuple->args.push_back(std::move(e));
            while (accept_op(",") && !at_op(")")) tuple->args.push_back(expression());
            e = std::move(tuple);
          }
          expect_op(")");
          return e;
        }
        if (accept_op("[")) {
          auto e = make(Expr::Kind::List, line);
          while (!at_op("]")) {
            e->args.push_back(expression());
            if (!accept_op(",")) break;
          }
          expect_op("]");
          return e;
        }
        if (accept_op("{")) {
          auto e = make(Expr::Kind::Dict, line);
          while (!at_op("}")) {
            e->args.push_back(expression());
            expect_op(":");
            e->args.push_back(expression());
            if (!accept_op(",")) break;
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail("expected an expression, found " + describe(t));
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::Kind::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (accept_op(".")) {
        if (peek().kind == Tok::Int) {  // x.0 is x[0]
          int64_t index = 0;
          if (!parse_int64(next().text, index)) fail("an index too large");
          auto item = make(Expr::Kind::Item, line);
          item->args.push_back(std::move(e));
          item->args.push_back(literal(Value(index), line));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::Attr, line);
        attr->name = expect_name();
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (accept_op("[")) {
        e = subscript(std::move(e), line);
      } else if (at_op("(")) {
        e = call(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj, int line) {
    ExprPtr bounds[3];
    bool slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!at_op(":") && !at_op("]")) bounds[part] = expression();
      if (part < 2 && accept_op(":")) {
        slice = true;
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make(slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
    e->args.push_back(std::move(obj));
    if (!slice) {
      if (!bounds[0]) fail("an empty subscript");
      e->args.push_back(std::move(bounds[0]));
    } else {
      for (auto& b : bounds) e->args.push_back(std::move(b));
    }
    return e;
  }

  // "(" positional, then name=value ")" into e->args (after those already
  // there) and e->kwargs.
  void arguments(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == Tok::Name && at_op("=", 1)) {
        std::string name = next().text;
        next();
        e.kwargs.emplace_back(std::move(name), expression());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument after a keyword argument");
        e.args.push_back(expression());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr call(ExprPtr callee, int line) {
    auto e = make(Expr::Kind::Call, line);
    e->args.push_back(std::move(callee));
    arguments(*e);
    return e;
  }

  ExprPtr filter(ExprPtr operand) {
    const int line = peek().line;
    auto e = make(Expr::Kind::Filter, line);
    e->name = expect_name();
    while (accept_op(".")) e->name += "." + expect_name();
    e->args.push_back(std::move(operand));
    if (at_op("(")) arguments(*e);
    return e;
  }

  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.kind == Tok::String || t.kind == Tok::Int || t.kind == Tok::Float) return true;
    if (t.kind == Tok::Op) return t.text == "[" || t.text == "{" || t.text == "-";
    if (t.kind != Tok::Name) return false;
    for (const char* k : {"else", "or", "and", "if", "in", "is", "not"})
      if (t.text == k) return false;
    return true;
  }

  ExprPtr filters_and_tests(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        e = filter(std::move(e));
      } else if (at_name("is")) {
        const int line = next().line;
        auto test = make(Expr::Kind::Test, line);
        test->negated = accept_name("not");
        test->name = expect_name();
        test->args.push_back(std::move(e));
        if (at_op("(")) {
          arguments(*test);
        } else if (starts_test_argument()) {
          test->args.push_back(postfix(primary()));
        }
        e = std::move(test);
      } else if (at_op("(")) {
        e = call(std::move(e), peek().line);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;
  bool in_expression_ = false;
};

}  // namespace

Body parse(std::string_view source) {
  return Parser(lex(source)).run();
}

}  // namespace troupe::jinja
