#pragma once
// A client of one Troupe server's HTTP endpoints, the token-guarded ones
// included (POST and GET /admin/faults): a fresh connection per request,
// since callers send a few, far apart.
#include <string>

#include "net/http_client.h"

namespace troupe {

struct ServerEndpoint {
  std::string host = "127.0.0.1";
  std::string port;
  std::string token;    // /admin/ paths: sent as `Authorization: Bearer TOKEN` when not empty
  std::string api_key;  // every other path: the same with the server's API key

  HttpResponse call(const std::string& method, const std::string& target,
                    const std::string& body = "", double timeout_s = 10) const;
};

// A token for a server started here with fault injection on: unguessable
// (from std::random_device), hex.
std::string fresh_admin_token();

}  // namespace troupe
