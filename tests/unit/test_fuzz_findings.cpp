// What the fuzzers (tests/fuzz/, scripts/fuzz.sh) found: each input that
// broke a promise is kept in tests/data/fuzz/TARGET/ and run here through the
// same entry point as its fuzz target, expecting the documented answer.
#include <gtest/gtest.h>

#include <caf/detail/ieee_754.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <variant>
#include <vector>

#include "actors/wire_checks.h"
#include "deploy/config.h"
#include "faults/fault_book.h"
#include "faults/fault_json.h"
#include "fuzz/wire_samples.h"
#include "gpu/checkpoint.h"
#include "gpu/sampler.h"
#include "net/openai_api.h"
#include "support/error_messages.h"
#include "support/test_support.h"
#include "text/jinja/template.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

std::string finding(const std::string& target, const std::string& name) {
  return test::read_file(test::data_path("fuzz/" + target + "/" + name));
}

// As `troupe serve` sets them for models/fortune under the default config.
const openai::ModelLimits kFortune{"fortune", 256, 2000, 4096};

// A byte-level BPE vocabulary in a GGUF whose token is not UTF-8: the JSON
// the BPE reader takes threw nlohmann's type_error, which no caller expects
// (the server would terminate). Now refused with a runtime_error naming the
// token.
TEST(FuzzFindings, GgufBpeTokenThatIsNotUtf8IsRefusedNamingIt) {
  const auto path = test::data_path("fuzz/gguf/token-not-utf8.gguf");
  const std::string msg = test::message_of<std::runtime_error>([&] { Tokenizer::load(path); });
  EXPECT_TRUE(test::contains(msg, "token-not-utf8.gguf")) << msg;
  EXPECT_TRUE(test::contains(msg, "is not valid UTF-8")) << msg;
}

// general.architecture stored as a number: the container's GgufError for a
// key of the wrong kind escaped load_checkpoint, whose callers expect
// CheckpointError.
TEST(FuzzFindings, GgufKeyOfTheWrongKindIsACheckpointError) {
  const auto path = test::data_path("fuzz/gguf/architecture-not-a-string.gguf");
  const std::string msg = test::message_of<CheckpointError>([&] { load_checkpoint(path); });
  EXPECT_TRUE(test::contains(msg, "general.architecture should be a string")) << msg;
}

// "[1e3082,.3]": a number beyond a double is nlohmann's out_of_range, not a
// parse_error; it escaped the decoder and the server answered 500.
TEST(FuzzFindings, OpenAiNumberOverflowIsA400NamingIt) {
  const auto r =
      openai::parse_completion_request(finding("openai_request", "number-overflow.json"), kFortune);
  const auto* e = std::get_if<openai::ApiError>(&r);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  EXPECT_TRUE(test::contains(e->message, "number overflow")) << e->message;
  // The same inside an object, where a real client would put it.
  const auto r2 =
      openai::parse_completion_request(R"({"prompt": "x", "max_tokens": 1e400})", kFortune);
  ASSERT_TRUE(std::holds_alternative<openai::ApiError>(r2));
  EXPECT_EQ(std::get<openai::ApiError>(r2).status, 400);
}

// A model.path holding bytes that are not UTF-8 was accepted, and
// to_yaml() (--print-config) wrote it back as U+FFFD: not the same config.
// Now refused, naming the key.
TEST(FuzzFindings, ConfigTextThatIsNotUtf8IsRefusedNamingTheKey) {
  try {
    parse_config(finding("config", "invalid-utf8-path.yaml"), "fuzz.yaml");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "model.path");
    EXPECT_TRUE(test::contains(e.what(), "UTF-8")) << e.what();
  }
  Config c;
  EXPECT_THROW(apply_override(c, "model.name", "caf\xe9"), ConfigError);
  // Valid UTF-8 beyond ASCII still reads and survives to_yaml().
  apply_override(c, "model.name", "caf\xc3\xa9 \xe2\x98\x83");
  EXPECT_EQ(parse_config(to_yaml(c), "printed"), c);
}

