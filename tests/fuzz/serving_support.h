#pragma once
// The serving side as `troupe serve --config configs/default.yaml` sets it
// up, for the targets that drive the HTTP server and the OpenAI decoder.
#include <cstddef>

#include "net/http_server.h"
#include "net/openai_api.h"
#include "text/tokenizer.h"

namespace troupe::fuzz {

// models/fortune's tokenizer, loaded once.
const Tokenizer& fortune_tokenizer();

// What the server enforces for models/fortune under the default config:
// context 256 (max_position_embeddings), vocabulary 2000, max_tokens_limit.
openai::ModelLimits fortune_limits();

// The server's limits on a request (HttpServer::Options' defaults, which
// the default config keeps).
inline const HttpServer::Options kServerLimits{};

}  // namespace troupe::fuzz
