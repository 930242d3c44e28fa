#pragma once
// The serving actors' protocols as types: each actor's handle is a CAF typed
// actor, so the messages it takes (and what it answers) are checked by the
// compiler at every send. Messages between processes are the types of
// actors/wire.h (serialized by CAF); the HTTP seam's types (a request and
// its sink) never leave the coordinator.
//
// Supervision tree (see docs/ARCHITECTURE.md):
//   supervisor --places on--> node (one per process with devices)
//   supervisor --monitors--> batcher (one per replica, on its node)
//   batcher --links--> worker (detached: runs the engine)
//   worker --links--> shard (detached, one per device of a parallel layout)
// The router hears from the supervisor of every replica that goes down, and
// from each batcher when it comes up.
#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/wire.h"
#include "scheduler/cluster.h"
#include "scheduler/replica_messages.h"
#include "service/completion_service.h"
#include "service/step_item.h"

namespace troupe {

using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using events_atom = caf::atom_constant<caf::atom("events")>;
using up_atom = caf::atom_constant<caf::atom("up")>;
using down_atom = caf::atom_constant<caf::atom("down")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using fault_atom = caf::atom_constant<caf::atom("fault")>;
using fend_atom = caf::atom_constant<caf::atom("fend")>;
using ftick_atom = caf::atom_constant<caf::atom("ftick")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using stepdone_atom = caf::atom_constant<caf::atom("stepdone")>;
using rtick_atom = caf::atom_constant<caf::atom("rtick")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using stick_atom = caf::atom_constant<caf::atom("stick")>;
using ntick_atom = caf::atom_constant<caf::atom("ntick")>;
using part_atom = caf::atom_constant<caf::atom("part")>;
using build_atom = caf::atom_constant<caf::atom("build")>;
using rdvset_atom = caf::atom_constant<caf::atom("rdvset")>;
using rdvget_atom = caf::atom_constant<caf::atom("rdvget")>;
using sync_atom = caf::atom_constant<caf::atom("sync")>;
using broken_atom = caf::atom_constant<caf::atom("broken")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using placed_atom = caf::atom_constant<caf::atom("placed")>;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;

// The coordinator's fault injector: (fault, id) starts a fault the admin
// endpoint recorded, (fault, report) is what the actor that applied one
// says back, (fend, id) ends a lasting one, (ftick) fails the faults whose
// effect never came.
using FaultInjectorActor =
    caf::typed_actor<caf::reacts_to<fault_atom, uint64_t>, caf::reacts_to<fault_atom, FaultReport>,
                     caf::reacts_to<fend_atom, uint64_t>, caf::reacts_to<ftick_atom>>;

// A device of a parallel layout: (run) takes its next queued job; (crash,
// fault id, true, reporter) arms it to die at its next step, mid-step for
// the rest of its group; (crash, fault id, false, reporter) withdraws that
// fault if it is still armed, and says so to the reporter.
using ShardActor = caf::typed_actor<caf::reacts_to<run_atom>,
                                    caf::reacts_to<crash_atom, uint64_t, bool, FaultInjectorActor>>;

// What a step gives its batcher: one sampled id per item (-1 where it does
// not sample), and the log-probabilities and prompt log-probabilities the
// items asked for (each empty when none did, else one per item). The worker
// and its batcher share a process.
struct StepOutput {
  std::vector<int> ids;
  std::vector<std::optional<TokenLogprobs>> logprobs;
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs;  // empty, or one list per item
};

// A replica's engine on its own thread. (step, items) -> what it sampled; (stepdone, ticket) is its
// own note that a launched step is over; (release, seq) drops a sequence's sampler; (fault, order,
// injector) applies an injected fault aimed at it, its shards or its remote parts.
using WorkerActor =
    caf::typed_actor<caf::replies_to<step_atom, std::vector<StepItem>>::with<StepOutput>,
                     caf::reacts_to<stepdone_atom, uint64_t>,
                     caf::reacts_to<release_atom, uint64_t>,
                     caf::reacts_to<fault_atom, FaultOrder, FaultInjectorActor>>;

// A part of a replica that spans nodes, on a node other than its leader's:
// (build) makes its engine (meeting the other parts through the
// coordinator's rendezvous), (step, items, microbatches, number) runs the
// leader's worker's step `number` (from 1, each once, in order), cut alike,
// and (stepdone, ticket) is its own note that a step is over; (crash,
// stage, rank, fault id, arm, reporter) passes a fault on to its shard of
// that device (as ShardActor's crash). It is linked to the leader's worker:
// either dying takes the other down, and supervision rebuilds the whole
// replica.
using MemberActor =
    caf::typed_actor<caf::reacts_to<build_atom>,
                     caf::reacts_to<step_atom, std::vector<StepItem>, int, uint64_t>,
                     caf::reacts_to<stepdone_atom, uint64_t>,
                     caf::reacts_to<crash_atom, int, int, uint64_t, bool, FaultInjectorActor>>;

// Where a replica's devices are, for a fault aimed at one of them: device d
// (stage-major: stage d / tensor, rank d % tensor) belongs to part hosts[d],
// or to this node's when `hosts` is empty; `members` are its parts on other
// nodes, every part but the leader's, in order.
struct ReplicaParts {
  int tensor = 1;
  std::vector<int> hosts;
  int leader = 0;
  std::vector<MemberActor> members;
};

// Members are a replica's parts but its leader's, in order: member m is
// part_of_member(m, leader), and back.
inline int part_of_member(int member, int leader) {
  return member < leader ? member : member + 1;
}
inline int member_of_part(int part, int leader) {
  return part < leader ? part : part - 1;
}

// A replica's continuous batcher: requests placed on it and cancelled
// there (id, then the channel's sequence number), the router's probe (sync,
// seq), answered at once with its load; an injected fault is applied here (a
// batcher's kill, refused KV blocks) or passed to its worker.
using BatcherActor = caf::typed_actor<caf::reacts_to<assign_atom, Assignment>,
                                      caf::reacts_to<cancel_atom, uint64_t, uint64_t>,
                                      caf::reacts_to<sync_atom, uint64_t>,
                                      caf::reacts_to<fault_atom, FaultOrder, FaultInjectorActor>>;

// The router: requests from the front end, step events from the batchers,
// replicas up (a batcher, after its probe step; answered true when that
// placement is the replica's current one, since a batcher on another node
// asks until answered) and down (the supervisor), each for one placement
// epoch, and its own deadline tick. (watch,
// supervisor) names whom it tells about a replica whose channel broke (the
// supervisor's handle, untyped here since its type names the router's).
using RouterActor = caf::typed_actor<
    caf::reacts_to<submit_atom, CompletionRequest, std::shared_ptr<CompletionSink>>,
    caf::reacts_to<cancel_atom, uint64_t>, caf::reacts_to<events_atom, StepEvents>,
    caf::replies_to<up_atom, int, uint64_t, BatcherActor>::with<bool>,
    caf::reacts_to<down_atom, int, uint64_t, bool>, caf::reacts_to<rtick_atom>,
    caf::reacts_to<watch_atom, caf::actor>>;

// A process with devices: starts the replicas the supervisor places on it
// (answering with the replica's batcher) and stops those whose placement
// ended; (join) from the coordinator says it is no longer a member (it was
// declared dead): stop everything and join again; (ntick) paces its
// heartbeats and, after losing the coordinator, its attempts to join again.
// (placed, replica, epoch) answers with the batcher of that placement if it
// runs here (an error if not): the supervisor asks when a start's answer is
// late, since a start or its answer may have been lost on the way.
// (alive) answers with the incarnation it holds: the supervisor asks when
// another process joins under this node's name (a restart, or a mistake).
using NodeActor = caf::typed_actor<caf::replies_to<start_atom, ReplicaPlan, RouterActor,
                                                   std::vector<MemberActor>>::with<BatcherActor>,
                                   caf::replies_to<placed_atom, int, uint64_t>::with<BatcherActor>,
                                   caf::replies_to<part_atom, ReplicaPlan>::with<MemberActor>,
                                   caf::reacts_to<stop_atom, int, uint64_t>,
                                   caf::reacts_to<join_atom>, caf::reacts_to<ntick_atom, uint64_t>,
                                   caf::replies_to<alive_atom>::with<uint64_t>>;

// What a node sees of the coordinator: it joins, it beats (answered: whether
// its membership is current), and the parts of a replica spanning nodes
// meet through its rendezvous store (set a key; get one, empty while it is
// not set). Values travel as std::string, not
// std::vector<char>: CAF 0.17's binary_deserializer resizes a byte vector to
// the length the message claims before it checks that many bytes are there
// (5 bytes claiming 1 GiB allocate 1 GiB), while a string's length is
// checked against the input first.
using CoordinatorActor =
    caf::typed_actor<caf::replies_to<join_atom, JoinRequest, NodeActor>::with<JoinReply>,
                     caf::replies_to<beat_atom, int, uint64_t>::with<bool>,
                     caf::replies_to<leave_atom, int, uint64_t>::with<bool>,
                     caf::replies_to<rdvset_atom, std::string, std::string>::with<bool>,
                     caf::replies_to<rdvget_atom, std::string>::with<std::string>>;

// The supervisor: the coordinator's membership and placement, the replicas'
// restarts, injected faults passed to the replica they aim at, and the
// router's word that a replica's channel broke (broken, replica, epoch, why).
using SupervisorActor =
    CoordinatorActor::extend<caf::reacts_to<stick_atom>,
                             caf::reacts_to<fault_atom, FaultOrder, FaultInjectorActor>,
                             caf::reacts_to<broken_atom, int, uint64_t, std::string>>;

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::CompletionRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::StepOutput)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::CompletionSink>)
