#pragma once
// What an actor that throws leaves behind: its exit reason names it and the
// exception (so supervision logs and the fault book show the cause), and
// the error log says the same.
#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <exception>
#include <string>

namespace troupe {

// An exception handler for set_exception_handler: "NAME died: WHAT".
inline auto die_naming(std::string name) {
  return [name = std::move(name)](std::exception_ptr& eptr) -> caf::error {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("{} died: {}", name, what);
    return caf::make_error(caf::sec::runtime_error, name + " died: " + what);
  };
}

}  // namespace troupe
