#include "text/jinja/template.h"

#include <cmath>
#include <unordered_map>

#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"
#include "text/jinja/parser.h"

namespace troupe::jinja {

struct Template::Parsed {
  Body body;
};

namespace {

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Interpreter(const Dict& context, const RenderLimits& limits) : limits_(limits) {
    frames_.emplace_back();
    for (auto& [k, v] : builtin_globals().items) frames_.back()[k] = v;
    for (const auto& [k, v] : context.items) frames_.back()[k] = v;
    frames_.emplace_back();  // the template's own top-level names
  }

  std::string run(const Body& body) {
    exec(body, out_);
    return std::move(out_);
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  [[noreturn]] static void fail(int line, const std::string& what) {
    throw Error("line " + std::to_string(line) + ": " + what);
  }

  void step(int line) {
    if (++steps_ > limits_.max_steps)
      fail(line, "the template ran more than " + std::to_string(limits_.max_steps) + " steps");
  }

  void write(std::string& out, const std::string& text, int line) {
    out += text;
    if (out.size() > limits_.max_output_bytes)
      fail(line,
           "the template wrote more than " + std::to_string(limits_.max_output_bytes) + " bytes");
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    step(s.line);
    switch (s.kind) {
      case Stmt::Kind::Text:
        write(out, s.text, s.line);
        return Flow::Normal;
      case Stmt::Kind::Output:
        write(out, eval(*s.expr).str(), s.line);
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec(body, out);
        return exec(s.else_body, out);
      case Stmt::Kind::For:
        return exec_for(s, out);
      case Stmt::Kind::Set:
        exec_set(s);
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string text;
        exec(s.body, text);
        frames_.back()[s.targets[0]] = filtered_block(s, std::move(text));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        frames_.back()[s.name] = macro(s);
        return Flow::Normal;
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::FilterBlock: {
        std::string text;
        exec(s.body, text);
        write(out, filtered_block(s, std::move(text)).str(), s.line);
        return Flow::Normal;
      }
      case Stmt::Kind::Do:
        eval(*s.expr);
        return Flow::Normal;
      case Stmt::Kind::Scope:
        return exec(s.body, out);
    }
    return Flow::Normal;
  }

  Value filtered_block(const Stmt& s, std::string text) {
    if (!s.expr) return Value(std::move(text));
    frames_.emplace_back();
    frames_.back()[kFilterInput] = Value(std::move(text));
    Value v = eval(*s.expr);
    frames_.pop_back();
    return v;
  }

  static List iterable(const Value& v, int line) {
    if (!v.is_list() && !v.is_dict() && !v.is_string() && !v.is_undefined())
      fail(line, "'" + v.type_name() + "' object is not iterable");
    return items_of(v, "");
  }

  void bind(Frame& frame, const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      frame[targets[0]] = v;
      return;
    }
    const List parts = iterable(v, line);
    if (parts.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) frame[targets[i]] = parts[i];
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    const List all = iterable(eval(*s.expr), s.line);
    frames_.emplace_back();
    // A loop's `if` filters before counting: loop.length and loop.last see
    // only the items that pass.
    List items;
    if (s.cond) {
      for (const Value& item : all) {
        bind(frames_.back(), s.targets, item, s.line);
        if (eval(*s.cond).truthy()) items.push_back(item);
      }
    } else {
      items = all;
    }
    frames_.pop_back();
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      step(s.line);
      // Each turn its own scope: a name set in the body is gone at the next
      // turn, which reads the outer one again (what namespace() is for).
      frames_.emplace_back();
      Frame& frame = frames_.back();
      bind(frame, s.targets, items[size_t(i)], s.line);
      Dict loop;
      loop.set("index0", Value(i));
      loop.set("index", Value(i + 1));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("revindex", Value(n - i));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("depth", Value(int64_t(1)));
      loop.set("depth0", Value(int64_t(0)));
      loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value());
      loop.set("nextitem", i + 1 < n ? items[size_t(i + 1)] : Value());
      loop.set("cycle", Value::function("loop.cycle", [i](Args& a) {
                 if (a.positional.empty()) throw Error("loop.cycle() needs at least one item");
                 return a.positional[size_t(i) % a.positional.size()];
               }));
      frame["loop"] = Value(std::move(loop));
      const Flow flow = exec(s.body, out);
      frames_.pop_back();
      if (flow == Flow::Break) break;
    }
    if (n == 0) return exec(s.else_body, out);
    return Flow::Normal;
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.expr);
    if (!s.attr.empty()) {
      const Value target = lookup(s.targets[0]);
      if (!target.is_dict())
        fail(s.line, "cannot set '" + s.attr + "' on '" + s.targets[0] + "', a " +
                         target.type_name() + " (only on a namespace)");
      if (holds(v, &target.dict(), 0))
        fail(s.line,
             "'" + s.targets[0] + "." + s.attr + "' would hold '" + s.targets[0] + "' itself");
      target.dict().set(s.attr, std::move(v));
      return;
    }
    bind(frames_.back(), s.targets, v, s.line);
  }

  // Whether `v` is or holds the dict at `d` (shared values make cycles, which
  // nothing would free).
  static bool holds(const Value& v, const Dict* d, int depth) {
    if (depth > 64) return true;  // deeper than any chat's data: treated as a cycle
    if (v.is_dict()) {
      if (&v.dict() == d) return true;
      for (const auto& item : v.dict().items)
        if (holds(item.second, d, depth + 1)) return true;
    } else if (v.is_list()) {
      for (const Value& item : v.list())
        if (holds(item, d, depth + 1)) return true;
    }
    return false;
  }

  Value macro(const Stmt& s) {
    return Value::function(s.name, [this, &s](Args& a) {
      if (++depth_ > limits_.max_depth)
        fail(s.line, "macros nested deeper than " + std::to_string(limits_.max_depth));
      Frame frame;
      for (size_t i = 0; i < s.params.size(); ++i) {
        Value v = a.take(i, s.params[i].first);
        if (v.is_undefined() && s.params[i].second) v = eval(*s.params[i].second);
        frame[s.params[i].first] = std::move(v);
      }
      a.done();
      // A macro sees the globals and the template's top level, not its caller's loop.
      std::vector<Frame> saved(frames_.begin() + 2, frames_.end());
      frames_.resize(2);
      frames_.push_back(std::move(frame));
      std::string text;
      try {
        exec(s.body, text);
      } catch (...) {
        frames_.resize(2);
        frames_.insert(frames_.end(), saved.begin(), saved.end());
        --depth_;
        throw;
      }
      frames_.resize(2);
      frames_.insert(frames_.end(), saved.begin(), saved.end());
      --depth_;
      return Value(std::move(text));
    });
  }

  Args arguments(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.value;
      case Expr::Kind::Name:
        return lookup(e.name);
      case Expr::Kind::Attr:
        return attribute(eval(*e.args[0]), e.name);
      case Expr::Kind::Item:
        return subscript(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::Slice: {
        const auto bound = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value(); };
        return slice(eval(*e.args[0]), bound(1), bound(2), bound(3));
      }
      case Expr::Kind::Call: {
        step(e.line);
        const Value callee = eval(*e.args[0]);
        if (!callee.is_callable())
          fail(e.line, describe(*e.args[0]) + " is not callable (" + callee.type_name() + ")");
        Args a = arguments(e, 1);
        a.callee = callee.callable().name;
        try {
          return callee.callable().fn(a);
        } catch (const Raised&) {
          throw;
        } catch (const Error& err) {
          if (std::string_view(err.what()).rfind("line ", 0) == 0) throw;
          fail(e.line, err.what());
        }
      }
      case Expr::Kind::Filter: {
        const Value operand = eval(*e.args[0]);
        Args a = arguments(e, 1);
        try {
          return apply_filter(e.name, operand, a);
        } catch (const Raised&) {
          throw;
        } catch (const Error& err) {
          fail(e.line, err.what());
        }
      }
      case Expr::Kind::Test: {
        const Value operand = eval(*e.args[0]);
        Args a = arguments(e, 1);
        try {
          return Value(apply_test(e.name, operand, a) != e.negated);
        } catch (const Error& err) {
          fail(e.line, err.what());
        }
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_int() && !(e.name == "-" && v.as_int() == INT64_MIN))
          return Value(e.name == "-" ? -v.as_int() : v.as_int());
        if (v.is_int()) return Value(-double(v.as_int()));
        if (v.is_float()) return Value(e.name == "-" ? -v.as_number() : v.as_number());
        fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      }
      case Expr::Kind::And: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? eval(*e.args[1]) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? l : eval(*e.args[1]);
      }
      case Expr::Kind::Cond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(l)) : Value(std::move(l));
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(e.line, "dict keys must be strings here, not " + k.type_name());
          d.set(k.as_string(), eval(*e.args[i + 1]));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::Binary:
        return binary(e, eval(*e.args[0]), eval(*e.args[1]));
    }
    return Value();
  }

  // Python's "text % values": %s, %r, %d, %i and %%, values a tuple or one.
  static std::string printf_format(const Expr& e, const std::string& format, const Value& values) {
    const List args = values.is_tuple() ? values.list() : List{values};
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < format.size(); ++i) {
      if (format[i] != '%') {
        out += format[i];
        continue;
      }
      if (++i >= format.size()) fail(e.line, "incomplete format");
      const char spec = format[i];
      if (spec == '%') {
        out += '%';
        continue;
      }
      if (next >= args.size()) fail(e.line, "not enough arguments for format string");
      const Value& v = args[next++];
      if (spec == 's') {
        out += v.str();
      } else if (spec == 'r') {
        out += v.repr();
      } else if (spec == 'd' || spec == 'i') {
        if (!v.is_number() && !v.is_bool())
          fail(e.line,
               "%" + std::string(1, spec) + " format: a number is required, not " + v.type_name());
        out += std::to_string(v.is_bool()  ? int64_t(v.as_bool())
                              : v.is_int() ? v.as_int()
                                           : float_to_int(v.as_number()));
      } else {
        fail(e.line, std::string("unsupported format character '") + spec + "'");
      }
    }
    if (next < args.size()) fail(e.line, "not all arguments converted during string formatting");
    return out;
  }

  static std::string describe(const Expr& e) {
    if (e.kind == Expr::Kind::Name) return "'" + e.name + "'";
    if (e.kind == Expr::Kind::Attr) return "'" + e.name + "'";
    return "the expression";
  }

  // Joined text is held to the output's bound too: a loop that doubles a
  // string would otherwise take all memory long before anything is written.
  std::string bounded_text(const Expr& e, std::string s) const {
    if (s.size() > limits_.max_output_bytes)
      fail(e.line, "a text longer than the output limit (" +
                       std::to_string(limits_.max_output_bytes) + " bytes)");
    return s;
  }

  Value binary(const Expr& e, const Value& l, const Value& r) {
    const std::string& op = e.name;
    if (op == "~") return Value(bounded_text(e, l.str() + r.str()));
    if (op == "==") return Value(l == r);
    if (op == "!=") return Value(!(l == r));
    if (op == "in" || op == "not in") {
      Args a;
      a.positional.push_back(r);
      bool in;
      try {
        in = apply_test("in", l, a);
      } catch (const Error& err) {
        fail(e.line, err.what());
      }
      return Value(in == (op == "in"));
    }
    try {
      if (op == "<") return Value(l.less(r));
      if (op == ">") return Value(r.less(l));
      if (op == "<=") return Value(!r.less(l));
      if (op == ">=") return Value(!l.less(r));
    } catch (const Error& err) {
      fail(e.line, err.what());
    }
    if (op == "+") {
      if (l.is_markup() || r.is_markup()) {  // Markup escapes what is added to it
        const auto text = [](const Value& v) {
          if (v.is_markup()) return v.as_string();
          if (v.is_string()) return escape_html(v.as_string());
          return std::string();
        };
        if ((l.is_string()) && (r.is_string()))
          return Value::markup(bounded_text(e, text(l) + text(r)));
      }
      if (l.is_string() && r.is_string())
        return Value(bounded_text(e, l.as_string() + r.as_string()));
      if (l.is_list() && r.is_list()) {
        List out = l.list();
        out.insert(out.end(), r.list().begin(), r.list().end());
        return Value(std::move(out));
      }
    }
    if (op == "*") {
      const Value& seq = l.is_int() ? r : l;
      const Value& count = l.is_int() ? l : r;
      if ((seq.is_string() || seq.is_list()) && count.is_int()) {
        const int64_t n = std::max<int64_t>(0, count.as_int());
        if (seq.is_string()) {
          if (size_t(n) * seq.as_string().size() > limits_.max_output_bytes)
            fail(e.line, "a repeated string larger than the output limit");
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += seq.as_string();
          return Value(std::move(out));
        }
        if (size_t(n) * seq.list().size() > 1'000'000) fail(e.line, "a repeated list too long");
        List out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
        return Value(std::move(out));
      }
    }
    if (op == "%" && l.is_string()) return Value(printf_format(e, l.as_string(), r));
    const auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
    if (!numeric(l) || !numeric(r))
      fail(e.line, "unsupported operand types for " + op + ": '" + l.type_name() + "' and '" +
                       r.type_name() + "'");
    const auto as_int = [](const Value& v) {
      return v.is_bool() ? int64_t(v.as_bool()) : v.as_int();
    };
    const auto as_double = [](const Value& v) {
      return v.is_bool() ? double(v.as_bool()) : v.as_number();
    };
    const bool ints = !l.is_float() && !r.is_float();
    if (op == "/") {
      if (as_double(r) == 0) fail(e.line, "division by zero");
      return Value(as_double(l) / as_double(r));
    }
    // Integers past 64 bits (Python's are unbounded) go on as floats.
    if (ints) {
      const int64_t a = as_int(l), b = as_int(r);
      int64_t out = 0;
      if (op == "+" && !__builtin_add_overflow(a, b, &out)) return Value(out);
      if (op == "-" && !__builtin_sub_overflow(a, b, &out)) return Value(out);
      if (op == "*" && !__builtin_mul_overflow(a, b, &out)) return Value(out);
      if ((op == "//" || op == "%") && !(a == INT64_MIN && b == -1)) {
        if (b == 0) fail(e.line, "integer division or modulo by zero");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
          --q;
          m += b;
        }
        return Value(op == "//" ? q : m);
      }
      if (op == "**") {
        int64_t p = 1;
        bool fits = b >= 0 && b <= 64;
        for (int64_t i = 0; fits && i < b; ++i) fits = !__builtin_mul_overflow(p, a, &p);
        if (fits) return Value(p);
      }
    }
    const double a = as_double(l), b = as_double(r);
    if (op == "+") return Value(a + b);
    if (op == "-") return Value(a - b);
    if (op == "*") return Value(a * b);
    if (op == "**") return Value(std::pow(a, b));
    if (op == "//" || op == "%") {
      if (b == 0) fail(e.line, "float division or modulo by zero");
      const double q = std::floor(a / b);
      return Value(op == "//" ? q : a - q * b);
    }
    fail(e.line, "unknown operator " + op);
  }

  const RenderLimits& limits_;
  std::vector<Frame> frames_;
  std::string out_;
  size_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source) : parsed_(std::make_unique<Parsed>()) {
  parsed_->body = parse(source);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Dict& context, const RenderLimits& limits) const {
  return Interpreter(context, limits).run(parsed_->body);
}

}  // namespace troupe::jinja
