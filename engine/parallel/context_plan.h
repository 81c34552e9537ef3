// Context parallelism for the sizing calculator (sizing.h): the sequence split over the c ranks of a
// CP group, what one rank sends per layer to let every query see every key, and how evenly causal
// attention's work falls on the ranks. One function per fact; sizing.cpp puts them in its lines.
// Sources: docs/course_sources.md §6h (Liu et al. 2023, Ring Attention; Jacobs et al. 2023,
// DeepSpeed-Ulysses; Megatron-core and TransformerEngine's context parallelism).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/gpt_spec.h"

namespace dtlab {

// CpLayout (ring, zigzag, ulysses) is the engine's: engine/core/gpt_spec.h.

struct CpShape {
  int cp = 1;
  CpLayout layout = CpLayout::Ring;
  int64_t seq = 0, micro_batch = 0, hidden = 0;  // s, b, h
  int heads = 0, kv_heads = 0;                   // a, and a_kv (grouped-query attention; = a without it)
  int tp = 1;                                    // each TP rank holds a/t heads
  int element_bytes = 2;                         // e: bytes per activation element
  bool recompute = false;                        // full recomputation runs the forward, and its traffic, again
};

// dtlab::Error (one sentence naming the flag) when the layout cannot split this shape: the sequence
// not divisible by c (by 2c for zigzag), Ulysses' heads not divisible by t·c.
void check_context_parallel(const CpShape& s);

// Bytes one rank sends along its CP group per transformer layer and micro-batch (it receives as many).
// Ring and zigzag: its K and V blocks, 2·b·(s/c)·h_kv/t·e, sent c-1 times in forward; in backward the
// K/V blocks go round again (the forward kept none of the others') and each block's dK/dV one step
// behind it, c-1 sends each: twice the forward (what the engine's --cp sends, GptCore). Ulysses: q, k,
// v to the head split and the output back in forward (DeepSpeed's 4 all-to-alls; the engine's 2, q, k
// and v in one), each sending (c-1)/c of the rank's b·(s/c)·width/t elements, the same in backward.
// Recomputation adds one forward.
struct CpTraffic {
  double forward = 0, backward = 0, recompute = 0;
  double per_layer() const { return forward + backward + recompute; }
  std::string what;     // "K/V blocks around the ring: c-1 sends forward, K/V and dK/dV c-1 each backward"
  std::string formula;  // "3 · 2(c-1) · b·(s/c)·h_kv/t · e", with "(L/p)·m ·" put in front by the caller
};
CpTraffic cp_layer_traffic(const CpShape& s);

// The busiest rank's causal attention work over the mean. Contiguous ring: rank r's queries see r+1
// blocks (the last rank c, the first 1), so c / ((c+1)/2) = 2c/(c+1). Zigzag: ranks r and 2c-1-r's
// chunks pair up to 2c+1 chunk pairs each, balanced (1). Ulysses: every rank has the whole sequence for
// its heads (1). 1 without context parallelism.
double cp_causal_imbalance(CpLayout layout, int cp);

}  // namespace dtlab
