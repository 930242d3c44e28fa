#include "support/scripted_server.h"

#include <sys/socket.h>

#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "net/http_framing.h"

namespace troupe::test {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

std::string ScriptedServer::Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  return "";
}

bool ScriptedServer::Connection::write(std::string_view bytes) {
  beast::error_code ec;
  asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
  return !ec;
}

bool ScriptedServer::Connection::respond(int status, const std::string& body,
                                         const HttpHeaders& headers, bool keep_alive) {
  Response r;
  r.status = status;
  r.body = body;
  r.headers = headers;
  return write(http_framing::response(r, keep_alive));
}

bool ScriptedServer::Connection::pause(double s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  while (std::chrono::steady_clock::now() < until) {
    if (stopping_) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return !stopping_;
}

ScriptedServer::ScriptedServer(Handler handler) : handler_(std::move(handler)), acceptor_(ioc_) {
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  acceptor_.open(ep.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
  accept_thread_ = std::thread([this] { accept_loop(); });
}

ScriptedServer::~ScriptedServer() {
  stopping_ = true;
  {
    // Wakes the blocking accept().
    asio::io_context ioc;
    tcp::socket s(ioc);
    beast::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port_}, ec);
  }
  accept_thread_.join();
  std::lock_guard lock(m_);
  for (auto& s : sockets_) ::shutdown(s->native_handle(), SHUT_RDWR);
  for (auto& t : threads_) t.join();
}

std::vector<ScriptedServer::Request> ScriptedServer::requests() const {
  std::lock_guard lock(m_);
  return requests_;
}

void ScriptedServer::accept_loop() {
  for (;;) {
    auto s = std::make_shared<tcp::socket>(ioc_);
    beast::error_code ec;
    acceptor_.accept(*s, ec);
    if (stopping_) return;
    if (ec) continue;
    ++connections_;
    std::lock_guard lock(m_);
    sockets_.push_back(s);
    threads_.emplace_back([this, s] { serve(*s); });
  }
}

void ScriptedServer::serve(tcp::socket& socket) {
  socket.set_option(tcp::no_delay(true));
  beast::flat_buffer buf;
  for (;;) {
    http::request<http::string_body> req;
    beast::error_code ec;
    http::read(socket, buf, req, ec);
    if (ec || stopping_) break;
    Request r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.body = req.body();
    r.version = req.version();
    r.keep_alive = req.keep_alive();
    for (const auto& f : req)
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    {
      std::lock_guard lock(m_);
      requests_.push_back(r);
    }
    Connection c(socket, stopping_);
    if (!handler_(r, c)) break;
  }
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
}

}  // namespace troupe::test
