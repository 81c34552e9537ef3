#!/usr/bin/env python3
"""Writes hand-made Kineto (torch.profiler) traces of dtlab's "mlp:2,512,512,3" DDP step on NCCL.

    tests/data/traces/make_kineto_fixture.py            # rewrites the two fixture sets below
    tests/data/traces/make_kineto_fixture.py --check    # exits 1 if the files on disk differ

Writes kineto_nccl_w2/rank{0,1}.json (plain) and kineto_nccl_w4/rank{0..3}.json.gz (gzip, mtime 0)
next to this script. Deterministic: the same bytes every run (a seeded random.Random per rank).

NOT RECORDED. Debian's torch 1.13 has no Kineto, so these traces are written from the fields that
PyTorch 2.x and Kineto emit, read in their sources (docs/trace_formats.md lists them with versions):
- Top level, in Kineto's order: "schemaVersion": 1, "deviceProperties", the profiler's metadata
  ("distributedInfo"), "displayTimeUnit": "ms", "baseTimeNanoseconds", "traceEvents", "traceName".
  libkineto/src/output_json.cpp (ChromeTraceLogger::handleTraceStart, finalizeTrace).
- "distributedInfo": {"backend", "rank", "world_size", "pg_count", "pg_config", "nccl_version"}:
  torch/profiler/profiler.py (_KinetoProfile._get_distributed_info) and
  torch/distributed/distributed_c10d.py (_get_pg_config: pg_name, pg_desc, backend_config, pg_size,
  ranks).
- Timestamps: "ts" and "dur" in µs with three decimals (ns), "ts" after Kineto subtracts
  baseTimeNanoseconds (output_json.cpp: "{}.{:03}" of ns, transToRelativeTime).
- Event shapes: "X" events with cat cpu_op, user_annotation, cuda_runtime, cuda_driver, kernel,
  gpu_memcpy, gpu_user_annotation, Trace; "M" metadata (process_name, thread_name); "s"/"f" flows
  (cat "ac2g") from a launch to its kernel; "i" instants ("Iteration Start: PyTorch Profiler",
  "Record Window End") with string pids/tids (output_json.cpp: handleActivity, handleLink,
  handleTraceSpan, addIterationMarker, handleDeviceInfo, handleResourceInfo, finalizeTrace).
- cpu_op / user_annotation args: "External id", "Record function id", "Ev Idx" (what published
  torch.profiler traces carry; "Record function id" is added in torch/csrc/autograd/
  profiler_kineto.cpp). A kernel's, memcpy's or launch's "External id" is
  that of the CPU op it is linked to (output_json.cpp handleActivity: linkedActivity), here the
  innermost cpu_op that launched it, so an NCCL kernel links to record_param_comms. Here a
  gpu_user_annotation spans the GPU work launched under the innermost user annotation of the
  launching thread, one per stream (a simplification of Kineto's GPU user-annotation spans).
- Kernel args: "queued", "device", "context", "stream", "correlation", "registers per thread",
  "shared memory", "blocks per SM", "warps per SM", "grid", "block", "est. achieved occupancy %";
  memcpy args: "device", "context", "stream", "correlation", "bytes", "memory bandwidth (GB/s)"
  (libkineto CUPTI activity metadata). Runtime/driver args: "cbid", "correlation" with CUPTI's
  callback ids (cudaLaunchKernel 211, cudaMemcpyAsync 41, cudaStreamSynchronize 131,
  cudaStreamWaitEvent 147, cuLaunchKernelEx 652: cupti_runtime_cbid.h / cupti_driver_cbid.h).
- DDP's all-reduce: cpu_op "c10d::allreduce_" > cpu_op "record_param_comms" > user_annotation
  "nccl:all_reduce" > cuda_driver "cuLaunchKernelEx", the kernel
  "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)" on NCCL's own
  stream. record_param_comms args, names and value types as torch/csrc/profiler/util.cpp
  (saveNcclMetaTyped; keys in torch/csrc/profiler/util.h) writes them for
  ProcessGroupNCCL::allreduce's RECORD_PARAM_COMMS_DATA (torch/csrc/distributed/c10d/
  ProcessGroupNCCL.cpp, ParamCommsUtils.hpp): "Collective name": "allreduce", "dtype": "Float",
  "In msg nelems", "Out msg nelems", "In split size": "[]", "Out split size": "[]",
  "Global rank start", "Global rank stride", "Group size", "Process Group Name": "0",
  "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Rank", "Seq",
  "Comms Id", "Is asynchronized op". Kineto copies the collective fields onto the NCCL kernel
  (output_json.cpp handleActivity, "Populate NCCL collective metadata from CPU to GPU": Collective
  name, In/Out msg nelems, Group size, dtype, In/Out split size, Process Group
  Name/Description/Ranks).
Illustrative, not taken from a run: the GPU (4 x "NVIDIA A10G" on PCIe, like an AWS g5.12xlarge),
every duration, the pids/tids/stream ids, the Seq base (6) and the "Comms Id" values (a stand-in
for c10::get_hash). The model, its DDP buckets and their sizes are exact:
bucket 0 = 4.weight, 4.bias, 2.bias, 2.weight = 1536 + 3 + 512 + 262144 = 264195 floats (the 1 MiB
first bucket, closed by 2.weight), bucket 1 = 0.weight, 0.bias = 1024 + 512 = 1536 floats, as
torch 1.13 measured them (tools/record_torch_trace.py prints DDP's rebuilt_bucket_sizes
"1056780, 6144" bytes).

The story in the traces: 3 profiled iterations (ProfilerStep#1..#3, as torch.profiler's
schedule(wait=0, warmup=1, active=3) names them). Each rank runs forward on its main thread and
backward on the autograd engine's device thread, which issues the two bucket all-reduces; bucket 0's
NCCL kernel overlaps the rest of the backward kernels, bucket 1's runs after the last one (exposed),
then DDP copies the buckets back into the grads (Memcpy DtoD), SGD runs one multi_tensor_apply
kernel and loss.item() syncs. In ProfilerStep#1 one rank (rank 1 of 2, rank 2 of 4) spends ~800 µs
more in the data loader, so it arrives ~800 µs late to that iteration's all-reduces: the other
ranks' NCCL kernels start on time and spin until it joins. It stays somewhat behind in the next
steps (its CPU work after the last all-reduce is on its critical path while the others wait on their
GPU). Every all-reduce kernel ends at the same instant on every rank. Each rank has its own clock:
its "ts" values are shifted by 5012345.678 µs + rank x 1234567.891 µs, and its baseTimeNanoseconds
carries a different error of a few ms per rank, so only the collectives' ends align the ranks.
"""
import argparse, gzip, hashlib, io, json, os, random, sys

