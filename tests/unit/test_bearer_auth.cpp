// Bearer secrets (the API key, the admin token): what passes and the 401s.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/bearer_auth.h"

namespace troupe {
namespace {

const BearerRefusal kRefusal{"send one", "wrong one", "invalid_api_key"};

TEST(BearerAuth, OnlyTheExactSecretPasses) {
  EXPECT_FALSE(refuse_bearer("Bearer s3cret", "s3cret", kRefusal));
  EXPECT_FALSE(refuse_bearer("bearer s3cret", "s3cret", kRefusal)) << "the scheme in any case";
  EXPECT_FALSE(refuse_bearer("BEARER s3cret", "s3cret", kRefusal));
  for (const char* wrong : {"Bearer s3cre", "Bearer s3cret ", "Bearer S3cret", "Bearer  s3cret",
                            "Bearer s3cret2", "Bearer "})
    EXPECT_TRUE(refuse_bearer(wrong, "s3cret", kRefusal)) << wrong;
  EXPECT_TRUE(refuse_bearer("Bearer ", "", kRefusal)) << "an empty secret matches nothing";
}

TEST(BearerAuth, RefusalsAre401SayingWhich) {
  const auto missing = refuse_bearer("", "s3cret", kRefusal);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  const auto j = nlohmann::json::parse(missing->body);
  EXPECT_EQ(j["error"]["message"], "send one");
  EXPECT_EQ(j["error"]["type"], "authentication_error");
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  ASSERT_EQ(missing->headers.size(), 1u);
  EXPECT_EQ(missing->headers[0],
            (std::pair<std::string, std::string>{"WWW-Authenticate", "Bearer"}));
  EXPECT_EQ(nlohmann::json::parse(
                refuse_bearer("Basic czNjcmV0", "s3cret", kRefusal)->body)["error"]["message"],
            "send one")
      << "another scheme sends no bearer secret";
  EXPECT_EQ(nlohmann::json::parse(
                refuse_bearer("Bearer x", "s3cret", kRefusal)->body)["error"]["message"],
            "wrong one");
}

}  // namespace
}  // namespace troupe
