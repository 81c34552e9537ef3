// Pipeline schedules as data, after torch.distributed.pipelining: a schedule is one list of actions
// per rank (`0F0`, `1B2`, idle slots as nullopt) laid out in unit time steps, so the grid shows the
// bubbles. Generators reproduce PyTorch's per-rank compute orders; validate() checks any grid (a
// generated one or a CSV); simulate() times it with real costs. The CLI, the tests and the GUI
// read the same lists.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/pipeline_action.h"

namespace dtlab {


// The most (stage, micro-batch) pairs validate() checks, so a file cannot make the checks allocate
// without limit (kMaxScheduleIndex, in pipeline_action.h, bounds each number).
inline constexpr int64_t kMaxScheduleCells = int64_t{1} << 22;

// Stages are numbered 0..p*v-1 in model order; looped placement (PyTorch's Interleaved1F1B) puts
// stage s on rank s % p, so rank r holds stages r, r+p, r+2p, ...
inline int rank_of_stage(int stage, int ranks) { return stage % ranks; }

struct PipelineSchedule {
  std::string name;      // "GPipe", "1F1B", "Interleaved 1F1B", "ZB-H1", or the CSV's file name
  int stages = 1;        // p*v
  int ranks = 1;         // p
  int microbatches = 1;  // m
  int chunks = 1;        // v: stages per rank
  std::vector<std::vector<std::optional<Action>>> order;  // [rank][time step]; nullopt = idle
};

int num_steps(const PipelineSchedule& s);  // the longest rank's row

enum class ScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved1F1B, ZBH1 };
ScheduleKind parse_schedule_kind(std::string_view flag);  // "gpipe" | "1f1b" | "interleaved" | "zb-h1"
const char* schedule_kind_flag(ScheduleKind k);           // "interleaved"
const char* schedule_kind_name(ScheduleKind k);           // "Interleaved 1F1B"

// PyTorch's compute-only order per rank, then laid out in unit time steps: every action takes one
// step and starts as soon as its rank is free and its dependencies finished in an earlier step.
//   GPipe: all F, then all B (micro-batch order), as ScheduleGPipe.
//   1F1B: Megatron's warmup min(p-s-1, m) forwards, steady F,B pairs, cool-down Bs (Schedule1F1B).
//   Interleaved 1F1B: ScheduleInterleaved1F1B with rounds of p micro-batches; warmup
//     (v-1)*p + 2*(p-r-1) capped at m*v; requires m % p == 0 (older PyTorch's rule).
//   ZB-H1: ScheduleInterleavedZeroBubble with one stage per rank: warmup p-r-1, steady F,I with the
//     first r Ws deferred, so rank r's Ws fill its cool-down bubbles.
// chunks must be 1 except for Interleaved1F1B. Throws dtlab::Error (one sentence) on bad sizes.
PipelineSchedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int chunks = 1);

// A validation failure: what() is one sentence naming the rank, step, action and what it waits for,
// then a blank line and the grid with " <-- ERROR HERE" on the failing step (none when a missing
// action has no step to point at). The fields let the GUI highlight the cell.
struct ScheduleError : Error {
  ScheduleError(std::string sentence, int rank, int step, const std::string& grid);
  std::string sentence;
  int rank = -1, step = -1;  // -1 when the failure has no single cell
};

// Checks, in this order, and throws ScheduleError at the first failure:
//  1. cells: compute actions only, stage and micro-batch in range, each stage on one rank, nothing
//     twice (and not both B and I for one micro-batch), stages == ranks * chunks;
//  2. every dependency exists: F(s) needs F(s-1), B/I(s) needs F(s) and B/I(s+1), W needs I;
//  3. every (stage, mb) has its F and its B (or I and W);
//  4. no deadlock: running each rank's actions in order (idle slots dropped), some rank can always
//     make progress;
//  5. timing: each dependency finished in an earlier time step.
void validate(const PipelineSchedule& s);

// PyTorch's _format_pipeline_order: one row per time step ("Step 00:"), one column per rank
// ("Rank 0 Rank 1 ..."), blanks for idle. Two small departures: trailing blanks are trimmed, and a
// column is at least as wide as its "Rank N" label (PyTorch misaligns from 10 ranks on).
std::string format_schedule(const PipelineSchedule& s, int error_step = -1);

