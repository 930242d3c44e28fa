// The Jinja interpreter behind chat templates, against Python's Jinja as
// transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, its
// tojson): every expected text here was produced by jinja2 3.1, and the real
// templates' renders by scripts/render_chat_templates.py.
#include <gtest/gtest.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "support/test_support.h"
#include "text/jinja/template.h"

namespace troupe::jinja {
namespace {

// The chat the expression table reads from.
Dict chat_context() {
  List messages;
  for (const auto& [role, content] : std::vector<std::pair<const char*, const char*>>{
           {"system", "S"}, {"user", "U1"}, {"assistant", "A"}, {"user", "U2"}}) {
    Dict m;
    m.set("role", Value(role));
    m.set("content", Value(content));
    messages.emplace_back(std::move(m));
  }
  Dict context;
  context.set("messages", Value(std::move(messages)));
  return context;
}

std::string render(std::string_view source, const Dict& context = chat_context(),
                   const RenderLimits& limits = {}) {
  return Template(source).render(context, limits);
}

struct Case {
  const char* source;
  const char* python;  // what jinja2 rendered
};

// Each line of a template checked by itself: values printed as Python prints
// them, operators, filters, tests, methods, loops, scopes and whitespace.
const Case kPythonAnswers[] =
    {
        {R"J({{ 'a' ~ none ~ true ~ 1.5 ~ [1,'x'] ~ {'k': none} }})J",
         R"J(aNoneTrue1.5[1, 'x']{'k': None})J"},
        {R"J({{ none }}|{{ true }}|{{ 1e3 }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-7 }}|{{ 3 / 2 }}|{{ 4 / 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }})J",
         R"J(None|True|1000.0|1.0|0.30000000000000004|1e+20|1e-07|1.5|2.0|1024|0.5|3.0|0.5)J"},
        {R"J({{ [3,1,2]|sort }}|{{ ['b','A','a']|sort }}|{{ ['b','A','a']|sort(case_sensitive=true) }}|{{ [3,1,2]|sort(reverse=true) }}|{{ ['a','A','b']|unique|list }})J",
         R"J([1, 2, 3]|['A', 'a', 'b']|['A', 'a', 'b']|[3, 2, 1]|['a', 'b'])J"},
        {R"J({{ 'Hello World'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }})J",
         R"J(hello world|Hello World|Hello|x|hi|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c'])J"},
        {R"J({{ 'abc'|length }}|{{ '日本語'|length }}|{{ '日本語'[1] }}|{{ '日本語'[::-1] }}|{{ [1,2,3][-1] }}|{{ [1,2,3][1:] }}|{{ [1,2,3][:-1] }}|{{ [1,2,3,4,5][::2] }}|{{ [1,2,3][5] }}|{{ 'abc'[1:2] }})J",
         R"J(3|3|本|語本日|3|[2, 3]|[1, 2]|[1, 3, 5]||b)J"},
        {R"J({{ {'b':1,'a':2}|dictsort }}|{{ {'b':1,'a':2}|items|list }}|{{ {'b':1,'a':2}.items()|list }}|{{ {'b':1}.get('b') }}|{{ {'b':1}.get('c') }}|{{ {'b':1}.get('c', 5) }}|{{ {'a':1}.keys()|list }})J",
         R"J([('a', 2), ('b', 1)]|[('b', 1), ('a', 2)]|[('b', 1), ('a', 2)]|1|None|5|['a'])J"},
        {R"J({{ [1,2,3]|join('-') }}|{{ [{'a':'x'},{'a':'y'}]|map(attribute='a')|join }}|{{ ['a','b']|map('upper')|list }}|{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('even')|list }}|{{ [1,2,3]|sum }}|{{ [1,5,3]|max }}|{{ [4,2,6]|min }})J",
         R"J(1-2-3|xy|['A', 'B']|[1, 3]|[1, 3]|6|5|2)J"},
        {R"J({{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ 'x' is string }}|{{ 1 is number }}|{{ true is number }}|{{ true is integer }}|{{ 1.0 is float }}|{{ [] is iterable }}|{{ {} is mapping }}|{{ none is none }})J",
         R"J(d||d|None|True|True|True|False|True|True|True|True)J"},
        {R"J({{ 3 is divisibleby 3 }}|{{ 'a' is in 'abc' }}|{{ 2 is in [1,2] }}|{{ 'x' is equalto 'x' }}|{{ 5 is gt 3 }}|{{ 'abc' is lower }}|{{ 'ABC' is upper }}|{{ x is undefined }}|{{ f is callable }}|{{ range is callable }})J",
         R"J(True|True|True|True|True|True|True|True|True|True)J"},
        {R"J({{ '%s'|format('x') if false else 'skip' }}|{{ 'a{}b{}'.format(1, 'z') }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x','c')) }}|{{ 'abcabc'.replace('b','X') }}|{{ 'abcabc'.replace('b','X', 1) }}|{{ 'abcabc'|replace('b','Y') }}|{{ 'abc'.find('c') }}|{{ 'abc'.find('z') }}|{{ 'aXbXc'.count('X') }})J",
         R"J(skip|a1bz|True|True|aXcaXc|aXcabc|aYcaYc|2|-1|2)J"},
        {R"J({{ "a\nb\n\nc"|indent(2) }}|{{ "a\nb"|indent(2, true) }}|{{ "a\n\nb"|indent(2, blank=true) }}|{{ 'x y z'|wordcount }}|{{ [1,2,3,4,5]|batch(2)|list }}|{{ 3.14159|round(2) }}|{{ 2.5|round }}|{{ '42'|int }}|{{ 'x'|int }}|{{ '3.5'|float }}|{{ 3|float }}|{{ -3|abs }})J",
         R"J(a
  b

  c|  a
  b|a
  
  b|3|[[1, 2], [3, 4], [5]]|3.14|2.0|42|0|3.5|3.0|3)J"},
        {R"J({{ {'a': [1, 2.5, none, true, 'é"\n'], 'b': {}}|tojson }}|{{ [1,[2]]|tojson(indent=2) }}|{{ {'z':1,'a':2}|tojson(sort_keys=true) }}|{{ ''|tojson }}|{{ "</s>"|tojson }})J",
         R"J({"a": [1, 2.5, null, true, "é\"\n"], "b": {}}|[
  1,
  [
    2
  ]
]|{"a": 2, "z": 1}|""|"</s>")J"},
        {R"J({% for a, b in [[1,2],[3,4]] %}{{ a }}{{ b }}{{ loop.index }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %})J",
         R"J(1212TrueFalse23421FalseTrue2)J"},
        {R"J({% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}{% else %}empty{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %})J",
         R"J(13|empty)J"},
        {R"J({% for x in [1,2,3,4] if x is even %}{{ loop.index }}:{{ x }}{{ ',' if not loop.last }}{% endfor %}|{% for k in {'a':1,'b':2} %}{{ k }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %})J",
         R"J(1:2,2:4|ab|[h][é])J"},
        {R"J({% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{{ loop.previtem }}{{ loop.nextitem }}{% endfor %})J",
         R"J(a2b13a2)J"},
        {R"J({% set a = 1 %}{% for x in [1,2,3] %}{% set a = a + x %}{{ a }}{% endfor %}|{{ a }})J",
         R"J(234|1)J"},
        {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}inner {{ a }}{% endset %}[{{ t }}]{% set u | upper %}up{% endset %}{{ u }})J",
         R"J(12[inner 1]UP)J"},
        {R"J({% macro m(x, y=2) -%} ({{ x }},{{ y }}) {%- endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(y=5, x=0) }})J",
         R"J((1,2)(1,3)(0,5))J"},
        {R"J({% filter upper %}hello {{ 'x' }}{% endfilter %}|{{ 'a' if true }}|{{ 'a' if false }}|{{ 'a' if false else 'b' if true else 'c' }})J",
         R"J(HELLO X|a||b)J"},
        {R"J({{ not true }}|{{ not 1 == 2 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'a' not in 'b' }}|{{ 1 in [1] and 2 not in [1] }}|{{ none or 'x' }}|{{ 0 and 'x' }}|{{ '' or [] }})J",
         R"J(False|True|True|False|True|True|x|0|[])J"},
        {R"J(text   {%- if true -%}   trimmed   {%- endif -%}   end)J", R"J(texttrimmedend)J"},
        {R"J({% raw %}{{ not rendered }}{% endraw %})J", R"J({{ not rendered }})J"},
        {R"J({{ "a" "b" }}|{{ 'it''s' }}|{{ "say \"hi\"" }}|{{ 'tab\there' }}|{{ '\u00e9' }}|{{ [none, 'a', 1.5] }}|{{ {'a': 'b'} }}|{{ "it's" }}|{{ ["it's"] }})J",
         R"J(ab|its|say "hi"|tab	here|é|[None, 'a', 1.5]|{'a': 'b'}|it's|["it's"])J"},
        {R"J({{ messages[0]['content'] }}|{{ messages[0].content }}|{{ messages|length }}|{{ messages[-1].role }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|map(attribute='role')|join(',') }})J", R"J(S|S|4|user|2|system,user,assistant,user)J"},
        {R"J({{ messages|rejectattr('role', 'in', ['system'])|map(attribute='role')|list }}|{{ messages[1:]|map(attribute='content')|first }}|{{ (messages|last).content }}|{{ messages[0].get('x', 'dflt') }}|{{ messages[0].missing is defined }})J",
         R"J(['user', 'assistant', 'user']|U1|U2|dflt|False)J"},
        {R"J({{ range(3)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1, b=2) }}|{{ 'abc'|list }}|{{ 'abc'|first }}|{{ [1,2]|last }}|{{ 'abc'|reverse }}|{{ [1,2]|reverse|list }})J",
         R"J([0, 1, 2]|[1, 4, 7]|[5, 3, 1]|{'a': 1, 'b': 2}|['a', 'b', 'c']|a|2|cba|[2, 1])J"},
        {R"J({{ '  lead'.lstrip() }}|{{ 'trail  '.rstrip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a\n'.strip('\n') }}|{{ 'AbC'.upper() }}|{{ 'AbC'.lower() }}|{{ 'a b'.title() }}|{{ 'l1\nl2\r\nl3'.splitlines() }}|{{ '12'.isdigit() }}|{{ 'ab1'.isalpha() }})J",
         R"J(lead|trail|a|a|ABC|abc|A B|['l1', 'l2', 'l3']|True|False)J"},
        {R"J({{ "multi\nline" }})J",
         R"J(multi
line)J"},
        {R"J({{ (1, 2) }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ [1] == [1] }}|{{ {'a':1} == {'a':1} }}|{{ 'a' < 'b' }}|{{ [1,2] < [1,3] }})J",
         R"J((1, 2)|True|True|True|True|True|True)J"},
        {R"J({% if true %}
  x
{% endif %}
)J",
         R"J(  x
)J"},
        {R"J(  {% if true %}
    indented
  {% endif %}
after)J",
         R"J(    indented