// model.path "m ... .bin " followed by carriage returns: to_yaml() wrote it
// as a plain scalar, which reads back without them (a CR is a line break,
// edge spaces are trimmed). Such text is now written double-quoted.
TEST(FuzzFindings, ConfigTextWithControlsOrEdgeSpacesSurvivesToYaml) {
  const Config c = parse_config(finding("config", "carriage-returns-in-path.yaml"), "fuzz.yaml");
  EXPECT_TRUE(test::contains(c.model.path, ".bin \r\r")) << c.model.path;
  EXPECT_EQ(parse_config(to_yaml(c), "printed"), c);
  for (const std::string name : {" lead", "trail ", "tab\t", "cr\rlf\n", "del\x7f", "bell\a"}) {
    Config d;
    apply_override(d, "model.name", name);
    EXPECT_EQ(parse_config(to_yaml(d), "printed").model.name, name) << to_yaml(d);
  }
  // The items of a list of text (placement.replicas, from main) are written
  // the same way. Node names hold no controls or spaces (refused), but may
  // read as YAML's other scalars, or hold the flow sequence's comma.
  for (const std::string name : {"a,b", "true", "null", "1e5", "-lead", "0x1F", "..."}) {
    Config e;
    e.parallel.tensor = 2;
    e.placement.replicas = {name};
    EXPECT_EQ(parse_config(to_yaml(e), "printed").placement.replicas, e.placement.replicas)
        << to_yaml(e);
  }
}

// config.json with 65536 heads of head_dim 65536: validate() computed
// q_dim() = n_heads * head_dim in int, which overflowed (undefined; wrapped
// to 0 it passed the size check). Found by a hand-made input to the hf_dir
// target, after reading the check. Now refused as absurdly large.
TEST(FuzzFindings, HfHeadCountTimesHeadDimOverflowIsRefused) {
  test::TempDir dir;
  test::write_file(dir / "config.json", finding("hf_dir", "head-product-overflow.json"));
  try {
    load_checkpoint(dir.path());
    FAIL() << "loaded";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(test::contains(e.what(), "config.json")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "absurdly large")) << e.what();
  }
}

// A 32-byte tokenizer.model whose second piece is "\0+o\x96 ": SentencePiece
// passes pieces to Darts as C strings, Darts threw "zero-length key" through
// a frame that cannot unwind, and the process died in std::terminate (no
// catch helps). Tokenizer::load now reads the pieces first and refuses an
// empty one or one holding a NUL byte.
TEST(FuzzFindings, TokenizerPieceWithANulByteIsRefusedNotATerminate) {
  test::TempDir dir;
  test::write_file(dir / "tokenizer.model", finding("tokenizer_model", "nul-leading-piece.model"));
  try {
    Tokenizer::load(dir / "tokenizer.model");
    FAIL() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(test::contains(e.what(), "piece 1 holds a NUL byte")) << e.what();
  }
  // The bundled models still load.
  EXPECT_GT(Tokenizer::load(test::model_path("fortune/tokenizer.model")).vocab_size(), 0);
}

// A chat template (Unsloth's, mutated) with "\\x" not followed by two hex
// digits: std::stoul's invalid_argument escaped the lexer, and `troupe serve`
// would have ended on it. Now a jinja::Error naming the line, as Python's
// SyntaxError; numbers past int64 and an index past it are no crash either.
TEST(FuzzFindings, JinjaBadEscapesAndHugeNumbersAreTemplateErrors) {
  try {
    jinja::Template t(finding("jinja_template", "bad-hex-escape.jinja"));
    FAIL() << "parsed";
  } catch (const jinja::Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "hex digits")) << e.what();
  }
  for (const char* source :
       {"{{ '\\xZZ' }}", "{{ '\\u12' }}", "{{ '\\U00110000' }}", "{{ x.99999999999999999999 }}"})
    EXPECT_THROW(jinja::Template{source}, jinja::Error) << source;
  jinja::Dict none;
  EXPECT_EQ(jinja::Template("{{ 99999999999999999999 }} {{ 1e999 }}").render(none), "1e+20 inf");
}

// "{% set ns.n = ns %}": a namespace holding itself was a cycle of shared
// values that nothing freed (a leak per render). Now an error naming it; and
// the methods that change a list or dict are refused, as in transformers'
// immutable sandbox, so no other cycle can be made.
TEST(FuzzFindings, JinjaValuesCannotHoldThemselves) {
  jinja::Dict user;
  user.set("role", jinja::Value("user"));
  user.set("content", jinja::Value("hi"));
  jinja::Dict chat;
  chat.set("messages", jinja::Value(jinja::List{jinja::Value(user)}));
  const auto error_of = [&](const std::string& source) {
    try {
      jinja::Template(source).render(chat);
    } catch (const jinja::Error& e) {
      return std::string(e.what());
    }
    return std::string("rendered");
  };
  EXPECT_TRUE(test::contains(error_of(finding("jinja_template", "namespace-holds-itself.jinja")),
                             "would hold 'ns' itself"));
  EXPECT_EQ(error_of("{% set ns = namespace(a=[]) %}{% set ns.b = [1, {'x': ns}] %}"),
            "line 1: 'ns.b' would hold 'ns' itself");
  EXPECT_EQ(error_of("{% set l = [] %}{{ l.append(l) }}"),
            "line 1: access to attribute 'append' of 'list' object is unsafe");
  EXPECT_EQ(error_of("{% set d = {} %}{{ d.update(d) }}"),
            "line 1: access to attribute 'update' of 'dict' object is unsafe");
  EXPECT_EQ(error_of("{{ messages.pop() }}"),
            "line 1: access to attribute 'pop' of 'list' object is unsafe");
  // A namespace still takes other namespaces and values.
  EXPECT_EQ(jinja::Template("{% set a = namespace(x=1) %}{% set b = namespace() %}"
                            "{% set b.a = a %}{% set b.l = [a, a] %}{{ b.a.x }}{{ b.l|length }}")
                .render(chat),
            "12");
}

