#include "engine/train/device_select.h"

#include "engine/core/check.h"

namespace dtlab {

namespace {

std::string plural(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

}  // namespace

DeviceChoice resolve_device(const DeviceQuery& q) {
  if (!q.device.empty() && q.device != "cpu" && q.device != "cuda")
    throw Error("--device " + q.device + " is not a device; use cpu or cuda");
  if (!q.backend.empty() && q.backend != "threads" && q.backend != "socket" && q.backend != "cuda" && q.backend != "nccl")
    throw Error("--backend " + q.backend + " is not a backend; use threads (ranks as threads of this process), cuda "
                "(ranks sharing a GPU), nccl (one GPU per rank) or socket (one process per rank, set by dtlab-cli launch)");
  DeviceChoice c;
  c.launched = q.backend == "socket";
  const bool gpu_backend = q.backend == "cuda" || q.backend == "nccl";
  const std::string ranks = plural(q.ranks_on_node, "rank", "ranks"), gpus = plural(q.gpus, "GPU", "GPUs");

  // The device: a GPU when there is one and the build runs it, for every strategy.
  if (q.device == "cpu" || (q.device.empty() && !gpu_backend && (q.gpus == 0 || !q.cuda_built))) {
    if (gpu_backend)
      throw Error("--backend " + q.backend + " moves device memory; add --device cuda, or use --backend threads on the CPU");
    c.device = "cpu";
    c.backend = c.launched ? "socket" : "threads";
    c.why = q.device == "cpu" ? "cpu, as asked"
            : !q.cuda_built ? "cpu: this build has no CUDA engine"
                            : "cpu: " + q.no_gpu_reason;
    return c;
  }
  if (!q.cuda_built)
    throw Error("--device cuda needs the CUDA engine, which this build does not have (CMake found no CUDA Toolkit); "
                "use --device cpu or rebuild with CUDA");
  if (q.gpus == 0) throw Error("--device cuda: " + q.no_gpu_reason + "; use --device cpu");
  c.device = "cuda";

  // The backend.
  if (q.backend == "threads")
    throw Error("--backend threads keeps every rank in host memory; with --device cuda use --backend cuda (ranks share "
                "a GPU) or nccl (one GPU per rank)");
  if (q.backend == "nccl" || (q.backend != "cuda" && (c.launched || (q.nccl_built && q.gpus >= q.ranks_on_node && q.ranks_on_node > 1)))) {
    if (!q.nccl_built) throw Error("--backend nccl needs NCCL, which this build does not have; use --backend cuda");
    if (q.gpus < q.ranks_on_node)
      throw Error("--backend nccl runs one rank per GPU, but this machine has " + gpus + " for " + ranks +
                  " (NCCL refuses two ranks on one GPU); use --backend cuda to share a GPU");
    c.backend = "nccl";
    c.why = "cuda + nccl: " + ranks + (c.launched ? " as processes" : "") + ", one GPU each (" + gpus + " here)";
    return c;
  }
  if (c.launched)
    throw Error("under dtlab-cli launch every process is one rank on its own GPU: --backend cuda shares a GPU between "
                "threads of one process; drop --backend (nccl is used) or run without launch");
  c.backend = "cuda";
  c.why = "cuda: " + ranks + " sharing " + (q.gpus == 1 ? "the GPU" : std::to_string(q.gpus) + " GPUs");
  return c;
}

}  // namespace dtlab
