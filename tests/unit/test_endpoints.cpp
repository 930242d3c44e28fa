// Routing: path and method to an endpoint, or the 404/405 to send.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/endpoints.h"

namespace troupe {
namespace {

using nlohmann::json;

Endpoint endpoint(std::string_view method, std::string_view target) {
  auto r = route(method, target);
  if (auto* e = std::get_if<Endpoint>(&r)) return *e;
  ADD_FAILURE() << method << " " << target << " got " << std::get<Response>(r).status;
  return Endpoint::Health;
}

Response refusal(std::string_view method, std::string_view target) {
  auto r = route(method, target);
  if (auto* resp = std::get_if<Response>(&r)) return *resp;
  ADD_FAILURE() << method << " " << target << " was routed";
  return {};
}

TEST(Endpoints, EveryEndpointWithItsMethod) {
  EXPECT_EQ(endpoint("POST", "/v1/completions"), Endpoint::Completions);
  EXPECT_EQ(endpoint("POST", "/v1/chat/completions"), Endpoint::ChatCompletions);
  EXPECT_EQ(endpoint("GET", "/v1/models"), Endpoint::Models);
  EXPECT_EQ(endpoint("GET", "/v1/models/fortune"), Endpoint::Model);
  EXPECT_EQ(endpoint("GET", "/v1/models/org/name?x=1"), Endpoint::Model) << "ids may hold '/'";
  EXPECT_EQ(endpoint("GET", "/health"), Endpoint::Health);
  EXPECT_EQ(endpoint("GET", "/ready"), Endpoint::Ready);
  EXPECT_EQ(endpoint("POST", "/tokenize"), Endpoint::Tokenize);
  EXPECT_EQ(endpoint("POST", "/detokenize"), Endpoint::Detokenize);
  EXPECT_EQ(endpoint("GET", "/version"), Endpoint::Version);
  EXPECT_EQ(endpoint("GET", "/metrics"), Endpoint::Metrics);
  EXPECT_EQ(endpoint("GET", "/metrics?name=x"), Endpoint::Metrics) << "the query is no part";
}

TEST(Endpoints, UnknownPathIs404) {
  const Response r = refusal("GET", "/nope?x=1");
  EXPECT_EQ(r.status, 404);
  const json j = json::parse(r.body);
  EXPECT_EQ(j["error"]["message"], "Not found: /nope");
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_TRUE(r.headers.empty());
  EXPECT_EQ(refusal("GET", "/v1/completions/").status, 404) << "paths match exactly";
}

TEST(Endpoints, WrongMethodIs405WithAllow) {
  const Response r = refusal("GET", "/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(json::parse(r.body)["error"]["message"],
            "Method GET is not allowed on /v1/completions; use POST.");
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0], (std::pair<std::string, std::string>{"Allow", "POST"}));
  EXPECT_EQ(refusal("GET", "/v1/chat/completions").headers[0].second, "POST");
  EXPECT_EQ(refusal("POST", "/v1/models/fortune").headers[0].second, "GET, HEAD");
  EXPECT_EQ(refusal("GET", "/v1/chat/completions/").status, 404);
  const Response d = refusal("DELETE", "/health");
  EXPECT_EQ(d.status, 405);
  EXPECT_EQ(d.headers[0].second, "GET, HEAD");
}

TEST(Endpoints, HeadIsGetWithoutTheBodyAndOnlyThere) {
  EXPECT_EQ(endpoint("HEAD", "/health"), Endpoint::Health);
  EXPECT_EQ(endpoint("HEAD", "/v1/models"), Endpoint::Models);
  EXPECT_EQ(endpoint("HEAD", "/v1/models/fortune"), Endpoint::Model);
  const Response r = refusal("HEAD", "/v1/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers[0].second, "POST");
  EXPECT_EQ(refusal("HEAD", "/nope").status, 404);
}

TEST(Endpoints, OptionsIsTakenOnEveryKnownPath) {
  EXPECT_EQ(endpoint("OPTIONS", "/v1/chat/completions"), Endpoint::Options);
  EXPECT_EQ(endpoint("OPTIONS", "/v1/models/fortune?x=1"), Endpoint::Options);
  EXPECT_EQ(refusal("OPTIONS", "/nope").status, 404);
  EXPECT_EQ(refusal("OPTIONS", "/admin/faults").status, 404) << "admin off";
  EXPECT_EQ(std::get<Endpoint>(route("OPTIONS", "/admin/faults", true)), Endpoint::Options);
  EXPECT_EQ(allowed_methods("/v1/completions"), "POST");
  EXPECT_EQ(allowed_methods("/v1/models/a"), "GET, HEAD");
  EXPECT_EQ(allowed_methods("/admin/faults"), "");
  EXPECT_EQ(allowed_methods("/admin/faults", true), "GET, HEAD, POST");
  EXPECT_EQ(allowed_methods("/nope"), "");
  EXPECT_TRUE(is_admin_path("/admin/faults"));
  EXPECT_FALSE(is_admin_path("/v1/completions"));
}

TEST(Endpoints, TheApiKeyGuardsTheModelsEndpointsOnly) {
  for (Endpoint e : {Endpoint::Completions, Endpoint::ChatCompletions, Endpoint::Models,
                     Endpoint::Model, Endpoint::Tokenize, Endpoint::Detokenize})
    EXPECT_TRUE(needs_api_key(e)) << int(e);
  for (Endpoint e : {Endpoint::Health, Endpoint::Ready, Endpoint::Version, Endpoint::Metrics,
                     Endpoint::Faults, Endpoint::Options})
    EXPECT_FALSE(needs_api_key(e)) << int(e);
}

TEST(Endpoints, AbsoluteFormTargetsRouteByTheirPath) {
  EXPECT_EQ(endpoint("POST", "http://127.0.0.1:8080/v1/completions"), Endpoint::Completions);
  EXPECT_EQ(endpoint("GET", "HTTP://example.com/v1/models/a/b?x=1"), Endpoint::Model);
  EXPECT_EQ(endpoint("GET", "https://example.com/health"), Endpoint::Health);
  EXPECT_EQ(refusal("GET", "http://example.com").status, 404);
  EXPECT_EQ(refusal("GET", "http://example.com?health").status, 404);
}

TEST(Endpoints, PathOf) {
  EXPECT_EQ(path_of("/a/b?c=d?e"), "/a/b");
  EXPECT_EQ(path_of("/a"), "/a");
  EXPECT_EQ(path_of(""), "");
  EXPECT_EQ(path_of("http://h:1/a/b?c"), "/a/b");
  EXPECT_EQ(path_of("Https://h/a"), "/a");
  EXPECT_EQ(path_of("http://h"), "/");
  EXPECT_EQ(path_of("http://h?x=/y"), "/");
  EXPECT_EQ(path_of("http:/a"), "http:/a") << "not the absolute form";
  EXPECT_EQ(path_of("/http://h/a"), "/http://h/a");
}

TEST(Endpoints, PercentDecodedModelIds) {
  EXPECT_EQ(percent_decoded("fort%75ne"), "fortune");
  EXPECT_EQ(percent_decoded("org%2Fmy%20model%3av1"), "org/my model:v1");
  EXPECT_EQ(percent_decoded("org/my%20model:v1"), "org/my model:v1");
  EXPECT_EQ(percent_decoded("100%"), "100%");
  EXPECT_EQ(percent_decoded("a%2"), "a%2");
  EXPECT_EQ(percent_decoded("%zz%41"), "%zzA");
}

}  // namespace
}  // namespace troupe