// "000000000001692300*000016920001692314": 64-bit signed overflow, undefined
// behaviour (UBSan). Integers past 64 bits now go on as floats (Python's are
// unbounded), a float past them is an error where an integer is needed, and
// nesting (brackets, operators, blocks, long operator chains) is bounded so
// that parsing and rendering do not recurse without end.
TEST(FuzzFindings, JinjaIntegersPast64BitsAndDeepNestingAreNoUndefinedBehaviour) {
  const jinja::Dict none;
  EXPECT_NO_THROW(jinja::Template(finding("jinja_template", "int-overflow.jinja")).render(none));
  EXPECT_EQ(jinja::Template("{{ 9223372036854775807 + 1 }} {{ 3037000500 * 3037000500 }} "
                            "{{ 2 ** 70 }} {{ (-9223372036854775807 - 1) // -1 }} {{ 2 ** 62 }} "
                            "{{ [9223372036854775807, 1]|sum }} {{ -7 // 2 }}")
                .render(none),
            "9.223372036854776e+18 9.22337203700025e+18 1.1805916207174113e+21 "
            "9.223372036854776e+18 4611686018427387904 9.223372036854776e+18 -4");
  for (const char* source : {"{{ 1e300|int }}", "{{ '%d' % 1e300 }}", "{{ range(1e300) }}",
                             "{{ 'x'|indent(-1) }}", "{{ [1]|tojson(indent=100000) }}"})
    EXPECT_THROW(jinja::Template(source).render(none), jinja::Error) << source;
  const auto deep = [](const std::string& open, const std::string& middle, const std::string& close,
                       int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += open;
    s += middle;
    for (int i = 0; i < n; ++i) s += close;
    return s;
  };
  for (const std::string& source :
       {"{{ " + deep("(", "1", ")", 5000) + " }}", "{{ " + deep("[", "1", "]", 5000) + " }}",
        "{{ " + deep("-", "1", "", 5000) + " }}", "{{ " + deep("not ", "1", "", 5000) + " }}",
        deep("{% if true %}", "x", "{% endif %}", 5000), "{{ 1" + deep("+1", "", "", 5000) + " }}",
        "{% for x in [1]" + deep("+[1]", "", "", 5000) + " %}{% endfor %}"})
    EXPECT_THROW(jinja::Template{source}, jinja::Error) << source.substr(0, 40);
  EXPECT_EQ(jinja::Template("{{ " + deep("(", "1", ")", 150) + " }}").render(none), "1");
}

// ---- wire_messages: what one process decodes from another ----

// A wire_messages input (its first byte picks the message) decoded as the
// target decodes it; fails the test if CAF refuses it.
template <class... Ts>
void decode_finding(const std::string& name, Ts&... xs) {
  const std::string bytes = finding("wire_messages", name);
  ASSERT_FALSE(bytes.empty());
  size_t rest = 0;
  ASSERT_FALSE(fuzz::wire_decode(bytes.data() + 1, bytes.size() - 1, rest, xs...)) << name;
}

template <class T>
std::vector<char> reencoded(const T& x) {
  T y;
  size_t rest = 0;
  const std::vector<char> once = fuzz::wire_encode(x);
  EXPECT_FALSE(fuzz::wire_decode(once.data(), once.size(), rest, y));
  EXPECT_EQ(rest, 0u);
  EXPECT_EQ(fuzz::wire_encode(y), once);
  return once;
}

template <class F>
uint64_t bits_of(F f) {
  uint64_t b = 0;
  std::memcpy(&b, &f, sizeof f);
  return b;
}

