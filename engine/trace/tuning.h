// The selection: a tuning model in the spirit of NCCL's (src/graph/tuning.cc; docs/course_sources.md
// §6b) that predicts, for one collective of S bytes on a hardware profile and world, the time of every
// (algorithm, protocol) pair as latency + S / algbw, and picks the fastest. The communicator asks it
// when a run says --algo auto (per call, from the call's bytes); the CLI's sweep, the lab's busbw plot
// and the inspector's "why" print what it predicts. It reads only the profile: no step is run.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/collective.h"
#include "engine/trace/cost_model.h"

namespace dtlab {

// One (algorithm, protocol) pair's predicted cost for one call.
struct Prediction {
  Algorithm algo = Algorithm::Ring;
  Protocol proto = Protocol::Simple;
  double seconds = 0;    // latency_s + bytes / peak_algbw
  double latency_s = 0;  // base latency + per-hop latencies, counted per step as NCCL does
  double algbw = 0;      // bytes / seconds (what nccl-tests would print), bytes per second
  double busbw = 0;      // algbw x the op's bus bandwidth factor (collective.h)
  double peak_busbw = 0; // the busbw large messages approach: the bottleneck link x protocol x algorithm
  bool available = true; // the tuner considers it without being forced (NCCL's default enablement)
  std::string why_not;   // when not available: one sentence saying why
};

// Every (algorithm, protocol) pair the op runs (collective.h's table; ops with one fixed schedule
// give none), in kAlgorithms x kProtocols order, each with its prediction for `bytes` (the payload S).
std::vector<Prediction> predict_all(const HardwareProfile& profile, int world, CollectiveOp op, double bytes);
// One pair's prediction (also for pairs the tuner would not choose: `available` says so).
Prediction predict(const HardwareProfile& profile, int world, CollectiveOp op, Algorithm algo, Protocol proto,
                   double bytes);
// The fastest available pair; a forced algorithm or protocol (not Default, as NCCL_ALGO / NCCL_PROTO)
// restricts the candidates to it, and a forced pair runs even where the tuner would not enable it
// (LL128 on PCIe). For an op without a choice of algorithm: `algo` (or the table's default) with its
// best protocol.
Prediction select(const HardwareProfile& profile, int world, CollectiveOp op, double bytes,
                  Algorithm algo = Algorithm::Default, Protocol proto = Protocol::Default);
// "dbtree/ll: 25.4 us vs ring/ll 28.4 us at 32 KiB on 8 ranks over 2 nodes: latency-bound", for the
// pick; with forced values, what ran and what the tuner would have picked ("ring/ll (the run's
// choice): 23.8 us at 16 B on 8 ranks over 2 nodes: latency-bound; the tuner would pick tree/ll: 18.2 us").
std::string explain(const HardwareProfile& profile, int world, CollectiveOp op, double bytes,
                    Algorithm algo = Algorithm::Default, Protocol proto = Protocol::Default);
// dtlab::Error (one sentence: what, how to fix) for a forced choice the profile cannot run at all:
// the in-network all-reduce without a reducing switch, or with a protocol other than simple.
void check_forced_choice(const HardwareProfile& profile, CollectiveOp op, Algorithm algo, Protocol proto);

// --algo's and --proto's words with "auto" for Default: "auto", "ring", "dbtree", ...; "auto",
// "simple", "ll", "ll128" (also in NCCL_PROTO's case: LL128). The parsers throw dtlab::Error listing the
// choices: for --algo those of `op` (dtlab-cli train's --algo is the all-reduce's; bench's its --op's).
std::string algorithm_choice_name(Algorithm a);
Algorithm parse_algorithm_choice(std::string_view text, CollectiveOp op = CollectiveOp::AllReduce);
std::string protocol_choice_name(Protocol p);
Protocol parse_protocol_choice(std::string_view text);

// "64 KiB", "1 GiB", "8 B": a power-of-two size as nccl-tests' sweeps name them.
std::string format_bytes(double bytes);

}  // namespace dtlab
