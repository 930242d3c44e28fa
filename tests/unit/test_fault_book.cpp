// The fault book's states, the admin JSON and the admin endpoint's token
// check, without a runtime.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "faults/fault_book.h"
#include "faults/fault_json.h"
#include "net/admin_endpoint.h"
#include "net/endpoints.h"

namespace troupe {
namespace {

FaultOrder order(FaultKind kind, int replica = 0) {
  FaultOrder o;
  o.kind = kind;
  o.replica = replica;
  return o;
}

TEST(FaultBook, AKillIsConfirmedByItsReplicasDeathAndRecoveredWhenItServesAgain) {
  FaultBook b(5);
  const uint64_t id = b.add(order(FaultKind::Kill, 1), 0, 0, 0.0).id;
  EXPECT_EQ(b.get(id)->state, FaultState::Scheduled);
  b.started(id, 1.0);
  b.report({id, FaultOutcome::Applied, "the worker throws"}, 1.0);
  EXPECT_EQ(b.get(id)->state, FaultState::Active);
  b.replica_died(0, "other replica", 1.1);  // not its replica
  EXPECT_EQ(b.get(id)->state, FaultState::Active);
  b.replica_died(1, "gloo group: rank 1 timed out in recv", 1.15);  // not injected
  EXPECT_EQ(b.get(id)->state, FaultState::Active);
  b.replica_died(1, "injected fault", 1.2);
  const FaultEntry e = *b.get(id);
  EXPECT_EQ(e.state, FaultState::Confirmed);
  EXPECT_DOUBLE_EQ(e.detected, 1.2);
  b.replica_up(1, 2.0);
  EXPECT_DOUBLE_EQ(b.get(id)->recovered, 2.0);
  b.replica_up(1, 3.0);  // the first return counts
  EXPECT_DOUBLE_EQ(b.get(id)->recovered, 2.0);
}

// Kills queued for one replica: its one death is the first one's; the
// others never ran (they fail for want of an effect).
TEST(FaultBook, OneDeathConfirmsOneFault) {
  FaultBook b(5);
  const uint64_t first = b.add(order(FaultKind::Kill, 1), 0, 0, 0.0).id;
  const uint64_t second = b.add(order(FaultKind::Kill, 1), 0, 0, 0.0).id;
  b.started(second, 1.5);
  b.started(first, 1.0);
  b.replica_died(1, "injected fault: worker of replica 1 killed", 2.0);
  EXPECT_EQ(b.get(first)->state, FaultState::Confirmed);
  EXPECT_EQ(b.get(second)->state, FaultState::Active);
  b.replica_died(1, "injected fault: worker of replica 1 killed", 3.0);
  EXPECT_EQ(b.get(second)->state, FaultState::Confirmed);
  EXPECT_DOUBLE_EQ(b.get(second)->detected, 3.0);
}

TEST(FaultBook, UnconfirmedFaultsFail) {
  FaultBook b(5);
  const uint64_t kill = b.add(order(FaultKind::Kill), 0, 0, 0).id;
  const uint64_t slow = b.add(order(FaultKind::Slow), 0, 1, 0).id;
  const uint64_t refused = b.add(order(FaultKind::StepError), 0, 0, 0).id;
  for (uint64_t id : {kill, slow, refused}) b.started(id, 0);
  b.report({refused, FaultOutcome::Refused, "no device 7"}, 0.1);
  EXPECT_EQ(b.get(refused)->state, FaultState::Failed);
  EXPECT_EQ(b.get(refused)->error, "no device 7");
  b.expire(4.9);
  EXPECT_EQ(b.get(kill)->state, FaultState::Active);
  b.expire(5.1);
  EXPECT_EQ(b.get(kill)->state, FaultState::Failed);
  EXPECT_EQ(b.get(slow)->state, FaultState::Active);  // lasting: judged at its end
  b.ended(slow, 6);
  EXPECT_EQ(b.get(slow)->state, FaultState::Failed);
  // A confirmed lasting fault ends normally; a late report changes nothing.
  const uint64_t kv = b.add(order(FaultKind::KvAllocFail), 0, 1, 0).id;
  b.started(kv, 0);
  b.report({kv, FaultOutcome::Confirmed, "refused KV blocks"}, 0.5);
  b.ended(kv, 1);
  b.report({kv, FaultOutcome::Refused, "late"}, 1.5);
  EXPECT_EQ(b.get(kv)->state, FaultState::Ended);
  EXPECT_EQ(b.get(kv)->effect, "refused KV blocks");
}

// A one-shot fault given up on is handed back for withdrawal (once); the
// holder's word that it disarmed it is recorded, and only for a fault the
// book gave up on. A replica death before that word may be its late
// effect: recorded too, without undoing the failure.
TEST(FaultBook, AnExpiredFaultIsToBeWithdrawnAndItsWithdrawalOrLateEffectRecorded) {
  FaultBook b(5);
  const uint64_t step = b.add(order(FaultKind::StepError, 1), 0, 0, 0).id;
  const uint64_t kill = b.add(order(FaultKind::Kill, 0), 0, 0, 0).id;
  const uint64_t slow = b.add(order(FaultKind::Slow, 1), 0, 30, 0).id;
  for (uint64_t id : {step, kill, slow}) b.started(id, 0);
  // Not expired yet: a withdrawal report changes nothing.
  b.report({step, FaultOutcome::Withdrawn, "early"}, 1);
  EXPECT_LT(b.get(step)->withdrawn, 0);
  EXPECT_TRUE(b.expire(4).empty());
  const std::vector<FaultOrder> expired = b.expire(5.5);
  ASSERT_EQ(expired.size(), 2u);  // not the lasting one: its end ends it
  EXPECT_EQ(expired[0].id, step);
  EXPECT_EQ(expired[0].kind, FaultKind::StepError);
  EXPECT_EQ(expired[0].replica, 1);
  EXPECT_EQ(expired[1].id, kill);
  EXPECT_TRUE(b.expire(9).empty());  // handed back once
  FaultEntry e = *b.get(step);
  EXPECT_EQ(e.state, FaultState::Failed);
  EXPECT_TRUE(e.expired);
  EXPECT_EQ(e.error, "no effect seen within 5 s");
  b.report({step, FaultOutcome::Withdrawn, "replica 1: its next step will not fail"}, 6);
  b.report({step, FaultOutcome::Withdrawn, "again"}, 7);  // the first word counts
  e = *b.get(step);
  EXPECT_EQ(e.state, FaultState::Failed);
  EXPECT_DOUBLE_EQ(e.withdrawn, 6);
  EXPECT_EQ(e.error,
            "no effect seen within 5 s; withdrawn (replica 1: its next step will not fail)");
  // Withdrawn: a later death of its replica is not its doing.
  b.replica_died(1, "a node died", 8);
  EXPECT_LT(b.get(step)->died_late, 0);
  // Not yet withdrawn: its replica's death is recorded as a possible late
  // effect, once; the fault stays failed.
  b.replica_died(0, "injected fault: worker of replica 0 killed", 8.5);
  b.replica_died(0, "again", 9);
  e = *b.get(kill);
  EXPECT_EQ(e.state, FaultState::Failed);
  EXPECT_DOUBLE_EQ(e.died_late, 8.5);
  EXPECT_LT(e.detected, 0);
  EXPECT_NE(e.effect.find("died after the fault was given up"), std::string::npos) << e.effect;
  EXPECT_NE(e.effect.find("worker of replica 0 killed"), std::string::npos) << e.effect;
  // A fault that failed otherwise (refused) is never withdrawn.
  const uint64_t refused = b.add(order(FaultKind::StepError), 0, 0, 10).id;
  b.started(refused, 10);
  b.report({refused, FaultOutcome::Refused, "no device 7"}, 10);
  b.report({refused, FaultOutcome::Withdrawn, "?"}, 11);
  EXPECT_LT(b.get(refused)->withdrawn, 0);
  EXPECT_EQ(b.get(refused)->error, "no device 7");
  const nlohmann::json j = fault_entry_json(*b.get(step));
  EXPECT_DOUBLE_EQ(j.at("withdrawn_s").get<double>(), 6);
  EXPECT_FALSE(j.contains("died_late_s"));
  EXPECT_DOUBLE_EQ(fault_entry_json(*b.get(kill)).at("died_late_s").get<double>(), 8.5);
}

std::string refusal(const std::string& body, int replicas = 2) {
  auto r = parse_fault_request(body, replicas);
  if (auto* why = std::get_if<std::string>(&r)) return *why;
  return "accepted";
}

TEST(FaultJson, RequestsAreCheckedKeyByKey) {
  auto ok = parse_fault_request(
      R"({"kind": "kill", "role": "shard", "replica": 1, "device": 2, "at_s": 0.5})", 2);
  ASSERT_TRUE(std::holds_alternative<FaultRequest>(ok));
  const FaultRequest r = std::get<FaultRequest>(ok);
  EXPECT_EQ(r.order.kind, FaultKind::Kill);
  EXPECT_EQ(r.order.role, FaultRole::Shard);
  EXPECT_EQ(r.order.replica, 1);
  EXPECT_EQ(r.order.device, 2);
  EXPECT_DOUBLE_EQ(r.at_s, 0.5);
  EXPECT_EQ(refusal(R"({"kind": "slow", "factor": 3, "duration_s": 2})"), "accepted");
  EXPECT_NE(refusal("{").find("not JSON"), std::string::npos);
  EXPECT_NE(refusal("{}").find("kind: missing"), std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "explode"})").find("unknown 'explode'"), std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "role": "router"})").find("coordinator itself"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "replica": 2})").find("out of range [0, 1]"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "role": "shard"})").find("names which one"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "slow", "duration_s": 1})").find("factor: missing"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "slow", "factor": 1, "duration_s": 1})").find("above 1"),
            std::string::npos);
  // The worker sleeps (factor - 1) x each step: 1e300 would not be a duration.
  EXPECT_NE(refusal(R"({"kind": "slow", "factor": 1e300, "duration_s": 1})").find("above 1000"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kv_alloc_fail"})").find("duration_s: missing"), std::string::npos);
  // A device only where the fault acts on one: it was taken and ignored.
  EXPECT_NE(refusal(R"({"kind": "slow", "factor": 2, "duration_s": 1, "device": 1})")
                .find("device: a slow fault acts on the whole replica"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "role": "worker", "device": 0})")
                .find("device: a kill of a worker acts on the whole replica"),
            std::string::npos);
  EXPECT_EQ(refusal(R"({"kind": "step_error", "device": 1})"), "accepted");
  EXPECT_EQ(refusal(R"({"kind": "kill", "role": "member", "device": 0})"), "accepted");
  EXPECT_NE(refusal(R"({"kind": "kill", "duration_s": 1})").find("happens once"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "replica": "0"})").find("expected an integer"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "colour": 1})").find("unknown key 'colour'"),
            std::string::npos);
}