// CSV as PyTorch's _dump_csv/_load_csv: one row per rank, one cell per time step, empty for idle.
// save_csv writes atomically (engine/io/atomic_file.h). load_csv infers p (rows), p*v (largest
// stage + 1), m (largest micro-batch + 1), then validates; `stages` and `microbatches`, when given,
// must match. A bad cell throws "path:row:column: 'XYZ' is not an action like 0F0 or 1B2".
void save_csv(const PipelineSchedule& s, const std::string& path);
PipelineSchedule load_csv(const std::string& path, std::optional<int> stages = std::nullopt,
                          std::optional<int> microbatches = std::nullopt);

// ---- analysis ----

// Seconds (or any unit) per action on one stage, and per hop between ranks.
struct ActionCosts {
  double forward = 1, backward = 1;                // T_F, T_B (full backward)
  double backward_input = 1, backward_weight = 1;  // T_I, T_W
  double hop_latency = 0;  // added to a dependency that crosses ranks (activation or gradient send)
};
double cost_of(ActionType t, const ActionCosts& c);  // T_F, T_B, T_I or T_W; 0 for send/recv actions

// The bubble: idle time per rank over a step, as two ratios of the same idle time:
//   of_ideal: idle / ideal, the ideal being the rank's compute alone (docs/course_sources.md §14's "of ideal");
//   of_wall:  idle / (ideal + idle), the share of the makespan, comparable to simulate()'s bubble.
// GPipe and 1F1B: idle (p-1)(T_F+T_B), ideal m(T_F+T_B): of_ideal (p-1)/m, of_wall (p-1)/(m+p-1).
// Interleaved (costs per chunk): idle (p-1)(T_F+T_B), ideal vm(T_F+T_B): (p-1)/(vm), (p-1)/(vm+p-1).
// ZB-H1: ideal m(T_F+T_I+T_W); idle the ZB paper's (p-1)(T_F+T_I-T_W) when m >= p and
//   T_W <= min(T_F, T_I). Outside that range too few or too long Ws fill the cool-down, and the
//   order as PyTorch gives it idles (p-1)(T_F+T_I) - (min(m,p)-1)·min(T_F,T_I,T_W), which is what
//   this returns (the paper's value inside the range; the tests check it against simulate()).
// All of these are exact for simulate() with no hop latency, on every rank.
struct BubbleFormula {
  double idle = 0, ideal = 0;  // time per rank, in the costs' unit
  double of_ideal = 0, of_wall = 0;
  std::string idle_text, ideal_text;  // in symbols: "(p-1)(T_F+T_B)", "m(T_F+T_B)"
};
BubbleFormula formula_bubble(ScheduleKind kind, int p, int m, int v = 1, const ActionCosts& costs = {});

// In flight on a rank: (stage, micro-batch) pairs whose F ran and whose backward has not, i.e.
// activations held. Until B or I (the default) or, for zero-bubble schedules, until W, which still
// needs the layer inputs. For B-only schedules the two are the same.
enum class InflightUntil : uint8_t { BackwardInput, BackwardWeight };
// Peaks: GPipe m; 1F1B min(p-r, m); interleaved min((v-1)p + 2(p-r-1) + 1, vm) chunk-micro-batches,
// about p + (p-1)/v stage-equivalents on rank 0 (docs/course_sources.md §14); ZB-H1 min(p-r, m) until I (1F1B's,
// which is ZB-H1's point) and min(p, m) on every rank until W (docs/course_sources.md §14's "p").
int formula_peak_inflight(ScheduleKind kind, int rank, int p, int m, int v = 1,
                          InflightUntil until = InflightUntil::BackwardInput);
int measured_peak_inflight(const PipelineSchedule& s, int rank, InflightUntil until = InflightUntil::BackwardInput);

struct TimedAction {
  Action action;
  int step = 0;  // its time step in the grid
  double start = 0, end = 0;
};
struct ScheduleTiming {
  std::vector<std::vector<TimedAction>> ranks;  // [rank][k]: the rank's actions in order
  double makespan = 0;
  std::vector<double> bubble;  // [rank]: idle / makespan
};

// Validates, then runs each rank's actions in order, each as early as its rank and dependencies
// allow (a cross-rank dependency adds hop_latency). The grid's idle slots are ignored: with unit
// costs and no latency the starts are exactly the generated grid's steps.
ScheduleTiming simulate(const PipelineSchedule& s, const ActionCosts& costs = {});

}  // namespace dtlab