after)J"},
        {R"J(text   {%- if true -%}   trimmed   {%- endif -%}   end)J", R"J(texttrimmedend)J"},
        {R"J({%+ if true %}  keep{% endif %}
)J",
         R"J(  keep)J"},
        {R"J(a {# comment #} b {#- c -#} c
{# line #}
d)J",
         R"J(a  bc
d)J"},
        {R"J({% raw %}{{ not rendered }}{% endraw %})J", R"J({{ not rendered }})J"},
        {R"J(line1
line2
)J",
         R"J(line1
line2)J"},
        {R"J({{ 'a' }}
{{ 'b' }}
)J",
         R"J(a
b)J"},
        {R"J({% for i in range(2) %}
  - {{ i }}
{% endfor %}
)J",
         R"J(  - 0
  - 1
)J"},
        {R"J({%- for i in range(2) %}
  - {{ i }}
{%- endfor %})J",
         R"J(  - 0  - 1)J"},
        {R"J({{ {'a': {'b': {}}}|tojson }})J", R"J({"a": {"b": {}}})J"},
        {R"J({% set x = {'a': 1} %}{{ x.a }}{{ x['a'] }})J", R"J(11)J"},
        {R"J({{ 'a%sb%dc%%' % ('x', 3) }}|{{ '%s!' % 'one' }}|{{ '%r' % 'q' }}|{{ '%s' % [1,'a'] }})J",
         R"J(axb3c%|one!|'q'|[1, 'a'])J"},
};

