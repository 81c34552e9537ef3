// The ring's chunk order and chunk bounds, written once. NCCL's order (docs/course_sources.md §6):
// at reduce-scatter step s the rank at ring position r receives chunk (r-2-s) mod n from its
// predecessor and reduces it into its own; after n-1 steps chunk r is final on rank r; at
// all-gather step s it receives chunk (r-1-s) mod n. The step plans (plan.cpp, and through them
// the socket backend and the views), the threads ring algorithms and the process groups' ring
// collectives all read it here; tests/test_plan.cpp checks the plans and the recorded RingStep
// events of both against it, so none can drift from the others.
#pragma once
#include <cstdint>

#include "engine/core/arith.h"  // ring_mod

namespace dtlab {

// Data flows one way round the ring: a rank receives from its predecessor, sends to its successor.
constexpr int ring_pred(int r, int n) { return ring_mod(r - 1, n); }
constexpr int ring_succ(int r, int n) { return ring_mod(r + 1, n); }

// Reduce-scatter step s in [0, n-1): the chunk rank r receives (and reduces into its own), and the
// running partial it sends, which is the chunk its successor receives.
constexpr int ring_rs_recv_chunk(int r, int s, int n) { return ring_mod(r - 2 - s, n); }
constexpr int ring_rs_send_chunk(int r, int s, int n) { return ring_rs_recv_chunk(ring_succ(r, n), s, n); }
// All-gather step s in [0, n-1): the final chunk rank r receives (and copies), and the one it
// forwards (its own at step 0, then the one it received the step before).
constexpr int ring_ag_recv_chunk(int r, int s, int n) { return ring_mod(r - 1 - s, n); }
constexpr int ring_ag_send_chunk(int r, int s, int n) { return ring_ag_recv_chunk(ring_succ(r, n), s, n); }
// A ring all-reduce is a reduce-scatter then an all-gather: the chunk rank r receives at step s in
// [0, 2(n-1)).
constexpr int ring_allreduce_recv_chunk(int r, int s, int n) {
  return s < n - 1 ? ring_rs_recv_chunk(r, s, n) : ring_ag_recv_chunk(r, s - (n - 1), n);
}

static_assert(ring_rs_recv_chunk(3, 5 - 2, 5) == 3 && ring_rs_recv_chunk(0, 0, 2) == 0,
              "the last reduce-scatter step must leave chunk r final on rank r");
static_assert(ring_ag_send_chunk(3, 0, 5) == 3, "the all-gather must start from the chunk the rank finished");

// Two chunk bounds, each where it belongs:
//
// Even chunks (chunk_begin): chunk c of a `count`-element buffer cut in n is [count c / n,
// count (c+1) / n), sizes differing by at most one element and empty when count < n. The
// backends' ring all-reduce (threads, socket), the step plans' transfer_elements and so the views
// use it: the buffer is reduced in place, as NCCL does, with nothing padded or copied.
constexpr int64_t chunk_begin(int64_t count, int n, int c) { return count * c / n; }

// Padded chunks (padded_chunk): n equal chunks of ceil(count / n), the last ones ending in zero
// padding. The process groups' all-reduce uses it because it is built from their reduce-scatter
// and all-gather, whose API moves n blocks of one length; FSDP's flat-parameter shard is the same
// block (torch pads the flat parameter so every rank's shard has one length).
constexpr int64_t padded_chunk(int64_t count, int n) { return (count + n - 1) / n; }

}  // namespace dtlab