// An assignment whose temperature decoded as -infinity (CAF 0.17 reads the
// bits ff ff ff ff so): re-encoding it hung in CAF's pack754, which halves
// an infinity until it is below 2. A process forwarding such a value (the
// leader's worker sends its items to the other parts) would hang, and CAF
// also wrote subnormals wrong (1e-40f arrived as -1.2e37, which the sampler
// refuses: a temperature any client could send killed every remote replica
// it was resumed on). The wire types now carry floats as their IEEE bits.
TEST(FuzzFindings, WireFloatsCrossAsTheirBitsAndAnInfinityNoLongerHangsTheSender) {
  Assignment a;
  decode_finding("assignment-float-hang.bin", a);
  EXPECT_TRUE(std::isnan(a.sampling.temperature));  // the bits as they came
  reencoded(a);
  EXPECT_NE(assignment_problem(a, 2000, 256), "");
  for (float f : {INFINITY, -INFINITY, NAN, 1e-40f, FLT_MIN / 2, FLT_MIN, 0.8f, 0.0f, -0.0f}) {
    Assignment x;
    x.sampling.temperature = f;
    x.sampling.top_p = f;
    const std::vector<char> bytes = reencoded(x);
    Assignment y;
    size_t rest = 0;
    ASSERT_FALSE(fuzz::wire_decode(bytes.data(), bytes.size(), rest, y));
    EXPECT_EQ(bits_of(y.sampling.temperature), bits_of(f)) << f;
    EXPECT_EQ(bits_of(y.sampling.top_p), bits_of(f)) << f;
  }
  for (double d : {double(INFINITY), -double(NAN), 1e-310, DBL_MIN, 0.004}) {
    StepEvents ev;
    ev.step_s = d;
    FaultOrder o;
    o.factor = d;
    reencoded(ev);
    reencoded(o);
    StepEvents ev2;
    FaultOrder o2;
    size_t rest = 0;
    const auto b1 = fuzz::wire_encode(ev), b2 = fuzz::wire_encode(o);
    ASSERT_FALSE(fuzz::wire_decode(b1.data(), b1.size(), rest, ev2));
    ASSERT_FALSE(fuzz::wire_decode(b2.data(), b2.size(), rest, o2));
    EXPECT_EQ(bits_of(ev2.step_s), bits_of(d)) << d;
    EXPECT_EQ(bits_of(o2.factor), bits_of(d)) << d;
  }
  // A normal number is written as before: CAF's pack754 gives its IEEE bits.
  for (float f : {0.8f, 1.0f, 2.5f, -3e10f, FLT_MIN})
    EXPECT_EQ(caf::detail::pack754(f), bits_of(f));
  for (double d : {0.004, 1000.0, DBL_MIN}) EXPECT_EQ(caf::detail::pack754(d), bits_of(d));
}

// A rendezvous value whose length claims 64 MiB in a 31-byte message: as a
// std::vector<char>, CAF 0.17 resizes to the claimed length before it checks
// the input holds it (the length is a 32-bit varint: up to 4 GiB, zeroed,
// per value, in the coordinator's middleman, from 5 bytes). Found reading
// CAF's data_processor.hpp while writing the wire target. The values travel
// as std::string now, whose length CAF checks against the input first.
TEST(FuzzFindings, WireRendezvousValuesAreStringsWhoseClaimedLengthIsCheckedFirst) {
  const std::string bytes = finding("wire_messages", "rendezvous-huge-length.bin");
  std::string key, value;
  size_t rest = 0;
  EXPECT_TRUE(fuzz::wire_decode(bytes.data() + 1, bytes.size() - 1, rest, key, value));
  EXPECT_EQ(key, "replica0/epoch3/tp0/rank1");
  EXPECT_EQ(value.capacity() < 1024, true);
  // What the old type did with it: the claimed 64 MiB, allocated.
  std::string key2;
  std::vector<char> old_value;
  EXPECT_TRUE(fuzz::wire_decode(bytes.data() + 1, bytes.size() - 1, rest, key2, old_value));
  EXPECT_EQ(old_value.size(), size_t(64) << 20);
}

// A replica plan of 16777216 x 20967424 devices: ReplicaPlan::devices()
// overflowed int (UBSan, with the checks off), and a node indexes hosts by
// device. Refused now before the node uses any of it. (With protocol 16's
// prefix_caching appended, as 1.)
TEST(FuzzFindings, WireReplicaPlanWhoseDeviceCountOverflowsIsRefused) {
  ReplicaPlan p;
  decode_finding("replica-plan-devices-overflow.bin", p);
  const std::string problem = replica_plan_problem(p);
  EXPECT_TRUE(test::contains(problem, "devices")) << problem;
}