TEST(Jinja, RendersWhatPythonsJinjaRenders) {
  for (const Case& c : kPythonAnswers) {
    SCOPED_TRACE(c.source);
    std::string got;
    try {
      got = render(c.source);
    } catch (const std::exception& e) {
      got = std::string("threw: ") + e.what();
    }
    EXPECT_EQ(got, c.python);
  }
}

TEST(Jinja, ReadsWindowsNewlinesAsNewlinesAndDropsOneTrailingNewline) {
  EXPECT_EQ(render("{% if true %}\r\nline1\r\nline2\r\n"
                   "{% endif %}\r\n"),
            "line1\nline2\n");
  EXPECT_EQ(render("a\n\n"), "a\n");
}

TEST(Jinja, ParseErrorsNameTheLineAndTheProblem) {
  const auto error_of = [](std::string_view source) {
    try {
      Template t(source);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("a\n{% if x %}\nb"),
            "line 3: the template ended inside a block: expected {% endif %}");
  EXPECT_EQ(error_of("{{ x + }}"), "line 1: expected an expression, found the end of the tag");
  EXPECT_EQ(error_of("\n\n{% include 'other.jinja' %}"),
            "line 3: the tag 'include' is not supported in chat templates");
  EXPECT_EQ(error_of("{{ 'open"), "line 1: unclosed string literal");
  EXPECT_EQ(error_of("{# never closed"), "line 1: unclosed comment");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "line 1: recursive loops are not supported");
  EXPECT_EQ(error_of("{{ a ; b }}"), "line 1: unexpected character ';' in a tag");
}

