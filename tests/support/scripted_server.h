#pragma once
// A small HTTP server on 127.0.0.1 (port 0) for tests of HTTP clients: a
// thread per connection reads requests with Beast, and the test answers each
// with whatever bytes it wants (odd chunk cuts, stalls, early closes).
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "net/http_client.h"

namespace troupe::test {

class ScriptedServer {
 public:
  struct Request {
    std::string method, target, body;
    HttpHeaders headers;
    unsigned version = 11;
    bool keep_alive = true;
    std::string header(std::string_view name) const;  // case-insensitive, "" if absent
  };

  // One accepted connection, as the handler writes to it.
  class Connection {
   public:
    // False once the client is gone.
    bool write(std::string_view bytes);
    // A whole response with Content-Length, Beast-framed.
    bool respond(int status, const std::string& body, const HttpHeaders& headers = {},
                 bool keep_alive = true);
    // Sleeps up to `s` seconds; false (at once) when the server is stopping.
    bool pause(double s);

   private:
    friend class ScriptedServer;
    Connection(boost::asio::ip::tcp::socket& socket, const std::atomic<bool>& stopping)
        : socket_(socket), stopping_(stopping) {}
    boost::asio::ip::tcp::socket& socket_;
    const std::atomic<bool>& stopping_;
  };

  // Answers one request; returns whether to read another on the connection
  // (false: the server closes it).
  using Handler = std::function<bool(const Request&, Connection&)>;

  explicit ScriptedServer(Handler handler);
  ~ScriptedServer();
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_; }
  std::vector<Request> requests() const;  // every request so far, in arrival order

 private:
  void accept_loop();
  void serve(boost::asio::ip::tcp::socket& socket);

  Handler handler_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  mutable std::mutex m_;
  std::vector<std::shared_ptr<boost::asio::ip::tcp::socket>> sockets_;
  std::vector<std::thread> threads_;
  std::vector<Request> requests_;
  std::thread accept_thread_;  // last: starts once the state above exists
};

}  // namespace troupe::test
