#include "chaos/client.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "net/sse_parser.h"

namespace troupe::chaos {

namespace {

using json = nlohmann::json;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A completion object (a whole response or one chunk): its token ids and
// finish reason.
void read_choice(const json& j, RequestRecord& rec, double at, bool per_token_time) {
  const json& choices = j.at("choices");
  if (!choices.is_array() || choices.empty()) return;
  const json& c = choices[0];
  if (auto it = c.find("token_ids"); it != c.end() && it->is_array())
    for (const auto& id : *it) {
      rec.tokens.push_back(id.get<int>());
      if (per_token_time) rec.token_times.push_back(at);
    }
  if (auto it = c.find("finish_reason"); it != c.end() && it->is_string())
    rec.finish_reason = it->get<std::string>();
}

std::string error_message(const json& j) {
  if (auto it = j.find("error"); it != j.end() && it->is_object())
    return it->value("message", it->dump());
  return j.dump();
}

}  // namespace

RequestRecord run_request(HttpClient& client, const std::string& body, const RequestSpec& spec,
                          const ClientFaults& faults, double deadline_s, Clock::time_point t0) {
  RequestRecord rec;
  rec.index = spec.index;
  rec.stream = spec.stream;
  rec.cancel_after = spec.cancel_after;
  rec.injected_disconnect = faults.disconnect;
  rec.injected_slow = faults.slow_bytes_per_s > 0;
  rec.sent_s = since(t0);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s));
  HttpRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = body;

  bool stopped_by_us = false;
  bool saw_done = false;
  std::string raw;  // a non-200 answer's body
  HttpResponse resp;
  if (spec.stream) {
    SseParser sse;
    resp = client.request(
        req,
        [&](const HttpResponse& head, std::string_view piece) {
          if (head.status != 200) {
            raw.append(piece);
            return true;
          }
          const double at = since(t0);
          sse.feed(piece, [&](const std::string& data) {
            if (data == "[DONE]") {
              saw_done = true;
              return;
            }
            const json j = json::parse(data, nullptr, false);
            if (j.is_discarded()) {
              rec.error = "a stream event that is not JSON: " + data.substr(0, 80);
              return;
            }
            if (j.contains("error")) {
              rec.error = error_message(j);
              return;
            }
            read_choice(j, rec, at, true);
          });
          if (faults.slow_bytes_per_s > 0)
            std::this_thread::sleep_for(
                std::chrono::duration<double>(double(piece.size()) / faults.slow_bytes_per_s));
          const int n = int(rec.tokens.size());
          if ((spec.cancel_after >= 0 && n >= spec.cancel_after && n > 0) ||
              (faults.disconnect && n >= 1)) {
            stopped_by_us = true;
            return false;
          }
          return true;
        },
        deadline);
  } else {
    resp = client.request(req, deadline);
  }
  rec.end_s = since(t0);
  rec.status = resp.status;
  switch (resp.error.kind) {
    case HttpFailure::None:
      rec.transport = Transport::Complete;
      if (!spec.stream) {
        const json j = json::parse(resp.body, nullptr, false);
        if (j.is_discarded()) {
          rec.error = "a body that is not JSON: " + resp.body.substr(0, 80);
        } else if (resp.status == 200) {
          read_choice(j, rec, rec.end_s, true);
        } else {
          rec.error = error_message(j);
        }
      } else if (resp.status != 200) {
        const json j = json::parse(raw, nullptr, false);
        rec.error = j.is_discarded() ? raw.substr(0, 200) : error_message(j);
      } else if (!rec.error.empty() || !saw_done) {
        // An error event after the 200 (or no [DONE]): a failure the client
        // sees in the stream, not in the status.
        rec.status = 599;
        if (rec.error.empty()) rec.error = "the stream ended without data: [DONE]";
      }
      break;
    case HttpFailure::Stopped:
      rec.transport = stopped_by_us ? Transport::CancelledByUs : Transport::Broken;
      break;
    case HttpFailure::Timeout:
      rec.transport = resp.status == 0 ? Transport::NoResponse : Transport::Stalled;
      rec.error = "no complete answer within " + std::to_string(int(deadline_s)) + " s";
      break;
    case HttpFailure::Connect:
      rec.transport = Transport::NoResponse;
      rec.error = "cannot connect: " + resp.error.message;
      break;
    case HttpFailure::Io:
      rec.transport = resp.status == 0 ? Transport::NoResponse : Transport::Broken;
      rec.error = resp.error.message;
      break;
  }
  if (!rec.token_times.empty()) rec.first_token_s = rec.token_times.front();
  if (rec.transport != Transport::Complete || !resp.keep_alive) client.close();
  return rec;
}

}  // namespace troupe::chaos
