#pragma once
// Responses as bytes on the wire, made by Beast's serializer (and the
// chunks of a streamed body as Beast's chunk encoder writes them). The session queues these bytes
// and keeps one write in flight, so that events arriving during a write go out together with the
// next one and a slow reader holds at most one response's worth of memory.
#include <string>
#include <string_view>

#include "net/response.h"

namespace troupe::http_framing {

// A whole response with Content-Length; Connection says whether the
// connection stays open after it. `head_only`: the answer to HEAD, the same
// header (Content-Length included) without the body. `extra`: headers every
// response on this request carries (CORS), after the response's own.
std::string response(const Response& r, bool keep_alive, bool head_only = false,
                     const HeaderList& extra = {});

// "HTTP/1.1 100 Continue": the client may send the body it announced.
std::string interim_continue();

// The 200 text/event-stream header of a streamed response. `chunked`: the
// body is chunk-encoded; otherwise it ends when the connection closes (HTTP/1.0
// has no chunked encoding), and then `keep_alive` must be false.
std::string stream_head(bool chunked, bool keep_alive, const HeaderList& extra = {});
// A piece of the streamed body: one chunk, or the bytes as they are; nothing
// for an empty piece, because an empty chunk would end the body.
std::string stream_data(std::string_view data, bool chunked);
// The same appended to `out`: the chunk is written there directly, without
// the temporaries of Beast's chunk encoder (it goes out once per token).
void append_stream_data(std::string& out, std::string_view data, bool chunked);
// The end of the streamed body: the last chunk, or nothing (closing ends it).
std::string stream_end(bool chunked);

}  // namespace troupe::http_framing
