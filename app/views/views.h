// The views: each draws one panel's contents into the current ImGui window from the Snapshot only.
// What a view keeps between frames (zoom, selection, caches) is a state object the app owns and
// passes in, declared beside the view in its header (timeline_view.h, memory_view.h, data_view.h,
// lesson_view.h; TraceUi below for the trace panels), never a static.
#pragma once
#include <imgui.h>

#include <memory>
#include <string>
#include <vector>

#include "app/gl.h"
#include "app/snapshot.h"
#include "app/trace_loader.h"
#include "engine/parallel/sizing.h"

namespace dtlab::app {

// The pipeline view's controls (the Run panel draws the same): a schedule and its sizes to run.
struct PipelineRequest {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 4, microbatches = 8, chunks = 1;
  bool unit_costs = false;  // every action 1 ms (--unit-costs)
  bool operator==(const PipelineRequest&) const = default;
};
// Draws them; true once an edit is complete (a combo picked, a slider released, a box ticked).
bool pipeline_controls(PipelineRequest& r, bool one_line);

struct ViewContext {
  double time = 0;             // seconds since the app started (animation phase)
  bool presentation = false;   // large fonts, high contrast
  bool modeled_clock = true;   // timeline: modeled (true) or wall clock
  GlResources* gl = nullptr;   // shaders and render targets; a view falls back when a program is null
  bool data_set_epoch = true;  // data view's switch; the view may flip it, the app passes it on
  // The pipeline view asks for a restart with `pipeline` (the app applies it, as the Run panel's
  // settings, and leaves why it could not in restart_error).
  bool pipeline_restart = false;
  PipelineRequest pipeline;
  std::string restart_error;
  int pipeline_compare = -1;   // the pipeline view's "compare with": a ScheduleKind, or -1 (none)
  // A/B comparison (app/compare.h): the view draws one side, A (the pinned run) or B (the live one),
  // in half the window, so it leaves out what is not a picture of the run (the memory planner's
  // table, the pipeline's schedule comparison). Both sides share one scale: the view draws with
  // shared_* when it is larger than its own and reports its own in own_*; the app hands the larger
  // of A's and B's back the next frame. 0: the view's own scale.
  int compare_side = 0;  // 0: no comparison; 1: A's side (it keys the colors); 2: B's (no key: A's above says it)
  double shared_span = 0, own_span = 0;    // timeline and pipeline: seconds across the chart
  double shared_bytes = 0, own_bytes = 0;  // memory: bytes across the bars
  // The Sizing view's "Run it scaled down": restart the run with these dtlab flags (the app applies
  // them as `compare` does, and leaves why it could not in restart_error).
  bool sizing_restart = false;
  std::vector<std::string> sizing_flags;
  // A view asks for the stepper's focus (the mesh view: a clicked rank or group); the app applies it.
  bool focus_request = false;
  int focus_rank = -1;
  std::string focus_group;
};

// The stepper's focus in words, the same in every view: "focus: rank 5 (replica 1, stage 0, tp2)",
// "focus: group tp1", or "" without one (focus.cpp); draw_focus_line shows it and the focus's next item.
std::string focus_caption(const Snapshot& s);
void draw_focus_line(const Snapshot& s);

void draw_bucket_view(const Snapshot& s, ViewContext& ctx);
void draw_inspector_view(const Snapshot& s, ViewContext& ctx);
void draw_shard_view(const Snapshot& s, ViewContext& ctx);
void draw_topology_view(const Snapshot& s, ViewContext& ctx);
// The tuning model's all-reduce busbw against size for the run's profile and world (sweep_view.cpp).
void draw_sweep_view(const Snapshot& s, ViewContext& ctx);
// The DP x PP x TP mesh (mesh_view.cpp): ranks by coordinates, the latest collective's group lit.
void draw_mesh_view(const Snapshot& s, ViewContext& ctx);
// The roofline (roofline_view.cpp): the last finished iteration's layers and collectives of the focus
// rank (else rank 0) against the device's roof, log-log, one dot per span coloured by its kind.
void draw_roofline_view(const Snapshot& s, ViewContext& ctx);
// An all-to-all as a sender x receiver matrix of bytes, lit step by step (alltoall_view.cpp): the held
// operation's group's newest, else the newest of the group picked in its combo (`group`; -1: the newest
// of all).
struct AllToAllViewState {
  int32_t group = -1;  // CollectiveInfo::group (0: the world)
};
void draw_alltoall_view(const Snapshot& s, ViewContext& ctx, AllToAllViewState& state);
// Context parallelism's CP group: each rank's chunks of the sequence, the causal mask it met at each
// ring step with the pairs it computed, and the K/V blocks in flight (context_view.cpp). Which ring
// pass: the one running now (or the last) while `follow`, else block `block`'s last pass that way.
struct ContextViewState {
  bool follow = true;
  int block = 0;          // a GPT block
  bool backward = false;  // its backward pass, else its forward
};
void draw_context_view(const Snapshot& s, ViewContext& ctx, ContextViewState& state);
// MoE routing per block: tokens per expert, kept and dropped, capacity, owners, imbalance and aux
// loss with their trend (experts_view.cpp). `rank`: whose tokens, when no rank has the stepper's focus.
struct ExpertsViewState {
  int rank = 0;
};
void draw_experts_view(const Snapshot& s, ViewContext& ctx, ExpertsViewState& state);

// The Sizing view (sizing_view.cpp): the calculator's settings, which the app keeps and a `sizing
// SPEC` script or lesson action sets; `ran`: its last "Run it scaled down" was this view's.
struct SizingViewState {
  SizingInput input;
  bool ran = false;
};
void draw_sizing_view(const Snapshot& s, ViewContext& ctx, SizingViewState& state);

// What the ring and pipeline views keep between frames (caches, an edit in progress): the app owns
// one of each and passes it in; the view's file defines what is inside.
struct RingViewState {
  RingViewState();
  ~RingViewState();
  struct Impl;
  std::unique_ptr<Impl> impl;
};
struct PipelineViewState {
  PipelineViewState();
  ~PipelineViewState();
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// The start screen (start_view.cpp): what is on screen, three one-click scenarios and the course.
// Returns what was clicked; `show_at_start` is its checkbox.
enum class StartChoice { None, Close, DdpOverlap, FsdpMemory, PipelineBubble, Course };
StartChoice draw_start_screen(bool& show_at_start, bool large);

void draw_ring_view(const Snapshot& s, ViewContext& ctx, RingViewState& state);
void draw_pipeline_view(const Snapshot& s, ViewContext& ctx, PipelineViewState& state);

// ---- imported traces (dtlab --open; app/views/trace_view.cpp): they draw from a TraceSnapshot.
// What the trace panels share (the selection every panel shows, the timeline's range, the Compare
// panel's choices) and what they ask of the app, which owns the loader.
struct TraceUi {
  int selected = -1;            // ImportedTrace::collectives index, or -1
  int reveal = 0;               // frames in which the panels bring the selection into view (the app counts down)
  bool fit = true;              // the timeline shows the whole run, until a zoom or a pan
  double t0 = 0, t1 = 1;        // the timeline's range: µs on the aligned clock
  std::string profile = "this", model;  // Compare: hardware profile and dtlab's model spec
  char model_text[256] = "";            // Compare: the model box's text while it is edited
  int64_t batch = 32;
  double bucket_cap_mb = 25, first_bucket_mb = 1;  // the traced job's DDP buckets (dtlab.json)
  bool cancel = false, reopen = false, compare = false;  // requests to the app
};
void draw_trace_timeline(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx);
void draw_trace_collectives(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx);
void draw_trace_breakdown(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx);
void draw_trace_compare(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx);
// "gloo_ddp_w4: 4 ranks, legacy autograd profiler, gloo, 3 iterations, 6 collectives" (or how the load stands).
std::string trace_summary(const TraceSnapshot& t);
// Puts rank 0's iteration n (its n-th ProfilerStep in time order, from 0), collective n or the whole run ("all")
// in the timeline; the sentence saying why not when there is no such thing, else "".
std::string zoom_trace(const TraceSnapshot& t, TraceUi& ui, const std::string& what, int n);

// Puts the next item, `w` pixels wide, on the current line `spacing` after the last one when it fits
// (spacing < 0: the style's), else at the start of the next line. Where SameLine then NewLine would
// leave the cursor past the spacing, which ImGui counts as the line's content, and a window exactly
// one spacing too narrow would then scroll sideways. Every wrapping row of controls uses it.
void flow(float w, float spacing = -1);

// `text` as it fits in `width` pixels of the current font: whole, or its longest prefix that fits
// with "..." after it (never inside a UTF-8 character). A binary search over the prefix: a line
// measured each frame costs a few measures, not one per character. `font_size` > 0 measures at that
// size (the timeline's labels); `dots` is what marks the cut.
std::string fit_text(const std::string& text, float width, float font_size = 0, const char* dots = "...");

// Shared colors, so a rank or a state reads the same in every view.
// The diagram views' boxes (mesh, topology): fill, edge, text and dimmed text.
constexpr ImU32 kBox = IM_COL32(46, 50, 58, 255);
constexpr ImU32 kBoxEdge = IM_COL32(120, 126, 140, 255);
constexpr ImU32 kText = IM_COL32(235, 236, 240, 255);
constexpr ImU32 kDim = IM_COL32(160, 165, 175, 255);
// Draws `s` centered on `center` in the current font.
void centered_text(ImDrawList* dl, ImVec2 center, ImU32 col, const std::string& s);
ImU32 rank_color(int rank, int world, float alpha = 1.0f);
ImU32 bucket_state_color(BucketState s);
ImU32 memory_category_color(MemCategory c);
ImU32 skipped_step_color();  // fp16: a step the ranks skipped (inf/NaN in the gradients): timeline, loss curve
ImU32 with_alpha(ImU32 c, float alpha);  // c with its alpha scaled by `alpha` (0..1)
ImU32 ink_on(ImU32 fill);                 // dark text on light fills, light text on dark ones
ImU32 darker(ImU32 c, float k);           // c with its RGB scaled by `k` (0..1), alpha kept
// The kinds of work a timeline draws, one hue each on the live timeline and on an imported trace's.
enum class Work { Forward, Backward, Loss, Optimizer, Communication, CommUnderCompute };
ImU32 work_color(Work w);
// Pipeline actions: F blue, B orange, I red, W green; later micro-batches darker.
ImU32 pipeline_action_color(ActionType t, int mb, int microbatches);
// Diagonal stripes over [a, b] (idle time, padding), without anti-aliasing.
void draw_hatch(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float spacing);
// "850 ns", "12.3 µs", "4.56 ms", "1.23 s"
std::string time_text(double seconds);
// A link in the topology view carrying `load` transfers of a step in that phase: reduce orange,
// broadcast blue, red where two or more transfers share it.
ImU32 link_load_color(RingPhase phase, int load);
// One color per all-reduce algorithm in the busbw plot (sweep_view.cpp).
ImU32 algorithm_color(Algorithm a);
// A cell holding `held` of `world` contributions: partial sums warm up towards the final color.
ImU32 contribution_color(int held, int world);
// The Roofline view's kinds of point, and a span's fraction of the roof (0..1) from dark red to green.
ImU32 roofline_kind_color(RooflineKind k);
ImU32 roof_fraction_color(double fraction);
// The A/B comparison's two sides (app/compare_view.h): A, the pinned run, sky blue; B, the live one, amber.
ImU32 side_color(bool a);

}  // namespace dtlab::app
