// Mixture of experts for the sizing calculator (sizing.h): every M-th layer's MLP becomes E expert
// MLPs behind a router that sends each token to its top-k; expert parallelism keeps E/ep experts per
// rank and moves tokens to them and back with all-to-alls. One function per fact; sizing.cpp puts them
// in its lines. Sources: docs/course_sources.md §6h (GShard, Lepikhin et al. 2020; Switch
// Transformer, Fedus et al. 2021; Megatron-core's expert groups).
#pragma once
#include <cstdint>

namespace dtlab {

struct MoeConfig {
  int experts = 0;               // E per MoE layer; 0: a dense model
  int top_k = 2;                 // k experts per token (GShard's top-2; Switch's 1)
  int ep = 1;                    // expert-parallel degree, E/ep experts per rank
  double capacity_factor = 1.0;  // F: each expert takes at most F·k·T/E of T tokens (Switch, GShard)
  int moe_every = 1;             // M: every M-th layer is an MoE layer (GShard: every other, M = 2)
};

// The model's parameters. Ψ given is the dense model's (one MLP of 8·h² per layer, h -> 4h -> h); an
// MoE layer holds E such MLPs and a router of h·E. non_expert: everything else plus the routers,
// replicated over the EP group; expert: every expert of every MoE layer.
struct MoeParams {
  int moe_layers = 0;          // L / M
  double mlp = 0;              // 8·h²: one expert
  double non_expert = 0;       // Ψ - (L/M)·8h² + (L/M)·h·E
  double expert = 0;           // (L/M)·E·8h²
  double total = 0;            // non_expert + expert
  double active = 0;           // what one token goes through: non_expert + (L/M)·k·8h²
};

// dtlab::Error (one sentence naming the flag) for a configuration that describes no MoE: E not
// divisible by ep, top-k above E, a capacity factor not above 0, M not dividing each stage's layers, Ψ
// smaller than the MLPs it should hold, --ep without --experts.
void check_moe(const MoeConfig& m, double params, int layers, int64_t hidden, int pp);
MoeParams moe_params(const MoeConfig& m, double params, int layers, int64_t hidden);

// Bytes one rank sends along its EP group per MoE layer and micro-batch: dispatch and combine in
// forward, their gradients in backward, 4 all-to-alls, each of a buffer padded to capacity,
// F·T·k·h·e (e bytes per element), of which (ep-1)/ep leaves the rank. T = the rank's tokens. With recompute the forward's two
// run again (6).
double moe_layer_alltoall_bytes(const MoeConfig& m, double tokens, int64_t hidden, int element_bytes, bool recompute);

}  // namespace dtlab
