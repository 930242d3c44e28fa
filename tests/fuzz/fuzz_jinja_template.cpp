// A chat template through the Jinja interpreter (text/jinja), rendered on a
// chat with tools and a tool call, as `troupe serve` renders a model's own.
// Oracles: only jinja::Error escapes (Raised is one); the render is bounded
// (steps, output, depth: the limits are small here so that a loop the
// fuzzer writes ends quickly); rendering twice gives the same text.
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_support.h"
#include "text/jinja/template.h"

namespace troupe::fuzz {
namespace {

const jinja::Dict& chat() {
  static const jinja::Dict context = [] {
    const auto j = nlohmann::ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Weather in Zürich? \n"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2.5]}}}]},
        {"role": "tool", "content": "{\"t\": 21}", "tool_call_id": "c1", "name": "get_weather"},
        {"role": "assistant", "content": "<think>\nwarm\n</think>\n\nIt is 21 °C."},
        {"role": "user", "content": "Thanks"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
      "documents": null, "enable_thinking": false})");
    return jinja::Value::from_json(j).dict();
  }();
  return context;
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  if (size > 64 * 1024) return 0;
  const std::string source(fuzz::as_text(data, size));
  jinja::RenderLimits limits;
  limits.max_steps = 20'000;
  limits.max_output_bytes = 256 * 1024;
  limits.max_depth = 16;
  std::string first;
  const bool rendered = fuzz::expect_only<jinja::Error>([&] {
    const jinja::Template t(source);
    first = t.render(fuzz::chat(), limits);
    if (t.render(fuzz::chat(), limits) != first) fuzz::violated("two renders differ");
  });
  if (rendered && first.size() > limits.max_output_bytes) fuzz::violated("output past its bound");
  return 0;
}
