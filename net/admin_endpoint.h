#pragma once
// POST and GET /admin/faults: a bearer token checked, then a fault injected
// or the faults listed. Plain, so that it is tested without a socket.
#include <string>
#include <string_view>

#include "net/fault_admin.h"
#include "net/response.h"

namespace troupe {

// `authorization` is the request's Authorization header ("" when absent).
Response answer_faults(FaultAdmin& admin, const std::string& token, std::string_view method,
                       std::string_view authorization, std::string_view body);

}  // namespace troupe
