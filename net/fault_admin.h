#pragma once
// What the admin endpoints (POST and GET /admin/faults) serve: a runtime
// that injects faults. The server has one only when the configuration
// enables them (admin.faults, with admin.token); otherwise the paths do not
// exist.
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "faults/fault_book.h"

namespace troupe {

class FaultAdmin {
 public:
  virtual ~FaultAdmin() = default;
  // A fault described by a POST body (faults/fault_json.h): as recorded,
  // or why it was refused.
  virtual std::variant<FaultEntry, std::string> inject_json(std::string_view body) = 0;
  virtual std::vector<FaultEntry> faults() const = 0;
  // Requests of dead replicas resuming: [when the death was seen, when
  // their next token came], on the book's clock.
  virtual std::vector<FaultBook::Resume> resumes() const = 0;
  virtual double now() const = 0;  // the book's clock
};

}  // namespace troupe
