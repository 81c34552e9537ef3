// Where a run's ranks go when --device and --backend are not both given, as the issue of GPUs puts
// it: cuda + nccl when every rank on this node can have its own GPU, cuda (ranks sharing a GPU)
// when there is at least one, else cpu + threads (socket under dtlab-cli launch). Every strategy
// but dp (torch.nn.DataParallel, CPU only, so cpu by default) runs on either device. Pure: the
// caller says how many GPUs there are, so CPU-only tests check every rule.
#pragma once
#include <string>

#include "engine/train/strategy.h"

namespace dtlab {

struct DeviceQuery {
  std::string device;        // --device: "", cpu or cuda ("" = not given)
  std::string backend;       // --backend: "", threads, cuda, nccl; socket when dtlab-cli launch started us
  Strategy strategy = Strategy::Single;
  int ranks_on_node = 1;     // ranks this machine runs (LOCAL_WORLD_SIZE under launch, else --world)
  int gpus = 0;              // CUDA devices this process sees
  bool cuda_built = false;   // this build has the CUDA engine
  bool nccl_built = false;
  std::string no_gpu_reason = "no CUDA device";  // why gpus is 0, for the sentence
};

struct DeviceChoice {
  std::string device, backend;  // backend: threads | socket | cuda | nccl
  bool launched = false;        // one process per rank
  std::string why;              // one line for the run's header: "cuda + nccl: 4 ranks, 8 GPUs"
};

// dtlab::Error (one sentence, how to fix it) for combinations that cannot run.
DeviceChoice resolve_device(const DeviceQuery& q);

}  // namespace dtlab
