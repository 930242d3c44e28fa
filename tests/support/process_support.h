#pragma once
// Helpers for integration tests: child processes and HTTP requests on
// 127.0.0.1 (with the shared client, net/http_client.h).
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chaos/child_process.h"
#include "net/http_client.h"

namespace troupe::test {

using troupe::ChildProcess;

// One HTTP/1.1 request with the shared client (net/http_client.h) on a fresh
// connection to 127.0.0.1:port ("Connection: close"); status 0 when no
// response arrived.
HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body = "", double timeout_s = 60,
                          const HttpHeaders& extra_headers = {});

// The shared client's options for 127.0.0.1:port, every wait bounded by
// timeout_s. A server's own tests pass retry_stale = false, so that a
// connection the server closed wrongly is not quietly replaced.
HttpClient::Options loopback_client(int port, double timeout_s, bool retry_stale = true);

}  // namespace troupe::test