HERE = os.path.dirname(os.path.abspath(__file__))

MODEL = "mlp:2,512,512,3"
DIMS = [2, 512, 512, 3]
BATCH = 32
# DDP's buckets after the rebuild, in launch order: (parameter, elements), gradient-ready order.
BUCKETS = [[("4.weight", 512 * 3), ("4.bias", 3), ("2.bias", 512), ("2.weight", 512 * 512)],
           [("0.weight", 2 * 512), ("0.bias", 512)]]
BUCKET_NELEMS = [sum(n for _, n in b) for b in BUCKETS]
assert BUCKET_NELEMS == [264195, 1536]

FIRST_STEP = 1                  # schedule(wait=0, warmup=1, active=3): ProfilerStep#1..#3 recorded
STRAGGLE_NS = 800_000           # the late rank's extra data-loader time in the first profiled step
SEQ0 = 6                        # process group sequence number of the first profiled all-reduce
TS_BASE_NS = 5_012_345_678      # every rank's first event is ~5 s after its process started...
TS_PER_RANK_NS = 1_234_567_891  # ...plus rank x 1234567.891 µs: a clock of its own
WALL0_NS = 1_732_000_000_000_000_000   # the run's wall-clock start (Nov 2024), for baseTimeNanoseconds
BASE_SKEW_NS = [0, 2_317_000, -1_905_000, 612_000]   # per-rank baseTimeNanoseconds error (hosts' clocks)
NCCL_VERSION = "2.21.5"
GPU_NAME = "NVIDIA A10G"
NUM_SMS = 80
COMPUTE_STREAM = 7
NCCL_STREAM = 24
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def xfer_us(world):
    """Time the data moves once every rank has joined (µs), per bucket: a latency plus the ring's
    2(n-1)/n of the bucket at a PCIe-like ~12 GB/s (2 ranks: 110 and 13 µs; 4 ranks: 155 and 15)."""
    f = 2.0 * (world - 1) / world
    return (20.0 + 90.0 * f, 9.0 + 4.0 * f)


DEVICE_PROPERTIES = {
    "name": GPU_NAME, "totalGlobalMem": 23836098560, "computeMajor": 8, "computeMinor": 6,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 1536, "regsPerBlock": 65536,
    "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": NUM_SMS, "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 101376, "sharedMemPerMultiprocessor": 102400}

# GPU kernels: name, (grid), (block), registers per thread, shared memory (bytes).
K_GEMM = [("ampere_sgemm_32x32_sliced1x4_tn", (16, 1, 1), (128, 1, 1), 86, 16384),
          ("ampere_sgemm_64x32_sliced1x4_tn", (8, 1, 1), (128, 1, 1), 120, 24576),
          ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
           "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
           "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
           "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
           "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
           "float>, float, float)", (1, 32, 1), (128, 1, 1), 40, 2048)]
