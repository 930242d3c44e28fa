#pragma once
// Bytes as a Beast stream, for the HTTP targets: Beast's read algorithms run
// over an input held in memory exactly as over a socket, handed out a few
// bytes at a time so that the parser also sees messages arriving in pieces.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <cstddef>
#include <string_view>

namespace troupe::fuzz {

// A SyncReadStream over `bytes`; read_some gives at most `piece` bytes.
class MemoryStream {
 public:
  MemoryStream(std::string_view bytes, size_t piece)
      : rest_(bytes), piece_(std::max<size_t>(1, piece)) {}

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, boost::beast::error_code& ec) {
    ec = {};
    if (rest_.empty()) {
      ec = boost::asio::error::eof;
      return 0;
    }
    const size_t n = boost::asio::buffer_copy(
        buffers, boost::asio::buffer(rest_.data(), std::min(rest_.size(), piece_)));
    rest_.remove_prefix(n);
    return n;
  }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    boost::beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  bool empty() const { return rest_.empty(); }

 private:
  std::string_view rest_;
  size_t piece_;
};

}  // namespace troupe::fuzz