// Assignments a node's engine would refuse or choke on: a token id far
// outside the vocabulary (the engine throws and the worker dies, and so
// does every replica the request is resumed on), a negative `generated`
// (a new sampler skips 2^64 - 1 draws: the worker hangs). The batcher now
// ends such a request as the server's cancel. (The second finding has
// SamplingParams::logprobs = -1 inserted, as protocol 10 encodes it, and
// both have no prompt log-probabilities, penalties nor bias inserted after
// it, as protocol 11 encodes them. Every assignment finding has since had
// the fields later protocols added inserted as their defaults: 14's
// reasoning start after the grammar, 15's priority before the channel's
// sequence number.)
TEST(FuzzFindings, WireAssignmentsTheEngineWouldRefuseEndAtTheBatcher) {
  Assignment a;
  decode_finding("assignment-token-outside-vocabulary.bin", a);
  std::string problem = assignment_problem(a, kFortune.vocab_size, kFortune.context_length);
  EXPECT_TRUE(test::contains(problem, "vocabulary")) << problem;
  Assignment b;
  decode_finding("assignment-negative-generated.bin", b);
  problem = assignment_problem(b, kFortune.vocab_size, kFortune.context_length);
  EXPECT_TRUE(test::contains(problem, "generated -1")) << problem;
}

// An assignment whose sampling asks for a grammar (structured output), at an
// engine with no vocabulary to follow it by: the sampler threw, failing the
// step of every sequence in it (and, resumed elsewhere, there too). Such a
// sequence now ends at once (its end id drawn), logged; a grammar that does
// not parse is refused by the wire checks before.
TEST(FuzzFindings, WireGrammarAtAnEngineWithoutAVocabularyEndsThatSequence) {
  Assignment a;
  decode_finding("assignment-grammar-no-vocabulary.bin", a);
  ASSERT_FALSE(a.sampling.grammar.empty());
  EXPECT_EQ(assignment_problem(a, 64, 64), "");
  SequenceSamplers samplers;
  samplers.set_eos_ids({2});
  StepItem item;
  item.seq = 1;
  item.sample = true;
  item.sampling.grammar = a.sampling.grammar;  // (the rest of its sampling masks id 2 too)
  std::vector<float> logits(64, 0.0f);
  logits[9] = 5;
  EXPECT_EQ(samplers.sample(item, logits), 2);
  Assignment bad = a;
  bad.sampling.grammar = "root ::= (";
  EXPECT_TRUE(test::contains(assignment_problem(bad, 64, 64), "sampling.grammar: grammar: line 1"));
}

// A fault order of kind 32: the worker's switch matched nothing, so nothing
// was applied or reported. The batcher now refuses it with a report.
TEST(FuzzFindings, WireFaultOrderOfAnUnknownKindIsRefused) {
  FaultOrder o;
  decode_finding("fault-order-unknown-kind.bin", o);
  const std::string problem = fault_order_problem(o);
  EXPECT_TRUE(test::contains(problem, "kind 32 is unknown")) << problem;
}

// A refusal whose text is not UTF-8 ("rep\xdclica 1 has 2 shard ..."): the
// fault book kept it, and GET /admin/faults threw nlohmann's type_error 316
// from then on. The fault injector now drops such a report.
TEST(FuzzFindings, WireFaultReportThatIsNotUtf8IsDropped) {
  FaultReport r;
  decode_finding("fault-report-not-utf8.bin", r);
  const std::string problem = fault_report_problem(r);
  EXPECT_TRUE(test::contains(problem, "UTF-8")) << problem;
  // What it did to the book's JSON.
  FaultBook book;
  FaultOrder o;
  o.kind = FaultKind::KvAllocFail;
  const FaultOrder added = book.add(o, 0, 1, 0);
  book.started(added.id, 0);
  r.id = added.id;
  book.report(r, 0);
  EXPECT_THROW((void)fault_entry_json(*book.get(added.id)).dump(), nlohmann::json::type_error);
}

// Step events saying -1 running and -1 queued tokens: the request table
// stored them as size_t, 2^64 - 1 in the load view every policy routes by.
// The router now drops such events. (With no prompt log-probabilities
// inserted before the tokens, as protocol 11 encodes them, and protocol
// 16's cached blocks and prefix figures, as 0, before the sequence number.)
TEST(FuzzFindings, WireStepEventsWithNegativeCountsAreDropped) {
  StepEvents ev;
  decode_finding("step-events-negative-running.bin", ev);
  const std::string problem = step_events_problem(ev);
  EXPECT_TRUE(test::contains(problem, "running -1")) << problem;
}

}  // namespace
}  // namespace troupe