K_MM = ("ampere_sgemm_64x32_sliced1x4_nn", (8, 8, 1), (128, 1, 1), 120, 24576)
K_MM_WGRAD = ("ampere_sgemm_32x128_nt", (16, 4, 1), (256, 1, 1), 96, 20480)


def _elementwise(functor, args="at::detail::Array<char*, 2>"):
    return (f"void at::native::vectorized_elementwise_kernel<4, {functor}, {args} >"
            f"(int, {functor}, {args})")


K_RELU = (_elementwise("at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, "
                       "c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() "
                       "const::{lambda()#7}::operator()() const::{lambda(float)#1}"),
          (64, 1, 1), (128, 1, 1), 26, 0)
K_FILL = (_elementwise("at::native::FillFunctor<float>", "at::detail::Array<char*, 1>"),
          (1, 1, 1), (128, 1, 1), 16, 0)
K_MUL = (_elementwise("at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::"
                      "MulFunctor<float> >"), (64, 1, 1), (128, 1, 1), 24, 0)
K_THRESHOLD = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
               "threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, "
               "at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::"
               "threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, "
               "at::detail::Array<char*, 3>)", (64, 1, 1), (128, 1, 1), 26, 0)
K_SUM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
         "float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::"
         "MeanOps<float, float, float, float>, unsigned int, float, 4>)", (4, 1, 1), (32, 16, 1), 32, 16)
K_LOGSOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<1, float, float, float, "
                "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
                (32, 1, 1), (32, 1, 1), 30, 0)
K_NLL = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>"
         "(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)",
         (1, 1, 1), (32, 1, 1), 32, 2048)
K_NLL_BWD = ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>"
             "(float*, float const*, long const*, float const*, float const*, bool, int, int, long, long)",
             (1, 1, 1), (32, 1, 1), 28, 0)
K_LOGSOFTMAX_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<1, float, float, float, "
                    "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, "
                    "float const*, int)", (32, 1, 1), (32, 1, 1), 30, 0)
K_SGD = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
         "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
         "std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::"
         "(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)",
         (130, 1, 1), (512, 1, 1), 40, 0)
K_NCCL = (NCCL_KERNEL, (2, 1, 1), (640, 1, 1), 96, 0)


def fmt_ns(ns):
    """Kineto's fmtTs: µs with three decimals (ns)."""
    return "%d.%03d" % divmod(ns, 1000)


