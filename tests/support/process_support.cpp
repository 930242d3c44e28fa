#include "support/process_support.h"

namespace troupe::test {

HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body, double timeout_s,
                          const HttpHeaders& extra_headers) {
  HttpClient client(loopback_client(port, timeout_s));
  return client.request({.method = method,
                         .target = target,
                         .body = body,
                         .headers = extra_headers,
                         .keep_alive = false});
}

HttpClient::Options loopback_client(int port, double timeout_s, bool retry_stale) {
  HttpClient::Options o;
  o.host = "127.0.0.1";
  o.port = std::to_string(port);
  o.connect_timeout_s = timeout_s;
  o.io_timeout_s = timeout_s;
  o.retry_stale_connection = retry_stale;
  return o;
}

}  // namespace troupe::test
