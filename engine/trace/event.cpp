// Printable names for trace event tags; views, the exporter and test messages share these spellings.
#include "engine/trace/event.h"

namespace dtlab {

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
  }
  return "?";
}

}  // namespace dtlab