TEST(Jinja, RenderErrorsNameTheLine) {
  const auto error_of = [](std::string_view source) {
    try {
      render(source);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("\n{{ x | nosuchfilter }}"), "line 2: no filter named 'nosuchfilter'");
  EXPECT_EQ(error_of("{{ 1 is nosuchtest }}"), "line 1: no test named 'nosuchtest'");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"), "line 1: unsupported operand types for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "line 1: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ nothing() }}"), "line 1: 'nothing' is not callable (undefined)");
  EXPECT_EQ(error_of("{{ 'a'.strip(1, 2) }}"),
            "line 1: strip() takes at most 1 arguments (2 given)");
  EXPECT_EQ(error_of("{{ messages|join(sep='') }}"),
            "line 1: join() got an unexpected keyword argument 'sep'");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.y = 2 %}"),
            "line 1: cannot set 'y' on 'x', a int (only on a namespace)");
}

TEST(Jinja, RaiseExceptionIsTheTemplatesOwnWord) {
  try {
    render(
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') "
        "}}{% endif %}");
    FAIL() << "no exception";
  } catch (const Raised& e) {
    EXPECT_STREQ(e.what(), "System role not supported");
  }
}

TEST(Jinja, ATemplateCannotRunForeverOrWriteWithoutBound) {
  RenderLimits limits;
  limits.max_steps = 10'000;
  limits.max_output_bytes = 1000;
  limits.max_depth = 20;
  EXPECT_THROW(
      render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
             chat_context(), limits),
      Error);
  EXPECT_THROW(render("{% for i in range(500) %}xxxxx{% endfor %}", chat_context(), limits), Error);
  EXPECT_THROW(render("{{ 'x' * 100000 }}", chat_context(), limits), Error);
  // Text doubled in a loop is stopped at the bound, not when memory runs out.
  EXPECT_THROW(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
               Error);
  EXPECT_THROW(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
               Error);
  EXPECT_THROW(
      render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", chat_context(), limits),
      Error);
  EXPECT_THROW(render("{{ range(10000000)|length }}"), Error);
  // Within bounds the same templates render.
  EXPECT_EQ(render("{% for i in range(5) %}x{% endfor %}", chat_context(), limits), "xxxxx");
}