// A time past a week is refused by name; below, the timers' conversion
// saturates instead of overflowing (1e10 s was 0.4 ms once cast to int64
// nanoseconds).
TEST(FaultJson, TimesAreBoundedAndTheirConversionIsSafe) {
  const std::string week = std::to_string(int64_t(kMaxFaultSeconds));
  EXPECT_EQ(refusal(R"({"kind": "slow", "factor": 2, "duration_s": )" + week + "}"), "accepted");
  EXPECT_EQ(refusal(R"({"kind": "kill", "at_s": )" + week + "}"), "accepted");
  for (const std::string body :
       {R"({"kind": "slow", "replica": 0, "factor": 2, "duration_s": 1e10})",
        R"({"kind": "kv_alloc_fail", "duration_s": 604801})"}) {
    const std::string why = refusal(body);
    EXPECT_EQ(why.rfind("duration_s: ", 0), 0u) << why;
    EXPECT_NE(why.find("is above 604800"), std::string::npos) << why;
  }
  const std::string why = refusal(R"({"kind": "step_error", "at_s": 1e10})");
  EXPECT_EQ(why.rfind("at_s: ", 0), 0u) << why;
  EXPECT_NE(why.find("a week"), std::string::npos) << why;

  using std::chrono::nanoseconds;
  EXPECT_EQ(fault_delay(1.5), nanoseconds(1500000000));
  EXPECT_EQ(fault_delay(0), nanoseconds(0));
  EXPECT_EQ(fault_delay(-3), nanoseconds(0));
  EXPECT_EQ(fault_delay(std::nan("")), nanoseconds(0));
  const nanoseconds most = fault_delay(kMaxFaultSeconds);
  EXPECT_EQ(most, std::chrono::seconds(int64_t(kMaxFaultSeconds)));
  for (double big : {1e10, 1e300, std::numeric_limits<double>::infinity()})
    EXPECT_EQ(fault_delay(big), most) << big;
}