def comms_id(seq, world):
    """A stand-in for c10::get_hash(pg name, seq, isP2P, rank start, stride, world): 63 bits."""
    h = hashlib.sha1(f"0|{seq}|0|0|1|{world}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1



# -- the step as op trees: O = a CPU span (own µs before its children, children, own µs after),
# K = a kernel launch and its kernel, C = a copy, W = plain CPU work between children ------------
def O(name, pre, *children, post=1.0, cat="cpu_op"):
    return ("op", name, pre, children, post, cat)


def A(name, pre, *children, post=1.0):
    return O(name, pre, *children, post=post, cat="user_annotation")


def K(kernel, us, launch_us=5.0):
    return ("kernel", kernel, us, launch_us)


def C(kind, nbytes, us, api_us):
    return ("copy", kind, nbytes, us, api_us)


def W(us):
    return ("work", us)


def linear(layer):
    return O("aten::linear", 3,
             O("aten::t", 2, O("aten::transpose", 2, O("aten::as_strided", 1.5, post=0))),
             O("aten::addmm", 7, K(K_GEMM[layer], (2.9, 5.4, 3.1)[layer]), post=3), post=2)


def to_device(nbytes):
    return O("aten::to", 2, O("aten::_to_copy", 2, O("aten::empty_strided", 3, post=0),
                             O("aten::copy_", 3, C("Memcpy HtoD (Pageable -> Device)", nbytes, 1.3, 11))))


def evaluate(fn, *body):
    return O(f"autograd::engine::evaluate_function: {fn}", 3, O(fn, 2, *body, post=2), post=3)


def addmm_backward(layer):
    """AddmmBackward0 of the Linear at module index `layer` (4, 2, 0), then its TBackward0."""
    body = []
    if layer > 0:  # grad of the input; layer 0's input needs none
        body += [O("aten::t", 3, post=0), O("aten::mm", 6, K(K_MM, {4: 2.7, 2: 6.1}[layer]), post=2)]
    body += [O("aten::t", 3, post=0),
             O("aten::mm", 6, K(K_MM_WGRAD, (3.2, 5.8, 3.0)[layer // 2]), post=2),
             O("aten::t", 2.5, post=0),
             O("aten::sum", 8, K(K_SUM, (2.6, 2.9, 2.8)[layer // 2]), post=2),
             O("aten::view", 2, post=0)]
    return [evaluate("AddmmBackward0", *body), evaluate("TBackward0", O("aten::t", 3, post=0))]


def accumulate_grad(nelems):
    """AccumulateGrad, then DDP's hook copies grad / world into the bucket (one mul kernel)."""
    return evaluate("torch::autograd::AccumulateGrad", O("aten::detach", 2.5, post=0),
                    O("aten::mul", 6, K(K_MUL, 1.3 + nelems / 90000.0), post=2))


RELU = O("aten::relu", 3, O("aten::clamp_min", 4, K(K_RELU, 1.6), post=2))
FORWARD = [  # the main thread, after the data loader: batch to the GPU, forward, loss, backward's seed
    to_device(BATCH * DIMS[0] * 4), to_device(BATCH * 8),   # x (float32) and y (int64)
    A("Optimizer.zero_grad#SGD.zero_grad", 13, post=0),
    A("DistributedDataParallel.forward", 24, linear(0), RELU, linear(1), RELU, linear(2), post=9),
    O("aten::cross_entropy_loss", 3,
      O("aten::log_softmax", 2, O("aten::_log_softmax", 4, K(K_LOGSOFTMAX, 2.2), post=2)),
      O("aten::nll_loss_nd", 2, O("aten::nll_loss", 2, O("aten::nll_loss_forward", 5, K(K_NLL, 2.4),
                                                          post=3))), post=2),
    O("aten::ones_like", 2, O("aten::empty_like", 3, post=0), O("aten::fill_", 3, K(K_FILL, 1.3)))]
RELU_BACKWARD = evaluate("ReluBackward0", O("aten::threshold_backward", 5, K(K_THRESHOLD, 1.7), post=2))
BACKWARD_TO_BUCKET0 = (  # the autograd thread, until the first bucket is full
    [evaluate("NllLossBackward0",
              O("aten::nll_loss_backward", 3, O("aten::zero_", 2, O("aten::fill_", 3, K(K_FILL, 1.2))),
                W(4), K(K_NLL_BWD, 2.0), post=2)),
     evaluate("LogSoftmaxBackward0", O("aten::_log_softmax_backward_data", 5, K(K_LOGSOFTMAX_BWD, 2.1),
                                       post=2))]
    + addmm_backward(4) + [accumulate_grad(n) for _, n in BUCKETS[0][:2]]
    + [RELU_BACKWARD] + addmm_backward(2) + [accumulate_grad(n) for _, n in BUCKETS[0][2:]])
BACKWARD_TO_BUCKET1 = [RELU_BACKWARD] + addmm_backward(0) + [accumulate_grad(n) for _, n in BUCKETS[1]]
COPY_BACK = [O("torch.distributed.ddp.reducer::copy_bucket_to_grad", 3,
               O("aten::copy_", 3, C("Memcpy DtoD (Device -> Device)", n * 4, 1.4 + n / 80000.0, 5)))
             for bucket in BUCKETS for _, n in bucket]
OPTIMIZER_STEP = A("Optimizer.step#SGD.step", 21, O("aten::_foreach_add_", 9, K(K_SGD, 9.8, 6), post=3),
                   post=6)


class Ev:
    """One trace event. ts/dur in local ns; args keep their order."""
    __slots__ = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "extra")

    def __init__(self, ph, cat, name, pid, tid, ts, dur=None, args=None, extra=None):
        self.ph, self.cat, self.name, self.pid, self.tid = ph, cat, name, pid, tid
        self.ts, self.dur, self.args, self.extra = ts, dur, args, extra


class RankSim:
    """One rank's CPU threads and GPU streams, advanced op by op (times in ns, local clock)."""

    def __init__(self, rank, world, seed):
        self.rank, self.world = rank, world
        self.rng = random.Random(seed * 1000 + world * 100 + rank)
        self.speed = (1.00, 1.03, 0.98, 1.05)[rank % 4]  # this host's CPU, relative
        self.pid = 40213 + 1171 * rank
        self.main = self.pid              # the Python main thread: tid == pid on Linux
        self.bwd = self.pid + 94          # the autograd engine's thread for this GPU
        self.dev = rank
        self.t = {self.main: 0, self.bwd: 0}
        self.stack = {self.main: [], self.bwd: []}
        self.stream_free = {COMPUTE_STREAM: 0, NCCL_STREAM: 0}
        self.cpu, self.gpu, self.flows, self.gpu_ann = [], [], [], {}
        self.ext = 1000 + 37 * rank
        self.corr = 5000 + 53 * rank
        self.ev_idx = 0
        self.first = self.last = None

    # -- CPU side --------------------------------------------------------------------------
    def jit(self, us, spread=0.06):
        return max(1, int(us * 1000 * self.speed * (1 + self.rng.uniform(-spread, spread))))

    def work(self, tid, us):
        self.t[tid] += self.jit(us)

    def begin(self, tid, name, cat="cpu_op", extra_args=None):
        self.ext += 1
        args = {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ev_idx}
        self.ev_idx += 1
        if extra_args:
            args.update(extra_args)
        ev = Ev("X", cat, name, self.pid, tid, self.t[tid], 0, args)
        self.cpu.append(ev)
        self.stack[tid].append(ev)
        return ev

    def end(self, tid, tail_us=0):
        if tail_us:
            self.work(tid, tail_us)
        ev = self.stack[tid].pop()
        ev.dur = self.t[tid] - ev.ts

    def owner(self, tid):
        """External id of the innermost cpu_op (what a launch links to), and the innermost user
        annotation (what a gpu_user_annotation belongs to)."""
        op = next((e for e in reversed(self.stack[tid]) if e.cat == "cpu_op"), None)
        ann = next((e for e in reversed(self.stack[tid]) if e.cat == "user_annotation"), None)
        return (op.args["External id"] if op else 0), ann

    def runtime(self, tid, name, cbid, us, cat="cuda_runtime"):
        self.corr += 1
        ext, _ = self.owner(tid)
        args = {"External id": ext, "cbid": cbid, "correlation": self.corr} if ext else \
            {"cbid": cbid, "correlation": self.corr}
        ev = Ev("X", cat, name, self.pid, tid, self.t[tid], self.jit(us), args)
        self.cpu.append(ev)
        self.t[tid] += ev.dur
        return ev

    # -- GPU side --------------------------------------------------------------------------
    def _gpu(self, tid, api, cat, name, stream, begin, dur, args):
        ext, ann = self.owner(tid)
        full = {"External id": ext} if ext else {}
        full.update(args)
        ev = Ev("X", cat, name, self.dev, stream, begin, dur, full)
        self.gpu.append(ev)
        self.flows.append(Ev("s", "ac2g", "ac2g", self.pid, tid, api.ts, extra={"id": api.args["correlation"]}))
        self.flows.append(Ev("f", "ac2g", "ac2g", self.dev, stream, begin,
                             extra={"id": api.args["correlation"], "bp": "e"}))
        if ann is not None:
            key = (ann.args["External id"], stream)
            g = self.gpu_ann.get(key)
            if g is None:
                self.gpu_ann[key] = Ev("X", "gpu_user_annotation", ann.name, self.dev, stream, begin,
                                       dur, {"External id": ann.args["External id"]})
            else:
                g.dur = max(g.ts + g.dur, begin + dur) - g.ts
        return ev

    def kernel(self, tid, k, us, launch_us=5.0, stream=COMPUTE_STREAM):
        name, grid, block, regs, smem = k
        api = self.runtime(tid, "cudaLaunchKernel", 211, launch_us)
        begin = max(api.ts + self.jit(4.0, 0.3), self.stream_free[stream] + self.jit(0.8, 0.5))
        dur = max(1000, int(us * 1000 * (1 + self.rng.uniform(-0.04, 0.04))))
        self.stream_free[stream] = begin + dur
        blocks = grid[0] * grid[1] * grid[2]
        threads = block[0] * block[1] * block[2]
        bps = blocks / NUM_SMS
        args = {"queued": 0, "device": self.dev, "context": 1, "stream": stream,
                "correlation": api.args["correlation"], "registers per thread": regs,
                "shared memory": smem, "blocks per SM": round(bps, 6),
                "warps per SM": round(bps * threads / 32, 6), "grid": list(grid), "block": list(block),
                "est. achieved occupancy %": max(0, min(100, int(0.5 + 100 * bps * threads / 1536)))}
        return self._gpu(tid, api, "kernel", name, stream, begin, dur, args)

    def memcpy(self, tid, kind, nbytes, us, api_us):
        api = self.runtime(tid, "cudaMemcpyAsync", 41, api_us)
        begin = max(api.ts + self.jit(3.0, 0.3), self.stream_free[COMPUTE_STREAM] + self.jit(0.8, 0.5))
        dur = max(700, int(us * 1000 * (1 + self.rng.uniform(-0.05, 0.05))))
        self.stream_free[COMPUTE_STREAM] = begin + dur
        args = {"device": self.dev, "context": 1, "stream": COMPUTE_STREAM,
                "correlation": api.args["correlation"], "bytes": nbytes,
                "memory bandwidth (GB/s)": round(nbytes / dur, 6)}
        return self._gpu(tid, api, "gpu_memcpy", kind, COMPUTE_STREAM, begin, dur, args)

    # -- one DDP step ----------------------------------------------------------------------
    def run(self, tid, node):
        """Plays an op tree (see O, K, C, W below) on a thread."""
        kind = node[0]
        if kind == "kernel":
            self.kernel(tid, node[1], node[2], node[3])
        elif kind == "copy":
            self.memcpy(tid, *node[1:])
        elif kind == "work":
            self.work(tid, node[1])
        else:
            _, name, pre, children, post, cat = node
            self.begin(tid, name, cat)
            self.work(tid, pre)
            for child in children:
                self.run(tid, child)
            self.end(tid, post)

    def allreduce(self, bucket, seq):
        """DDP launches a bucket's all-reduce; yields when the NCCL kernel could start (this rank's
        arrival) and gets back the instant it ends on every rank."""
        B, n = self.bwd, BUCKET_NELEMS[bucket]
        ranks = "[" + ", ".join(str(r) for r in range(self.world)) + "]"
        self.begin(B, "c10d::allreduce_")
        self.work(B, 5)
        self.begin(B, "record_param_comms", extra_args={
            "Collective name": "allreduce", "dtype": "Float", "In msg nelems": n, "Out msg nelems": n,
            "In split size": "[]", "Out split size": "[]", "Global rank start": 0,
            "Global rank stride": 1, "Group size": self.world, "Process Group Name": "0",
            "Process Group Description": "default_pg", "Process Group Ranks": ranks,
            "Rank": self.rank, "Seq": seq, "Comms Id": comms_id(seq, self.world),
            "Is asynchronized op": True})
        self.work(B, 4)
        self.runtime(B, "cudaStreamWaitEvent", 147, 2.5)
        after_compute = self.stream_free[COMPUTE_STREAM]  # NCCL's stream waits for the compute so far
        self.begin(B, "nccl:all_reduce", "user_annotation")
        self.work(B, 7)
        api = self.runtime(B, "cuLaunchKernelEx", 652, 9.0, cat="cuda_driver")
        ready = max(api.ts + self.jit(5.0, 0.3), after_compute + 1500, self.stream_free[NCCL_STREAM] + 1000)
        done = yield ready
        self.stream_free[NCCL_STREAM] = done
        name, grid, block, regs, smem = K_NCCL
        bps = grid[0] / NUM_SMS
        rpc = self.stack[B][-2]   # record_param_comms: the innermost cpu_op, what the kernel links to
        args = {"queued": 0, "device": self.dev, "context": 1, "stream": NCCL_STREAM,
                "correlation": api.args["correlation"], "registers per thread": regs, "shared memory": smem,
                "blocks per SM": round(bps, 6), "warps per SM": round(bps * block[0] / 32, 6),
                "grid": list(grid), "block": list(block), "est. achieved occupancy %": 0}
        for k in ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
                  "In split size", "Out split size", "Process Group Name", "Process Group Description",
                  "Process Group Ranks"):
            args[k] = rpc.args[k]
        self._gpu(B, api, "kernel", name, NCCL_STREAM, ready, done - ready, args)
        self.end(B, 5)   # nccl:all_reduce
        self.end(B, 6)   # record_param_comms
        self.end(B, 4)   # c10d::allreduce_

    def step(self, number, straggle_ns, seq):
        """One training iteration, a generator: yields at each all-reduce (see allreduce)."""
        M, B = self.main, self.bwd
        self.work(M, 12)   # the Python loop between iterations
        self.begin(M, f"ProfilerStep#{number}", "user_annotation")
        self.work(M, 4)
        self.begin(M, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation")
        self.work(M, 41)
        self.t[M] += straggle_ns
        self.end(M, 2)
        for node in FORWARD:
            self.run(M, node)
        # loss.backward(): the main thread waits while the engine's device thread runs the graph.
        self.t[B] = max(self.t[B], self.t[M] + self.jit(9))
        for node in BACKWARD_TO_BUCKET0:
            self.run(B, node)
        yield from self.allreduce(0, seq)
        for node in BACKWARD_TO_BUCKET1:
            self.run(B, node)
        yield from self.allreduce(1, seq + 1)
        # Reducer::finalize_backward: the compute stream waits for the all-reduces, then each
        # bucket is copied back into the grads (copy_bucket_to_grad: one DtoD copy per parameter).
        self.work(B, 8)
        self.runtime(B, "cudaStreamWaitEvent", 147, 2.5)
        self.stream_free[COMPUTE_STREAM] = max(self.stream_free[COMPUTE_STREAM],
                                               self.stream_free[NCCL_STREAM] + 1200)
        for node in COPY_BACK:
            self.run(B, node)
        self.t[M] = max(self.t[M], self.t[B] + self.jit(11))
        self.run(M, OPTIMIZER_STEP)
        self.begin(M, "aten::item")
        self.work(M, 2)
        self.begin(M, "aten::_local_scalar_dense")
        self.work(M, 3)
        cp = self.memcpy(M, "Memcpy DtoH (Device -> Pageable)", 4, 1.4, 8)
        sync = self.runtime(M, "cudaStreamSynchronize", 131, 2.0)
        if self.t[M] < cp.ts + cp.dur + 2500:   # the sync returns once the copy has landed
            self.t[M] = cp.ts + cp.dur + 2500
            sync.dur = self.t[M] - sync.ts
        self.end(M, 2)
        self.end(M, 1)
        self.end(M, 3)

    def window(self):
        evs = self.cpu + self.gpu
        self.first = min(e.ts for e in evs)
        self.last = max(e.ts + e.dur for e in evs)


def simulate(world, iterations=3, first_step=FIRST_STEP, straggler=None, seed=0, seq0=SEQ0):
    """Runs the ranks side by side; returns their RankSim objects (local clocks, ns)."""
    xfer = xfer_us(world)
    sims = [RankSim(r, world, seed) for r in range(world)]
    start = [10_000 + s.jit(25, 0.9) for s in sims]   # profiler start: the ranks are a few µs apart
    for s, t in zip(sims, start):
        s.t[s.main] = s.t[s.bwd] = t
    rng = random.Random(seed * 7919 + world)
    for i in range(iterations):
        seq = seq0 + 2 * i
        gens = [s.step(first_step + i, STRAGGLE_NS if (s.rank == straggler and i == 0) else 0, seq)
                for s in sims]
        ready = [next(g) for g in gens]
        bucket = 0
        while ready:
            done = max(ready) + int(xfer[bucket] * 1000 * (1 + rng.uniform(-0.03, 0.03)))
            nxt = []
            for g in gens:
                try:
                    nxt.append(g.send(done))
                except StopIteration:
                    pass
            assert len(nxt) in (0, len(gens)), "ranks disagree on the number of all-reduces"
            ready, bucket = nxt, bucket + 1
    for s in sims:
        s.window()
    return sims


def default_straggler(world):
    return {2: 1, 4: 2}.get(world, world - 1)


# -- writing ---------------------------------------------------------------------------------
def _val(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


def render_event(e, shift_ns, id_shift=0, step_shift=0, seq_shift=0):
    """One event as Kineto writes it, its times shifted into the file's clock; the shifts let a
    repeated block of iterations (bench/make_big_trace.py) carry fresh ids, steps and Seq."""
    name = e.name
    if step_shift and name.startswith("ProfilerStep#"):
        name = "ProfilerStep#%d" % (int(name[13:]) + step_shift)
    pid = json.dumps(e.pid) if isinstance(e.pid, str) else str(e.pid)
    tid = json.dumps(e.tid) if isinstance(e.tid, str) else str(e.tid)
    if e.ph == "X":
        head = ('  {\n    "ph": "X", "cat": "%s", "name": %s, "pid": %s, "tid": %s,\n'
                '    "ts": %s, "dur": %s' % (e.cat, json.dumps(name), pid, tid,
                                             fmt_ns(e.ts + shift_ns), fmt_ns(e.dur)))
        if not e.args:
            return head + "\n  }"
        parts = []
        for k, v in e.args.items():
            if id_shift and k in ("External id", "correlation"):
                v += id_shift
            elif seq_shift and k == "Seq":
                v += seq_shift
            elif seq_shift and k == "Comms Id":
                v = comms_id(e.args["Seq"] + seq_shift, e.args["Group size"])
            parts.append('"%s": %s' % (k, _val(v)))
        return head + ',\n    "args": {\n      ' + ", ".join(parts) + "\n    }\n  }"
    if e.ph in ("s", "f"):
        tail = ', "bp": "e"' if e.ph == "f" else ""
        return ('  {\n    "ph": "%s", "id": %d, "pid": %s, "tid": %s, "ts": %s,\n'
                '    "cat": "ac2g", "name": "ac2g"%s\n  }'
                % (e.ph, e.extra["id"] + id_shift, pid, tid, fmt_ns(e.ts + shift_ns), tail))
    if e.ph == "i":
        return ('  {\n    "ph": "i", "s": "g", "name": %s, "pid": %s, "tid": %s,\n    "ts": %s\n  }'
                % (json.dumps(name), pid, tid, fmt_ns(e.ts + shift_ns)))
    # "M"
    key, value = next(iter(e.args.items()))
    return ('  {\n    "name": "%s", "ph": "M", "ts": %s, "pid": %s, "tid": %s,\n'
            '    "args": {\n      "%s": %s\n    }\n  }'
            % (name, fmt_ns(e.ts + shift_ns), pid, tid, key, _val(value)))


def clock_shift(rank):
    return TS_BASE_NS + rank * TS_PER_RANK_NS


def header(sim, trace_name):
    r, n = sim.rank, sim.world
    base = WALL0_NS + BASE_SKEW_NS[r % len(BASE_SKEW_NS)] - clock_shift(r)
    devices = ",\n    ".join(json.dumps(dict({"id": d}, **DEVICE_PROPERTIES)) for d in range(n))
    dist = {"backend": "nccl", "rank": r, "world_size": n, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": n, "ranks": list(range(n))}],
            "nccl_version": NCCL_VERSION}
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    %s\n  ],\n'
            '  "distributedInfo": %s,\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d,\n'
            '  "traceEvents": [\n' % (devices, json.dumps(dist), base))


def footer(trace_name):
    return '\n  ],\n  "traceName": %s\n}\n' % json.dumps(trace_name)


def frame_events(sim):
    """Metadata, the profiler's own span and instants: everything but the ops."""
    t0, t1 = sim.first - 2000, sim.last + 3000
    ev = [Ev("M", "", "process_name", sim.pid, 0, t0, args={"name": "python3"}),
          Ev("M", "", "process_labels", sim.pid, 0, t0, args={"labels": "CPU"}),
          Ev("M", "", "process_sort_index", sim.pid, 0, t0, args={"sort_index": sim.pid}),
          Ev("M", "", "thread_name", sim.pid, sim.main, t0, args={"name": f"thread {sim.main} (python3)"}),
          Ev("M", "", "thread_name", sim.pid, sim.bwd, t0,
             args={"name": f"thread {sim.bwd} (pt_autograd_{sim.dev})"}),
          Ev("M", "", "process_name", sim.dev, 0, t0, args={"name": "python3"}),
          Ev("M", "", "process_labels", sim.dev, 0, t0, args={"labels": f"GPU {sim.dev}"}),
          Ev("M", "", "process_sort_index", sim.dev, 0, t0, args={"sort_index": 16777216 + sim.dev}),
          Ev("M", "", "thread_name", sim.dev, COMPUTE_STREAM, t0, args={"name": f"stream {COMPUTE_STREAM} "}),
          Ev("M", "", "thread_name", sim.dev, NCCL_STREAM, t0, args={"name": f"stream {NCCL_STREAM} "})]
    trace = Ev("X", "Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", t0, t1 - t0, {"Op count": 0})
    start = Ev("i", "", "Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", t0)
    stop = Ev("i", "", "Record Window End", "", "", t1 + 1000)
    return ev, [trace, start], [stop]


def body_events(sim):
    """The ops in the order Kineto writes them: CPU ops, runtime calls, then GPU activity, then flows."""
    cpu = sorted(sim.cpu, key=lambda e: (e.ts, -e.dur))
    gpu = sorted(sim.gpu + list(sim.gpu_ann.values()), key=lambda e: (e.ts, e.cat != "gpu_user_annotation"))
    return cpu + gpu + sim.flows


def trace_text(sim, trace_name):
    meta, pre, post = frame_events(sim)
    shift = clock_shift(sim.rank)
    events = meta + pre + body_events(sim) + post
    return header(sim, trace_name) + ",\n".join(render_event(e, shift) for e in events) + footer(trace_name)


FIXTURES = [("kineto_nccl_w2", 2, False), ("kineto_nccl_w4", 4, True)]


def fixture_files():
    """{relative path: bytes} for every fixture file."""
    out = {}
    for folder, world, gz in FIXTURES:
        for sim in simulate(world, straggler=default_straggler(world)):
            name = f"rank{sim.rank}.json" + (".gz" if gz else "")
            text = trace_text(sim, f"/tmp/dtlab_trace/{folder}/rank{sim.rank}.json").encode()
            if gz:
                buf = io.BytesIO()
                with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
                    f.write(text)
                text = buf.getvalue()
            out[os.path.join(folder, name)] = text
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files on disk; write nothing")
    ap.add_argument("--out", default=HERE, help="directory that holds the fixture folders")
    a = ap.parse_args(argv)
    stale = []
    for rel, data in sorted(fixture_files().items()):
        path = os.path.join(a.out, rel)
        if a.check:
            try:
                with open(path, "rb") as f:
                    same = f.read() == data
            except OSError:
                same = False
            if not same:
                stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: {len(data)} bytes")
    if stale:
        print("out of date: " + ", ".join(stale) + " (run tests/data/traces/make_kineto_fixture.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