TEST(Jinja, MacrosSeeTheTopLevelNotTheirCallersLoop) {
  EXPECT_EQ(render("{% set top = 'T' %}{% macro m() %}{{ top }}{{ inner }}{% endmacro %}"
                   "{% for inner in [1] %}{{ m() }}{% endfor %}"),
            "T");
}

TEST(Jinja, ValuesComeFromJsonInTheirOrder) {
  const auto j = nlohmann::ordered_json::parse(
      R"({"z": 1, "a": [true, null, 2.5, "s", {"k": -3}], "big": 18446744073709551615})");
  Dict context;
  context.set("x", Value::from_json(j));
  EXPECT_EQ(render("{{ x|tojson }}", context),
            R"({"z": 1, "a": [true, null, 2.5, "s", {"k": -3}], "big": 1.8446744073709552e+19})");
  EXPECT_EQ(render("{{ x.a[4].k }} {{ x['z'] }} {{ x.keys()|list }}", context),
            "-3 1 ['z', 'a', 'big']");
}

// The real chat templates of popular models, each on twelve chats (tools,
// tool calls, reasoning, whitespace, Unicode): byte for byte what transformers
// renders, and an error wherever it raises.
TEST(Jinja, RealChatTemplatesRenderAsTransformersRendersThem) {
  const auto folder = test::data_path("chat_templates");
  const auto cases = nlohmann::ordered_json::parse(test::read_file(folder / "cases.json"));
  const auto expected = nlohmann::ordered_json::parse(test::read_file(folder / "expected.json"));
  ASSERT_GE(expected.size(), 10u);
  // strftime_now() at the moment the expected texts were rendered.
  const Value now = Value::function("strftime_now", [](Args& a) {
    const std::string format = a.take(0, "").str();
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_wday = 5;
    tm.tm_yday = 207;
    char buf[128];
    return Value(std::string(buf, std::strftime(buf, sizeof buf, format.c_str(), &tm)));
  });
  size_t rendered = 0, refused = 0;
  for (const auto& [name, entry] : expected.items()) {
    const Template tmpl(test::read_file(folder / (name + ".jinja")));
    for (const auto& c : cases) {
      const std::string case_name = c["name"];
      SCOPED_TRACE(name + " / " + case_name);
      Dict context;
      context.set("messages", Value::from_json(c["messages"]));
      context.set("add_generation_prompt", Value::from_json(c["add_generation_prompt"]));
      context.set("bos_token", Value::from_json(entry["bos_token"]));
      context.set("eos_token", Value::from_json(entry["eos_token"]));
      context.set("tools", c.contains("tools") ? Value::from_json(c["tools"]) : Value(nullptr));
      context.set("documents", Value(nullptr));
      context.set("strftime_now", now);
      if (c.contains("kwargs"))
        for (const auto& [k, v] : c["kwargs"].items()) context.set(k, Value::from_json(v));
      const auto& want = entry["renders"][case_name];
      if (want.is_null()) {
        EXPECT_THROW(tmpl.render(context), Error);
        ++refused;
      } else {
        EXPECT_EQ(tmpl.render(context), want.get<std::string>());
        ++rendered;
      }
    }
  }
  EXPECT_GT(rendered, 100u);
  EXPECT_GT(refused, 10u);
}

}  // namespace
}  // namespace troupe::jinja
