#include "engine/trace/roofline.h"

#include <algorithm>
#include <cstring>

#include "engine/core/collective.h"

namespace dtlab {

const std::vector<GpuPeak>& gpu_peak_table() {
  // Dense figures (the datasheets print TF32 and BF16 "with sparsity" at twice these); SXM parts.
  static const std::vector<GpuPeak> table = {
      {"H200", "NVIDIA H200 SXM", 67e12, 494.5e12, 989.5e12, 4.8e12, "NVIDIA H200 Tensor Core GPU datasheet (2024)"},
      {"H100", "NVIDIA H100 SXM", 67e12, 494.5e12, 989.5e12, 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet (2023)"},
      {"A100-SXM4-40GB", "NVIDIA A100 SXM 40GB", 19.5e12, 156e12, 312e12, 1.555e12,
       "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
      {"A100", "NVIDIA A100 SXM 80GB", 19.5e12, 156e12, 312e12, 2.039e12, "NVIDIA A100 Tensor Core GPU datasheet (2021)"},
  };
  return table;
}

const GpuPeak* find_gpu_peak(std::string_view device_name) {
  const GpuPeak* best = nullptr;
  for (const GpuPeak& g : gpu_peak_table())
    if (device_name.find(g.match) != std::string_view::npos && (!best || std::strlen(g.match) > std::strlen(best->match)))
      best = &g;
  return best;
}

double Roof::attainable(double intensity) const { return std::min(flops_per_s, intensity * bytes_per_s); }

Roof cpu_roof(const HardwareProfile& p, int blas_threads) {
  Roof r;
  const int t = std::max(1, blas_threads);
  r.device = "this CPU, " + std::to_string(t) + (t == 1 ? " BLAS thread" : " BLAS threads");
  r.flops_per_s = p.sgemm_flops_per_thread * t;
  r.bytes_per_s = p.intra.beta > 0 ? 2.0 / p.intra.beta : 0;
  r.source = "OpenBLAS sgemm and memcpy measured " + (p.measured.empty() ? std::string("now") : p.measured);
  return r;
}

Roof gpu_roof(std::string_view device_name) {
  Roof r;
  r.device = std::string(device_name);
  if (const GpuPeak* g = find_gpu_peak(device_name)) {
    r.device = g->name;
    r.flops_per_s = g->fp32;
    r.bytes_per_s = g->hbm_bytes_per_s;
    r.source = std::string(g->source) + ", FP32 (docs/course_sources.md §6j)";
  } else {
    r.source = "no peak known for this GPU (engine/trace/roofline.cpp's table)";
  }
  return r;
}

OpCost collective_cost(const CollectiveInfo& c) {
  const int n = std::max<int>(1, c.group_size);
  const double bytes = static_cast<double>(c.bytes) * bus_bandwidth_factor(c.op, n);
  const bool reduces = c.op == CollectiveOp::AllReduce || c.op == CollectiveOp::ReduceScatter || c.op == CollectiveOp::Reduce;
  // A ring reduce-scatter adds (n - 1) / n of the buffer on each rank (all-reduce: its first half).
  const double adds = reduces ? static_cast<double>(std::max(c.in_count, c.out_count)) * (n - 1) / n : 0;
  return {adds, bytes};
}

const char* roofline_kind_name(RooflineKind k) {
  switch (k) {
    case RooflineKind::Gemm: return "GEMM layer";
    case RooflineKind::Elementwise: return "element-wise";
    case RooflineKind::Optimizer: return "optimizer";
    case RooflineKind::Collective: return "collective";
  }
  return "?";
}

double fraction_of_roof(const RooflinePoint& p, const Roof& roof) {
  if (!roof.valid() || p.seconds <= 0) return 0;
  if (p.flops <= 0) return p.bytes_per_s() / roof.bytes_per_s;  // a copy: bandwidth only
  const double reach = p.bytes > 0 ? roof.attainable(p.intensity()) : roof.flops_per_s;
  return reach > 0 ? p.flops_per_s() / reach : 0;
}

namespace {

// A layer span is a GEMM when its intensity is well above an element-wise op's (about 1/8 FLOP per
// byte in float32): a Linear or a transformer block; a ReLU, the loss and the embedding sum are not.
RooflineKind compute_kind_of(const ComputeInfo& c) {
  if (c.kind == ComputeKind::OptimizerStep || c.kind == ComputeKind::ZeroGrad) return RooflineKind::Optimizer;
  if (c.kind == ComputeKind::Loss || c.kind == ComputeKind::LossBackward || c.kind == ComputeKind::Other)
    return RooflineKind::Elementwise;
  return c.bytes > 0 && c.flops / c.bytes > 1.0 ? RooflineKind::Gemm : RooflineKind::Elementwise;
}

}  // namespace

bool roofline_point(const Event& e, RooflinePoint& out) {
  if (e.wall_end_ns <= e.wall_begin_ns) return false;
  out.seconds = static_cast<double>(e.wall_end_ns - e.wall_begin_ns) * 1e-9;
  if (e.kind == EventKind::Compute) {
    if (e.compute.flops <= 0 && e.compute.bytes <= 0) return false;
    out.name = compute_kind_name(e.compute.kind);
    if (e.compute.layer >= 0) out.name += " " + std::to_string(e.compute.layer);
    out.kind = compute_kind_of(e.compute);
    out.flops = e.compute.flops;
    out.bytes = e.compute.bytes;
    return true;
  }
  if (e.kind == EventKind::Collective) {
    const OpCost c = collective_cost(e.coll);
    if (c.bytes <= 0) return false;
    out.name = std::string(collective_name(e.coll.op)) + " #" + std::to_string(e.coll.seq);
    out.kind = RooflineKind::Collective;
    out.flops = c.flops;
    out.bytes = c.bytes;
    return true;
  }
  return false;
}

std::vector<RooflinePoint> roofline_points(const std::vector<Event>& events, int32_t iteration) {
  std::vector<RooflinePoint> out;
  RooflinePoint p;
  for (const Event& e : events) {
    if (e.iteration != iteration || !roofline_point(e, p)) continue;
    if (e.kind == EventKind::Collective) {
      // A stepped collective's span includes the time its steps were held at the stepper's gates; its
      // steps' own spans (RingStep, recorded after each gate) are what it took.
      double stepped = 0;
      for (const Event& s : events)
        if (s.kind == EventKind::RingStep && s.step.seq == e.coll.seq && s.step.group == e.coll.group)
          stepped += static_cast<double>(s.wall_end_ns - s.wall_begin_ns) * 1e-9;
      if (stepped > 0) p.seconds = std::min(p.seconds, stepped);
    }
    out.push_back(p);
  }
  return out;
}

int32_t last_finished_iteration(const std::vector<Event>& events) {
  int32_t last = -1;
  for (const Event& e : events)
    if (e.kind == EventKind::Iteration && e.wall_end_ns > e.wall_begin_ns) last = std::max(last, e.iteration);
  return last;
}

double model_flops_per_step(double params, double samples, const GptSpec& gpt) {
  double per = 6 * params;
  if (!gpt.empty())
    per += 12.0 * static_cast<double>(gpt.layers) * static_cast<double>(gpt.embd) * static_cast<double>(gpt.ctx);
  return per * samples;
}

double mfu(double model_flops, double seconds, double peak) { return seconds > 0 && peak > 0 ? model_flops / seconds / peak : 0; }

}  // namespace dtlab
