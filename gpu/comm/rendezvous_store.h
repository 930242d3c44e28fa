#pragma once
// Where the ranks of a group find each other before they connect: each rank
// publishes its transport address under a key and reads its peers'. The
// cross-process communicator (GlooCommunicator) rendezvous through this
// interface only; a coordinator actor will serve it over CAF messages, and
// InMemoryRendezvousStore serves ranks that are threads of one process.
//
// Keys are never deleted: a group that is rebuilt after a failure uses a new
// key prefix, so it cannot read the addresses of the group it replaces.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/comm/communicator.h"

namespace troupe {

// What a store throws when its timeout passes: ranks that did not join. Any
// other failure (the store itself unreachable) is a plain CommError, and
// says so.
class RendezvousTimeout : public CommError {
 public:
  using CommError::CommError;
};

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Publishes value under key; a later set of the same key replaces it.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // The value under key, waiting up to `timeout` for a rank to set it.
  // Throws RendezvousTimeout naming the key when the timeout passes.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Returns once every key is set. Throws RendezvousTimeout naming the keys
  // still missing when the timeout passes.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// A store in this process's memory, for ranks that are threads of one
// process (tests, benchmarks). Thread-safe.
class InMemoryRendezvousStore final : public RendezvousStore {
 public:
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
};

// The message of a store that timed out: "rendezvous: timed out after 1.5 s
// waiting for key(s) 'g/1', 'g/2'". Shared so that every store says it alike.
std::string rendezvous_timeout_message(const std::vector<std::string>& missing,
                                       std::chrono::milliseconds timeout);

}  // namespace troupe
