#!/usr/bin/env python3
"""Record per-rank PyTorch profiler traces of a small DDP run, for dtlab's trace importer.

Usage: tools/record_torch_trace.py --out DIR [--world 2] [--backend gloo|nccl] [--device cpu|cuda]
                                   [--format legacy|kineto] [--iterations 3] [--warmup 2] [--gzip]

One process per rank (torch.multiprocessing.spawn) on localhost trains dtlab's "mlp:2,512,512,3"
(nn.Sequential(Linear(2,512), ReLU(), Linear(512,512), ReLU(), Linear(512,3))) under
DistributedDataParallel with bucket_cap_mb=25 passed (the default's value): batch 32 per rank, SGD
lr 0.1, torch.manual_seed(0), each rank's data seeded by its rank. --warmup iterations run
unprofiled first, so that DDP has rebuilt its buckets (iteration 1 all-reduces the whole model as
one bucket; from iteration 2 on torch 1.13 has two: 4.*, 2.bias, 2.weight, capped by the 1 MiB first
bucket, then 0.*; torch 2.11, whose first bucket takes the given cap, keeps one), then
--iterations iterations are profiled. Writes DIR/rank{R}.json (DIR/rank{R}.json.gz with --gzip), one
Chrome trace per rank, and DIR/dtlab.json saying what ran (with DDP's own record of its bucket
sizes, and the first bucket's cap this torch used: 1 MiB, or the cap where it takes the given
bucket_cap_mb for the first bucket too, as torch 2.11 does).

Formats (docs/trace_formats.md describes both field by field):
- legacy: torch.autograd.profiler.profile(use_kineto=False), the only profiler a torch built without
  Kineto has (Debian's python3-torch 1.13). Its export is a bare JSON list of "X" events with no
  rank, no sizes and no step marks. torch.profiler writes a "ProfilerStep#N" annotation around each
  step itself; the legacy profiler has no steps, so this script mimics it: each profiled iteration
  runs inside torch.autograd.profiler.record_function("ProfilerStep#N").
- kineto: torch.profiler.profile (needs a torch built with Kineto, e.g. a CUDA build), activities
  CPU (+ CUDA on the GPU), with a schedule so that the profiler writes "ProfilerStep#N" itself
  (without a schedule torch.profiler records no step marks); export_chrome_trace per rank, which
  adds "distributedInfo" {backend, rank, world_size, ...}.
Devices: nccl puts one rank per GPU (cuda:R). gloo runs on the CPU unless --device cuda, which puts the
model and batches on GPU rank % (GPUs there), so that several gloo ranks can share one GPU (gloo
all-reduces CUDA tensors through host memory; NCCL refuses two ranks on one device); with kineto the
GPU's kernels and copies are then recorded too.
In both formats N is the iteration's index in the run (0-based, warm-up included), so the profiled
iterations are ProfilerStep#W .. ProfilerStep#W+I-1 for --warmup W and --iterations I.
"""
import argparse, gzip, json, os, shutil, socket, sys, tempfile, time

# One intra-op thread per rank (set before torch is imported; spawned ranks inherit it), so the
# ranks do not fight over the cores and the traces show one compute thread each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

MODEL = "mlp:2,512,512,3"
DIMS = [2, 512, 512, 3]   # input features .. classes, as in MODEL
BATCH = 32
LR = 0.1
BUCKET_CAP_MB = 25


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="where the model runs (default: cuda with nccl, cpu with gloo)")
    ap.add_argument("--format", choices=("legacy", "kineto"), default="legacy")
    ap.add_argument("--iterations", type=int, default=3, help="profiled iterations (default 3)")
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled iterations first (default 2)")
    ap.add_argument("--gzip", action="store_true", help="write rank{R}.json.gz")
    a = ap.parse_args(argv)
    if a.world < 1 or a.world > 64:
        ap.error(f"--world {a.world} is not between 1 and 64.")
    if a.iterations < 1:
        ap.error(f"--iterations {a.iterations} must be at least 1.")
    if a.warmup < 0:
        ap.error(f"--warmup {a.warmup} must be 0 or more.")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        ap.error(f"torch cannot be imported here ({e}); run this with a Python that has torch.")
    if not dist.is_available():
        ap.error("this torch was built without torch.distributed.")
    if a.backend == "gloo" and not dist.is_gloo_available():
        ap.error("--backend gloo: this torch was built without gloo.")
    if a.device is None:
        a.device = "cuda" if a.backend == "nccl" else "cpu"
    if a.backend == "nccl" and a.device != "cuda":
        ap.error("--backend nccl runs on the GPU: drop --device cpu, or use --backend gloo.")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA build of torch and a GPU; this torch sees none.")
    if a.backend == "nccl":
        if not dist.is_nccl_available() or not torch.cuda.is_available():
            ap.error("--backend nccl needs a CUDA build of torch with NCCL and a GPU.")
        if torch.cuda.device_count() < a.world:
            ap.error(f"--backend nccl puts one rank per GPU: --world {a.world} needs {a.world} GPUs, "
                     f"this machine has {torch.cuda.device_count()}.")
    if a.format == "kineto":
        kineto = getattr(torch.autograd, "kineto_available", lambda: False)()
        if not kineto:
            ap.error(f"--format kineto needs a torch built with Kineto; torch {torch.__version__} here "
                     "has none (use --format legacy).")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out} exists and is not a directory.")
    return a


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(torch):
    nn = torch.nn   # dtlab's "mlp:2,512,512,3"
    return nn.Sequential(nn.Linear(2, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))


def trace_path(out, rank, gz):
    return os.path.join(out, f"rank{rank}.json" + (".gz" if gz else ""))


