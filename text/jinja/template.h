#pragma once
// A Jinja template, parsed once and rendered many times: the interpreter
// behind a model's own chat template. It renders as transformers does
// (Python's Jinja with trim_blocks and lstrip_blocks), with bounds on what a
// template may spend (steps, output, nesting), since a request may bring its
// own template.
#include <memory>
#include <string>
#include <string_view>

#include "text/jinja/value.h"

namespace troupe::jinja {

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;
  size_t max_steps = 2'000'000;  // statements run, loop turns, calls
  int max_depth = 64;            // nested macro calls
};

class Template {
 public:
  // Throws Error naming the line of what it cannot parse.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // `context`'s entries are the template's variables, beside range,
  // namespace, dict and raise_exception. Throws Raised for the template's
  // raise_exception(), Error for anything else that goes wrong.
  std::string render(const Dict& context, const RenderLimits& limits = {}) const;

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace troupe::jinja
