#include "net/http_client.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>

namespace troupe {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = HttpClient::Clock;

namespace {

Clock::duration to_duration(double s) {
  // Capped so that "no timeout" values cannot overflow the clock.
  const double capped = std::clamp(s, 0.0, 1e7);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(capped));
}

bool iequals(std::string_view a, std::string_view b) {
  return beast::iequals(beast::string_view(a.data(), a.size()),
                        beast::string_view(b.data(), b.size()));
}

HttpError error_of(const beast::error_code& ec, HttpFailure kind) {
  if (ec == beast::error::timeout) kind = HttpFailure::Timeout;
  return {kind, ec.message()};
}

}  // namespace

std::string http_authority(const std::string& host, const std::string& port) {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return port == "80" ? h : h + ":" + port;
}

HttpHeaders bearer_headers(const std::string& secret) {
  if (secret.empty()) return {};
  return {{"Authorization", "Bearer " + secret}};
}

const char* to_string(HttpFailure f) {
  switch (f) {
    case HttpFailure::None:
      return "none";
    case HttpFailure::Connect:
      return "connect";
    case HttpFailure::Timeout:
      return "timeout";
    case HttpFailure::Io:
      return "io";
    case HttpFailure::Stopped:
      return "stopped";
  }
  return "unknown";
}

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

struct HttpClient::Impl {
  explicit Impl(Options o) : opt(std::move(o)) {}