def write_trace(export, path, gz):
    """export(p) writes a plain JSON trace to p; gzip it into path when asked."""
    if not gz:
        export(path)
        return
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=os.path.dirname(path))
    os.close(fd)
    try:
        export(tmp)
        # mtime=0: the same trace gives the same bytes.
        with open(tmp, "rb") as fin, open(path, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fout:
            shutil.copyfileobj(fin, fout)
    finally:
        os.remove(tmp)


def worker(rank, a, port, result_dir):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=a.world)
    cuda = a.device == "cuda"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters at construction anyway
    model = build_model(torch).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)  # per-rank data
    total = a.warmup + a.iterations
    batches = [(torch.randn(BATCH, DIMS[0], generator=g),
                torch.randint(0, DIMS[-1], (BATCH,), generator=g)) for _ in range(total)]

    def step(i):
        x, y = batches[i]
        if cuda:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(device)

    out = trace_path(a.out, rank, a.gzip)
    if a.format == "legacy":
        from torch.autograd.profiler import profile, record_function
        for i in range(a.warmup):
            step(i)
        dist.barrier()
        with profile(use_kineto=False) as prof:
            for i in range(a.warmup, total):
                # torch.profiler writes this annotation itself; the legacy profiler has no steps.
                with record_function(f"ProfilerStep#{i}"):
                    step(i)
            # A gloo worker closes its "gloo:all_reduce" span only after it has completed the
            # work's future, so the main thread can get here first; if the profiler stopped now,
            # the last span could be lost (seen on a loaded machine). Give the workers a moment.
            time.sleep(0.05)
        write_trace(prof.export_chrome_trace, out, a.gzip)
    else:
        from torch.profiler import ProfilerActivity, profile, schedule
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        # The profiler's step k is iteration k of the run, so ProfilerStep#k names it. A schedule
        # is what makes torch.profiler write ProfilerStep#N at all: skip the warm-up iterations but
        # the last, which is the profiler's own warm-up step (not recorded), then record the
        # profiled iterations once (repeat=1).
        warm = 1 if a.warmup > 0 else 0
        sched = schedule(skip_first=a.warmup - warm, wait=0, warmup=warm, active=a.iterations,
                         repeat=1)
        if a.warmup == 0:
            dist.barrier()
        # With gloo, the last "gloo:all_reduce" span can be lost if the profiler stops before the
        # worker thread closes it (see the legacy branch); with nccl the kernels come from CUPTI.
        with profile(activities=acts, schedule=sched) as prof:
            for i in range(total):
                if a.warmup > 0 and i == a.warmup - 1:
                    dist.barrier()  # in the profiler's warm-up step: not recorded
                step(i)
                prof.step()
        write_trace(prof.export_chrome_trace, out, a.gzip)

    # What DDP did, for the summary line: its bucket sizes (bytes) at construction and after the rebuild.
    info = {"rank": rank}
    # The first bucket's cap after the rebuild, as this torch chose it: 1 MiB
    # (dist._DEFAULT_FIRST_BUCKET_BYTES), or the cap itself where bucket_cap_mb was given and this torch
    # records that (bucket_bytes_cap_default False; torch 1.13 has no such attribute: always 1 MiB).
    explicit = getattr(ddp, "bucket_bytes_cap_default", True) is False
    first = ddp.bucket_bytes_cap if explicit else dist._DEFAULT_FIRST_BUCKET_BYTES
    info["first_bucket_mb"] = first / 1048576
    try:
        logging = ddp._get_ddp_logging_data()
        info["bucket_sizes"] = logging.get("bucket_sizes")
        info["rebuilt_bucket_sizes"] = logging.get("rebuilt_bucket_sizes")
    except Exception as e:  # private API: informative only
        info["ddp_logging_error"] = str(e)
    with open(os.path.join(result_dir, f"rank{rank}.info.json"), "w") as f:
        json.dump(info, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    a = parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    os.makedirs(a.out, exist_ok=True)
    for r in range(a.world):  # stale files from another run would read as extra ranks
        for ext in (".json", ".json.gz"):
            p = os.path.join(a.out, f"rank{r}{ext}")
            if os.path.exists(p):
                os.remove(p)
    with tempfile.TemporaryDirectory() as result_dir:
        mp.spawn(worker, args=(a, free_port(), result_dir), nprocs=a.world, join=True)
        infos = []
        for r in range(a.world):
            with open(os.path.join(result_dir, f"rank{r}.info.json")) as f:
                infos.append(json.load(f))

    cmd = ["tools/record_torch_trace.py", "--world", str(a.world), "--out", a.out,
           "--backend", a.backend, "--device", a.device, "--format", a.format, "--iterations", str(a.iterations),
           "--warmup", str(a.warmup)] + (["--gzip"] if a.gzip else [])
    meta = {"model": MODEL, "batch": BATCH, "world": a.world, "bucket_cap_mb": BUCKET_CAP_MB,
            "backend": a.backend, "device": a.device, "format": a.format, "torch": torch.__version__,
            "first_bucket_mb": infos[0]["first_bucket_mb"],
            "bucket_sizes": infos[0].get("bucket_sizes"),
            "rebuilt_bucket_sizes": infos[0].get("rebuilt_bucket_sizes"),
            "iterations": a.iterations, "warmup": a.warmup, "recorded_with": " ".join(cmd)}
    with open(os.path.join(a.out, "dtlab.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    info = infos[0]
    print(json.dumps({"out": a.out, "files": [os.path.basename(trace_path(a.out, r, a.gzip))
                                             for r in range(a.world)],
                      "bucket_sizes": info.get("bucket_sizes"),
                      "rebuilt_bucket_sizes": info.get("rebuilt_bucket_sizes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
