// What the CUDA build adds to a run, behind plain C++ declarations (no CUDA header), so the trainer
// and the lab reach the GPU without compiling against CUDA themselves: the worlds of the cuda and
// nccl backends as RankWorlds, a rank's device for runs with one rank in this process, and the
// launched rank's NCCL communicator. Defined in engine/cuda/platform.cpp (dtlab_cuda).
#pragma once
#include <memory>
#include <string>

#include "engine/comm/socket_backend.h"  // SocketOptions
#include "engine/comm/world.h"

namespace dtlab::cuda {

// The device layer's queries (engine/cuda/runtime.h, without its CUDA include).
bool available();                  // a CUDA device is present (decided once per process)
std::string unavailable_reason();  // "no CUDA device (cudaGetDeviceCount: ...)"; empty when available
std::string runtime_summary();     // "CUDA runtime 13.0, driver 13.0; device 0: NVIDIA H100 ..."
int device_count();                // 0 without a driver or a device
std::string device_name(int device);  // "NVIDIA H200" (the roofline's peak table is keyed by it)

// Ranks as threads sharing device 0 (the cuda backend), or one GPU per rank (nccl, built with NCCL).
std::unique_ptr<RankWorld> make_cuda_world(int world_size, WorldOptions options);
std::unique_ptr<RankWorld> make_nccl_world(int world_size, WorldOptions options);

// One rank's GPU (`device`), with its own compute and comm streams and cuBLAS handle.
std::unique_ptr<Device> make_device(int rank, int device);

// This process's rank of a world launched by `dtlab-cli launch` on the nccl backend: the NCCL
// communicator over `dev` (made by make_device), joined through the TCP rendezvous of `opt`.
class LaunchedRank {
 public:
  virtual ~LaunchedRank() = default;
  virtual Communicator& comm() = 0;
};
std::unique_ptr<LaunchedRank> join_nccl(const SocketOptions& opt, Device& dev, RankContext* ctx);

}  // namespace dtlab::cuda
