// The CORS policy: which origins may read answers, and the preflight's answer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "net/cors.h"
#include "service/allowed_origin.h"

namespace troupe {
namespace {

std::string header(const HeaderList& h, std::string_view name) {
  for (const auto& [n, v] : h)
    if (n == name) return v;
  return "<none>";
}

TEST(Cors, OriginsAreSchemeHostAndPortOnly) {
  for (const char* ok : {"*", "http://localhost:3000", "https://chat.example.com",
                         "chrome-extension://abcdef", "http://[::1]:8080"})
    EXPECT_FALSE(invalid_origin(ok)) << ok;
  for (const char* bad : {"", "localhost:3000", "://x", "http://", "ht tp://x", "http://a b"})
    EXPECT_NE(invalid_origin(bad).value_or("").find("is not an origin"), std::string::npos) << bad;
  EXPECT_EQ(invalid_origin("http://localhost:3000/").value_or(""),
            "'http://localhost:3000/' has a path; an origin is scheme://host[:port] only");
  EXPECT_THROW(CorsPolicy({"*", "example.com"}), std::invalid_argument);
}

TEST(Cors, AnyOriginIsStarAndNeedsNoVary) {
  const CorsPolicy any;  // the default: every page, as vLLM
  const HeaderList h = any.response_headers("http://evil.example");
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_TRUE(any.response_headers("").empty()) << "no Origin, not a page's request";
}

TEST(Cors, ListedOriginsAreEchoedAndCaseInsensitive) {
  const CorsPolicy listed({"http://localhost:3000", "https://Chat.Example.com"});
  EXPECT_EQ(header(listed.response_headers("http://localhost:3000"), "Access-Control-Allow-Origin"),
            "http://localhost:3000");
  EXPECT_EQ(
      header(listed.response_headers("https://chat.example.com"), "Access-Control-Allow-Origin"),
      "https://chat.example.com");
  const HeaderList other = listed.response_headers("http://localhost:3001");
  EXPECT_EQ(header(other, "Access-Control-Allow-Origin"), "<none>");
  EXPECT_EQ(header(other, "Vary"), "Origin") << "the answer depends on Origin: caches must know";
  const CorsPolicy none(std::vector<std::string>{});
  EXPECT_TRUE(none.response_headers("http://localhost:3000").empty());
}

TEST(Cors, PreflightAllowsThePathsMethodsAndTheAskedHeaders) {
  const CorsPolicy listed({"http://localhost:3000"});
  const Response r = listed.preflight("/v1/chat/completions", "POST", "http://localhost:3000",
                                      "POST", " authorization, content-type ");
  EXPECT_EQ(r.status, 204);
  EXPECT_TRUE(r.body.empty());
  EXPECT_TRUE(r.content_type.empty());
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Methods"), "POST");
  EXPECT_EQ(header(r.headers, "Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(header(r.headers, "Access-Control-Max-Age"), "600");
  EXPECT_EQ(header(r.headers, "Vary"), "Origin");
  const Response get = CorsPolicy().preflight("/v1/models", "GET, HEAD", "http://x", "HEAD", "");
  EXPECT_EQ(get.status, 204);
  EXPECT_EQ(header(get.headers, "Access-Control-Allow-Headers"), "<none>");
}

TEST(Cors, PreflightRefusalsSayWhy) {
  const CorsPolicy listed({"http://localhost:3000"});
  const Response origin =
      listed.preflight("/v1/completions", "POST", "http://localhost:4000", "POST", "");
  EXPECT_EQ(origin.status, 403);
  EXPECT_EQ(header(origin.headers, "Access-Control-Allow-Origin"), "<none>");
  EXPECT_EQ(nlohmann::json::parse(origin.body)["error"]["message"],
            "Cross-origin requests from http://localhost:4000 are not allowed "
            "(server.allowed_origins).");
  const Response method =
      listed.preflight("/health", "GET, HEAD", "http://localhost:3000", "DELETE", "");
  EXPECT_EQ(method.status, 403);
  EXPECT_EQ(nlohmann::json::parse(method.body)["error"]["message"],
            "Method DELETE is not allowed on /health; use GET, HEAD.");
}

TEST(Cors, PlainOptionsSaysAllow) {
  const Response r = CorsPolicy().preflight("/health", "GET, HEAD", "", "", "");
  EXPECT_EQ(r.status, 204);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(header(r.headers, "Allow"), "GET, HEAD");
}

}  // namespace
}  // namespace troupe
