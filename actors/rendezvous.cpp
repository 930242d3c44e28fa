#include "actors/rendezvous.h"

#include <thread>

#include "gpu/comm/communicator.h"

namespace troupe {

namespace {
// A key not set yet is asked for again this often.
constexpr auto kPoll = std::chrono::milliseconds(10);
// One request's bound: CAF's remote requests fail only by their timeout.
constexpr auto kRequest = std::chrono::seconds(5);
}  // namespace

CoordinatorRendezvous::CoordinatorRendezvous(caf::actor_system& system,
                                             CoordinatorActor coordinator)
    : system_(system), coordinator_(std::move(coordinator)) {}

void CoordinatorRendezvous::set(const std::string& key, const std::vector<char>& value) {
  caf::scoped_actor self{system_};
  std::string error;
  self->request(coordinator_, kRequest, rdvset_atom::value, key,
                std::string(value.begin(), value.end()))
      .receive([](bool) {}, [&](caf::error& e) { error = system_.render(e); });
  if (!error.empty())
    throw CommError("rendezvous: the coordinator did not take key '" + key + "': " + error);
}

std::vector<char> CoordinatorRendezvous::get(const std::string& key,
                                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  caf::scoped_actor self{system_};
  for (;;) {
    std::vector<char> value;
    std::string error;
    self->request(coordinator_, kRequest, rdvget_atom::value, key)
        .receive([&](const std::string& v) { value.assign(v.begin(), v.end()); },
                 [&](caf::error& e) { error = system_.render(e); });
    if (!error.empty())
      throw CommError("rendezvous: the coordinator did not answer for key '" + key + "': " + error);
    if (!value.empty()) return value;
    if (std::chrono::steady_clock::now() >= deadline)
      throw RendezvousTimeout(rendezvous_timeout_message({key}, timeout));
    std::this_thread::sleep_for(kPoll);
  }
}

void CoordinatorRendezvous::wait(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& k : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      get(k, std::max(left, std::chrono::milliseconds(0)));
    } catch (const RendezvousTimeout&) {
      std::vector<std::string> missing(std::find(keys.begin(), keys.end(), k), keys.end());
      throw RendezvousTimeout(rendezvous_timeout_message(missing, timeout));
    }
  }
}

}  // namespace troupe