  // Runs one asynchronous operation to completion on this thread. The
  // operations are asynchronous underneath because only those honour
  // tcp_stream's expiry: a plain synchronous read could hang forever on a
  // stalled server.
  template <class Initiate>
  beast::error_code run(Initiate&& initiate) {
    beast::error_code result = asio::error::operation_aborted;
    initiate([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  void expire(Clock::time_point deadline, double timeout_s) {
    stream->expires_at(std::min(Clock::now() + to_duration(timeout_s), deadline));
  }

  HttpError connect(Clock::time_point deadline) {
    if (connected) return {};
    buffer.clear();
    beast::error_code ec;
    if (endpoints.empty()) {
      tcp::resolver resolver(ioc);
      const auto found = resolver.resolve(opt.host, opt.port, ec);
      if (ec) return {HttpFailure::Connect, ec.message()};
      endpoints.assign(found.begin(), found.end());
    }
    // A fresh stream each time: one whose expiry fired is closed for good.
    stream.emplace(ioc);
    expire(deadline, opt.connect_timeout_s);
    ec = run([&](auto done) { stream->async_connect(endpoints, done); });
    if (ec) {
      close();
      return error_of(ec, HttpFailure::Connect);
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    connected = true;
    return {};
  }

  void close() {
    connected = false;
    if (!stream) return;
    beast::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->socket().close(ignored);
  }

  HttpResponse request(const HttpRequest& r, const BodyFn* on_body, Clock::time_point deadline) {
    for (int attempt = 0;; ++attempt) {
      const bool reused = connected;
      if (HttpError e = connect(deadline)) {
        HttpResponse res;
        res.error = std::move(e);
        return res;
      }
      HttpResponse res = send_and_read(r, on_body, deadline);
      const bool stale = reused && res.status == 0 && res.error.kind == HttpFailure::Io;
      if (stale && attempt == 0 && opt.retry_stale_connection) continue;
      return res;
    }
  }

  HttpResponse send_and_read(const HttpRequest& r, const BodyFn* on_body,
                             Clock::time_point deadline) {
    http::request<http::string_body> req = build(r);
    expire(deadline, opt.io_timeout_s);
    const auto ec = run([&](auto done) { http::async_write(*stream, req, done); });
    if (ec) {
      close();
      HttpResponse res;
      res.error = error_of(ec, HttpFailure::Io);
      return res;
    }
    return read(on_body, iequals(r.method, "HEAD"), deadline);
  }

  http::request<http::string_body> build(const HttpRequest& r) const {
    http::request<http::string_body> req;
    req.method_string(r.method);
    req.target(r.target);
    req.version(unsigned(r.version));
    req.set(http::field::host,
            opt.host_header.empty() ? http_authority(opt.host, opt.port) : opt.host_header);
    if (!opt.user_agent.empty()) req.set(http::field::user_agent, opt.user_agent);
    req.keep_alive(r.keep_alive);
    if (!r.body.empty() || iequals(r.method, "POST")) {
      req.set(http::field::content_type, r.content_type);
      req.body() = r.body;
      req.prepare_payload();
    }
    for (const auto& [name, value] : opt.headers) req.set(name, value);
    for (const auto& [name, value] : r.headers) req.set(name, value);
    return req;
  }

  // One response from the connection; its body kept, or handed to on_body.
  HttpResponse read(const BodyFn* on_body, bool head_request, Clock::time_point deadline) {
    HttpResponse res;
    const auto fail = [&](const beast::error_code& ec) {
      res.error = error_of(ec, HttpFailure::Io);
      close();
      return res;
    };
    if (!connected) return fail(asio::error::not_connected);
    http::response_parser<http::buffer_body> parser;
    parser.skip(head_request);
    // Not boost::none for "no limit": Beast 1.74 compares a Content-Length
    // against an empty optional as exceeding it.
    parser.body_limit(on_body ? std::numeric_limits<std::uint64_t>::max()
                              : std::uint64_t(opt.max_body_bytes));
    expire(deadline, opt.io_timeout_s);
    auto ec = run([&](auto done) { http::async_read_header(*stream, buffer, parser, done); });
    if (ec) return fail(ec);
    res.status = int(parser.get().result_int());
    for (const auto& field : parser.get())
      res.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));

    std::string piece(std::max<size_t>(opt.read_chunk_bytes, 1), '\0');
    while (!parser.is_done()) {
      parser.get().body().data = piece.data();
      parser.get().body().size = piece.size();
      expire(deadline, opt.io_timeout_s);
      // read_some, not read: it returns as soon as some body arrived, which
      // is what gives each piece its arrival time.
      ec = run([&](auto done) { http::async_read_some(*stream, buffer, parser, done); });
      if (ec == http::error::need_buffer) ec = {};
      const size_t n = piece.size() - parser.get().body().size;
      if (n > 0) {
        const std::string_view got(piece.data(), n);
        if (!on_body) {
          res.body.append(got);
        } else if (!(*on_body)(res, got)) {
          res.error = {HttpFailure::Stopped, "the caller stopped reading"};
          close();
          return res;
        }
      }
      if (ec) return fail(ec);
    }
    res.keep_alive = parser.keep_alive();
    if (!res.keep_alive) close();
    return res;
  }

  // Some raw bytes into `buffer`.
  beast::error_code read_some_raw() {
    expire(kNoDeadline, opt.io_timeout_s);
    size_t n = 0;
    const auto ec = run([&](auto done) {
      stream->async_read_some(buffer.prepare(4096),
                              [&n, done](beast::error_code e, size_t k) mutable {
                                n = k;
                                done(e);
                              });
    });
    buffer.commit(n);
    return ec;
  }

  Options opt;
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;  // read ahead: pipelined responses stay for the next read
  std::vector<tcp::endpoint> endpoints;
  bool connected = false;
};

HttpClient::HttpClient(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HttpClient::~HttpClient() {
  if (impl_) impl_->close();
}
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;

HttpError HttpClient::connect(Clock::time_point deadline) {
  return impl_->connect(deadline);
}

bool HttpClient::connected() const {
  return impl_->connected;
}

void HttpClient::close() {
  impl_->close();
}

HttpResponse HttpClient::request(const HttpRequest& request, Clock::time_point deadline) {
  return impl_->request(request, nullptr, deadline);
}

HttpResponse HttpClient::request(const HttpRequest& request, const BodyFn& on_body,
                                 Clock::time_point deadline) {
  return impl_->request(request, &on_body, deadline);
}

HttpError HttpClient::write_raw(std::string_view bytes) {
  Impl& c = *impl_;
  if (!c.connected) return {HttpFailure::Io, "not connected"};
  c.expire(kNoDeadline, c.opt.io_timeout_s);
  const auto ec = c.run([&](auto done) {
    asio::async_write(*c.stream, asio::buffer(bytes.data(), bytes.size()), done);
  });
  if (!ec) return {};
  c.close();
  return error_of(ec, HttpFailure::Io);
}

HttpResponse HttpClient::read_response() {
  return impl_->read(nullptr, /*head_request=*/false, kNoDeadline);
}

std::string HttpClient::read_raw_until(std::string_view needle) {
  Impl& c = *impl_;
  for (;;) {
    const std::string_view have(static_cast<const char*>(c.buffer.data().data()), c.buffer.size());
    if (const size_t at = have.find(needle); at != std::string_view::npos) {
      std::string out(have.substr(0, at + needle.size()));
      c.buffer.consume(out.size());
      return out;
    }
    if (!c.connected) break;
    if (c.read_some_raw()) {
      c.close();
      break;
    }
  }
  std::string out = beast::buffers_to_string(c.buffer.data());
  c.buffer.consume(c.buffer.size());
  return out;
}

bool HttpClient::wait_closed_by_peer() {
  Impl& c = *impl_;
  while (c.connected) {
    const auto ec = c.read_some_raw();
    c.buffer.consume(c.buffer.size());
    if (!ec) continue;
    c.close();
    return ec != beast::error::timeout;
  }
  return false;
}

}  // namespace troupe
