#include "gpu/comm/rendezvous_store.h"

#include <sstream>

#include "gpu/comm/communicator.h"

namespace troupe {

std::string rendezvous_timeout_message(const std::vector<std::string>& missing,
                                       std::chrono::milliseconds timeout) {
  std::ostringstream os;
  os << "rendezvous: timed out after " << double(timeout.count()) / 1000 << " s waiting for key(s)";
  const char* sep = " ";
  for (const auto& k : missing) {
    os << sep << '\'' << k << '\'';
    sep = ", ";
  }
  return os.str();
}

void InMemoryRendezvousStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::vector<char> InMemoryRendezvousStore::get(const std::string& key,
                                               std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mu_);
  return values_.at(key);
}

void InMemoryRendezvousStore::wait(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout) {
  auto all_set = [&] {
    for (const auto& k : keys) {
      if (!values_.count(k)) return false;
    }
    return true;
  };
  std::unique_lock<std::mutex> lock(mu_);
  if (changed_.wait_for(lock, timeout, all_set)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!values_.count(k)) missing.push_back(k);
  }
  throw RendezvousTimeout(rendezvous_timeout_message(missing, timeout));
}

}  // namespace troupe