// A device a replica does not have is refused at once, naming the key,
// not failed later where the fault lands.
TEST(FaultJson, DevicesBeyondTheReplicasAreRefusedUpFront) {
  const auto refusal = [](std::string_view body, int devices) {
    auto r = parse_fault_request(body, 2, devices);
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : std::string();
  };
  EXPECT_NE(refusal(R"({"kind": "step_error", "device": 3})", 2).find("device: a replica has 2"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "role": "shard", "device": 2})", 2).find("no device 2"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"kind": "kill", "role": "shard", "device": 0})", 1).find("worker"),
            std::string::npos);
  EXPECT_EQ(refusal(R"({"kind": "kill", "role": "shard", "device": 1})", 2), "");
  EXPECT_EQ(refusal(R"({"kind": "step_error", "device": 0})", 1), "");
  EXPECT_EQ(refusal(R"({"kind": "step_error", "device": 9})", 0), "") << "not known: not checked";
}

class FakeAdmin : public FaultAdmin {
 public:
  std::variant<FaultEntry, std::string> inject_json(std::string_view body) override {
    auto r = parse_fault_request(body, 1);
    if (auto* why = std::get_if<std::string>(&r)) return *why;
    const FaultRequest& f = std::get<FaultRequest>(r);
    const FaultOrder o = book.add(f.order, f.at_s, f.duration_s, 0);
    return *book.get(o.id);
  }
  std::vector<FaultEntry> faults() const override { return book.list(); }
  std::vector<FaultBook::Resume> resumes() const override { return book.resumes(); }
  double now() const override { return book.now(); }
  FaultBook book;
};

