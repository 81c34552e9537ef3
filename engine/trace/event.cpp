// Printable names for trace event tags; views, the exporter and test messages share these spellings.
#include "engine/trace/event.h"

namespace dtlab {

std::string group_label(std::string_view name, const std::vector<int>& ranks) {
  std::string s(name);
  s += ":";
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? "," : " ") + std::to_string(ranks[i]);
  return s;
}

bool parse_group_label(std::string_view text, std::string& name, std::vector<int>& ranks) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::vector<int> out;
  int64_t v = -1;
  for (char c : text.substr(colon + 1)) {
    if (c >= '0' && c <= '9') {
      v = (v < 0 ? 0 : v) * 10 + (c - '0');
      if (v > 1 << 20) return false;
    } else if (c == ',' || c == ' ') {
      if (c == ',' && v < 0) return false;
      if (v >= 0) out.push_back(static_cast<int>(v));
      v = -1;
    } else {
      return false;
    }
  }
  if (v >= 0) out.push_back(static_cast<int>(v));
  if (out.empty()) return false;
  name = std::string(text.substr(0, colon));
  ranks = std::move(out);
  return true;
}

std::string describe_group_label(std::string_view text) {
  std::string name;
  std::vector<int> ranks;
  if (!parse_group_label(text, name, ranks)) return std::string(text);
  std::string s = name + ": rank" + (ranks.size() == 1 ? " " : "s ");
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Compute: return "compute";
    case EventKind::CollectiveIssue: return "collective_issue";
    case EventKind::Collective: return "collective";
    case EventKind::RingStep: return "ring_step";
    case EventKind::MemAlloc: return "mem_alloc";
    case EventKind::MemFree: return "mem_free";
    case EventKind::Iteration: return "iteration";
    case EventKind::Gate: return "gate";
    case EventKind::BucketAssigned: return "bucket_assigned";
    case EventKind::GradReady: return "grad_ready";
    case EventKind::BucketReady: return "bucket_ready";
    case EventKind::BucketLaunch: return "bucket_launch";
    case EventKind::BucketAllReduce: return "bucket_allreduce";
    case EventKind::FsdpUnit: return "fsdp_unit";
    case EventKind::PipelineAction: return "pipeline_action";
    case EventKind::LossScale: return "loss_scale";
    case EventKind::GradClip: return "grad_clip";
  }
  return "?";
}

const char* compute_kind_name(ComputeKind k) {
  switch (k) {
    case ComputeKind::LayerForward: return "forward";
    case ComputeKind::LayerBackward: return "backward";
    case ComputeKind::Loss: return "loss";
    case ComputeKind::LossBackward: return "loss_backward";
    case ComputeKind::OptimizerStep: return "optimizer_step";
    case ComputeKind::ZeroGrad: return "zero_grad";
    case ComputeKind::Other: return "other";
    case ComputeKind::Recompute: return "recompute";
  }
  return "?";
}

const char* ring_phase_name(RingPhase p) {
  switch (p) {
    case RingPhase::None: return "none";
    case RingPhase::ReduceScatter: return "reduce-scatter";
    case RingPhase::AllGather: return "all-gather";
    case RingPhase::Reduce: return "reduce";
    case RingPhase::Broadcast: return "broadcast";
    case RingPhase::Gather: return "gather";
  }
  return "?";
}

const char* fsdp_state_name(FsdpState s) {
  switch (s) {
    case FsdpState::Idle: return "IDLE";
    case FsdpState::Forward: return "FORWARD";
    case FsdpState::PreBackward: return "PRE_BACKWARD";
    case FsdpState::PostBackward: return "POST_BACKWARD";
  }
  return "?";
}

const char* fsdp_verb_name(FsdpVerb v) {
  switch (v) {
    case FsdpVerb::Layout: return "layout";
    case FsdpVerb::Unshard: return "unshard";
    case FsdpVerb::Unsharded: return "unsharded";
    case FsdpVerb::Reshard: return "reshard";
    case FsdpVerb::ReduceGrad: return "reduce_grad";
    case FsdpVerb::GradReduced: return "grad_reduced";
    case FsdpVerb::State: return "state";
  }
  return "?";
}

}  // namespace dtlab
