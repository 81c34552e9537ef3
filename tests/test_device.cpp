// Where a run's ranks go (engine/train/device_select.h): every default and every refusal, with the
// GPU count given, so a machine without a GPU checks the rules a GPU machine follows.
#include <doctest/doctest.h>

#include "engine/core/check.h"
#include "engine/train/device_select.h"

using namespace dtlab;

namespace {

DeviceQuery machine(int gpus, int ranks, const std::string& strategy = "ddp") {
  DeviceQuery q;
  q.gpus = gpus;
  q.ranks_on_node = ranks;
  q.strategy = parse_strategy(strategy);
  q.cuda_built = q.nccl_built = true;
  q.no_gpu_reason = "no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected)";
  return q;
}

std::string pick(DeviceQuery q) {
  const DeviceChoice c = resolve_device(q);
  return c.device + "+" + c.backend + (c.launched ? " launched" : "");
}

}  // namespace

TEST_SUITE("device") {

TEST_CASE("defaults: nccl with a GPU per rank, cuda when ranks share, cpu without a GPU") {
  CHECK(pick(machine(8, 4)) == "cuda+nccl");
  CHECK(pick(machine(4, 4)) == "cuda+nccl");
  CHECK(pick(machine(1, 4)) == "cuda+cuda");  // ranks share the GPU (NCCL refuses that)
  CHECK(pick(machine(2, 4)) == "cuda+cuda");
  CHECK(pick(machine(1, 1, "single")) == "cuda+cuda");
  CHECK(pick(machine(0, 4)) == "cpu+threads");
  CHECK(resolve_device(machine(0, 4)).why == "cpu: no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected)");
  // One engine: every strategy goes where the GPUs are.
  CHECK(pick(machine(8, 4, "fsdp")) == "cuda+nccl");
  CHECK(pick(machine(1, 4, "pipeline")) == "cuda+cuda");
  // Without NCCL in the build, ranks share through the cuda backend.
  DeviceQuery q = machine(8, 4);
  q.nccl_built = false;
  CHECK(pick(q) == "cuda+cuda");
  // A CPU-only build never picks cuda.
  q = machine(8, 4);
  q.cuda_built = false;
  CHECK(pick(q) == "cpu+threads");
  CHECK(resolve_device(q).why == "cpu: this build has no CUDA engine");
}

TEST_CASE("under dtlab-cli launch: one GPU per process with nccl, else processes on the CPU") {
  DeviceQuery q = machine(4, 4);
  q.backend = "socket";
  CHECK(pick(q) == "cuda+nccl launched");
  q = machine(0, 4);
  q.backend = "socket";
  CHECK(pick(q) == "cpu+socket launched");
  q = machine(2, 4);
  q.backend = "socket";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("this machine has 2 GPUs for 4 ranks"), Error);
}

TEST_CASE("asked for by name: honoured, or one sentence saying how to fix it") {
  DeviceQuery q = machine(8, 4);
  q.device = "cpu";
  CHECK(pick(q) == "cpu+threads");
  q.backend = "cuda";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("--backend cuda moves device memory; add --device cuda"), Error);
  q = machine(8, 4);
  q.backend = "cuda";
  CHECK(pick(q) == "cuda+cuda");  // --backend cuda alone implies the GPU
  q = machine(8, 4);
  q.device = "cuda";
  q.backend = "threads";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("--backend threads keeps every rank in host memory"), Error);
  q = machine(1, 4);
  q.backend = "nccl";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("one rank per GPU, but this machine has 1 GPU for 4 ranks"), Error);
  q = machine(0, 4);
  q.device = "cuda";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("--device cuda: no CUDA device (cudaGetDeviceCount"), Error);
  for (const char* strategy : {"fsdp", "pipeline"}) {  // only the missing device stops them
    q = machine(0, 4, strategy);
    q.device = "cuda";
    CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("--device cuda: no CUDA device (cudaGetDeviceCount"), Error);
  }
  q = machine(8, 4);
  q.device = "cuda";
  q.cuda_built = false;
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("which this build does not have"), Error);
  q.device = "tpu";
  CHECK_THROWS_WITH_AS(resolve_device(q), doctest::Contains("--device tpu is not a device; use cpu or cuda"), Error);
}

}  // TEST_SUITE