TEST(AdminEndpoint, OnlyTheTokenOpensIt) {
  FakeAdmin admin;
  const std::string body = R"({"kind": "kill"})";
  Response r = answer_faults(admin, "s3cret", "POST", "", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.body.find("Authorization: Bearer"), std::string::npos) << r.body;
  EXPECT_EQ(answer_faults(admin, "s3cret", "POST", "Bearer s3crex", body).status, 401);
  EXPECT_EQ(answer_faults(admin, "s3cret", "POST", "Bearer s3cret2", body).status, 401);
  EXPECT_EQ(answer_faults(admin, "s3cret", "POST", "Basic s3cret", body).status, 401);
  EXPECT_EQ(answer_faults(admin, "", "POST", "Bearer ", body).status, 401);  // no token: closed
  EXPECT_TRUE(admin.book.list().empty());
  r = answer_faults(admin, "s3cret", "POST", "Bearer s3cret", body);
  EXPECT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body).at("state"), "scheduled");
  r = answer_faults(admin, "s3cret", "POST", "Bearer s3cret", R"({"kind": "nope"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown 'nope'"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"]["param"], "kind") << r.body;
  r = answer_faults(admin, "s3cret", "POST", "Bearer s3cret", R"({"kind": "kill", "when": 1})");
  EXPECT_EQ(nlohmann::json::parse(r.body)["error"]["param"], "when") << r.body;
  // HEAD is a GET, whatever body comes with it: it never injects.
  r = answer_faults(admin, "s3cret", "HEAD", "Bearer s3cret", R"({"kind": "kill"})");
  EXPECT_EQ(r.status, 200);
  r = answer_faults(admin, "s3cret", "GET", "Bearer s3cret", "");
  EXPECT_EQ(r.status, 200);
  const auto list = nlohmann::json::parse(r.body).at("faults");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].at("kind"), "kill");
  EXPECT_EQ(list[0].at("role"), "worker");
}

TEST(AdminEndpoint, AbsentUnlessTurnedOn) {
  auto off = route("GET", "/admin/faults");
  ASSERT_TRUE(std::holds_alternative<Response>(off));
  EXPECT_EQ(std::get<Response>(off).status, 404);
  EXPECT_NE(std::get<Response>(off).body.find("fault injection is off"), std::string::npos);
  EXPECT_EQ(std::get<Response>(route("PUT", "/admin/faults")).status, 404);
  EXPECT_EQ(std::get<Response>(route("GET", "/admin/nope")).body.find("fault injection"),
            std::string::npos);
  EXPECT_EQ(std::get<Endpoint>(route("POST", "/admin/faults", true)), Endpoint::Faults);
  EXPECT_EQ(std::get<Response>(route("PUT", "/admin/faults", true)).status, 405);
}

}  // namespace
}  // namespace troupe
