// The roofline (Williams, Waterman and Patterson 2009; docs/course_sources.md §6j): what a kernel can
// reach is min(peak FLOP/s, arithmetic intensity x memory bandwidth). A Roof holds the two figures of
// the device the ranks run on (a GPU's from the datasheet table below, the CPU's measured once with
// OpenBLAS and cached with the "this" profile); every compute span carries its FLOPs and bytes
// (engine/core/op_cost.h) and every collective's follow from its size, so each span of an iteration
// becomes a point, its achieved rate a fraction of the roof. The lab's Roofline view, the timeline's
// colours and the CLI's MFU read these functions; nothing here runs anything.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/gpt_spec.h"
#include "engine/core/op_cost.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/event.h"

namespace dtlab {

// One GPU's dense peaks from its datasheet (SXM parts; no sparsity) and its HBM bandwidth.
struct GpuPeak {
  const char* match;    // a substring of cudaGetDeviceProperties' name: "H200", "H100", "A100"
  const char* name;     // "NVIDIA H200 SXM"
  double fp32, tf32, bf16;  // FLOP/s: FP32 on the CUDA cores; TF32 and BF16 on the tensor cores, dense
  double hbm_bytes_per_s;
  const char* source;   // the datasheet, as docs/course_sources.md §6j cites it
};
const std::vector<GpuPeak>& gpu_peak_table();
// The table's row whose `match` the device name contains (the longest match: "H100 NVL" before
// "H100"); null for a GPU the table does not know.
const GpuPeak* find_gpu_peak(std::string_view device_name);

// What a rank's kernels are held to.
struct Roof {
  std::string device;       // "NVIDIA H200 SXM", "this CPU, 1 BLAS thread"
  double flops_per_s = 0;   // the compute ceiling (FP32: the engine's GEMMs run in FP32, 16-bit runs widen)
  double bytes_per_s = 0;   // the memory slope (bytes read plus written per second)
  std::string source;       // "datasheet (docs/course_sources.md §6j)", "measured 2026-12-01 10:00 UTC"
  bool valid() const { return flops_per_s > 0 && bytes_per_s > 0; }
  double ridge() const { return flops_per_s / bytes_per_s; }  // FLOP/byte where slope meets ceiling
  // What a kernel of `intensity` FLOP/byte can reach: min(ceiling, intensity x bandwidth).
  double attainable(double intensity) const;
};

// The CPU's roof for one rank running `blas_threads` BLAS threads: the measured one-thread sgemm rate
// times the threads, and the measured memcpy stream counted as read plus write (2 / beta). The "this"
// profile measures both once per machine and caches them (cost_model.h).
Roof cpu_roof(const HardwareProfile& this_profile, int blas_threads);
// A GPU's roof from the table (FP32 ceiling, HBM slope); invalid (zeros, `device` named) when the
// table does not know it.
Roof gpu_roof(std::string_view device_name);

// A collective span's work on one rank: the bytes its algorithm moves through this rank (payload x
// the bus-bandwidth factor, nccl-tests' busbw bytes) and, for reducing ops, the additions.
OpCost collective_cost(const CollectiveInfo& c);

// One span of an iteration on the roofline.
enum class RooflineKind : uint8_t { Gemm, Elementwise, Optimizer, Collective };
const char* roofline_kind_name(RooflineKind k);  // "GEMM layer", "element-wise", "optimizer", "collective"
struct RooflinePoint {
  std::string name;   // "forward 2", "backward 0", "allreduce #5"
  RooflineKind kind = RooflineKind::Gemm;
  double flops = 0, bytes = 0, seconds = 0;
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double flops_per_s() const { return seconds > 0 ? flops / seconds : 0; }
  double bytes_per_s() const { return seconds > 0 ? bytes / seconds : 0; }
};
// Achieved / attainable at the point's intensity: a GEMM above the ridge against the FLOP/s ceiling,
// an element-wise op, a copy or a collective against the bandwidth. 0 without a valid roof or a time.
double fraction_of_roof(const RooflinePoint& p, const Roof& roof);
// The point a Compute or Collective event makes (wall-clock duration); false for other events, for
// spans that cost nothing and for an unfinished one.
bool roofline_point(const Event& e, RooflinePoint& out);
// Every point of iteration `iteration` in `events` (one rank's, in time order); a collective whose
// steps were recorded takes their summed time, leaving out what the stepper held it at its gates.
std::vector<RooflinePoint> roofline_points(const std::vector<Event>& events, int32_t iteration);
// The newest iteration of `events` whose Iteration span has ended; -1 when none has.
int32_t last_finished_iteration(const std::vector<Event>& events);

// Model FLOPs of one training step (PaLM's definition, Chowdhery et al. 2022, Appendix B; nanoGPT's
// estimate_mfu): 6 N per token or sample (forward 2 N, backward 4 N), plus for a transformer the
// attention's 12 L C T per token (L layers, width C, context T). Recomputation is not model FLOPs.
double model_flops_per_step(double params, double samples, const GptSpec& gpt);
// Model FLOPs utilisation: model FLOPs / step time / peak FLOP/s of the hardware the step ran on.
double mfu(double model_flops, double seconds, double peak_flops_per_s);

}  // namespace dtlab
