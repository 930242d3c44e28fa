#include "net/admin_client.h"

#include <random>
#include <sstream>

namespace troupe {

HttpResponse ServerEndpoint::call(const std::string& method, const std::string& target,
                                  const std::string& body, double timeout_s) const {
  HttpClient::Options o;
  o.host = host;
  o.port = port;
  o.connect_timeout_s = o.io_timeout_s = timeout_s;
  HttpClient c(o);
  HttpRequest r;
  r.method = method;
  r.target = target;
  r.body = body;
  r.keep_alive = false;
  const std::string& secret = target.starts_with("/admin/") ? token : api_key;
  r.headers = bearer_headers(secret);
  return c.request(r);
}

std::string fresh_admin_token() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << rd() << rd() << rd() << rd();
  return s.str();
}

}  // namespace troupe
