#!/usr/bin/env python3
"""PyTorch reference for bench/bench_ddp.cpp: DistributedDataParallel on gloo, one process per rank on
localhost, the same MLP (nn.Sequential), per-rank batch, optimizer (AdamW, lr 0.01) and bucket caps,
one intra-op thread per process. Prints one JSON line: global samples/s from the median step time.

Usage: torch_ddp.py [--model mlp:256,1024,1024,10] [--world 4] [--batch 64] [--steps 40] [--warmup 5]
                    [--bucket-cap-mb 25] [--first-bucket-mb 1]
Without torch (or torch.distributed with gloo) it prints {"skipped": "..."} and exits 77.
"""
import argparse, json, os, socket, sys, tempfile, time

# OpenBLAS and OpenMP size their pools when torch is imported, and spawned ranks inherit the
# environment: set both before the import so every rank really computes on one thread, like a
# dtlab rank with --threads 1 (torch.set_num_threads alone does not bound OpenBLAS's pool).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SKIP = 77


def skip(reason):
    print(json.dumps({"skipped": reason}), flush=True)
    sys.exit(SKIP)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp:256,1024,1024,10")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--steps", type=int, default=40, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    a = ap.parse_args()
    if not a.model.startswith("mlp:"):
        ap.error(f"--model {a.model} is not an mlp:D0,...,Dk spec")
    a.dims = [int(d) for d in a.model[4:].split(",")]
    if len(a.dims) < 2 or min(a.dims) < 1 or a.world < 1 or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--model needs two or more positive widths; --world, --batch and --steps at least 1")
    return a


def build_model(torch, dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def worker(rank, a, port, out_path):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world)
    # DDP reads the first bucket's cap from this module global (documented in distributed.py);
    # setting it lets a small-cap run split the model exactly as dtlab's --first-bucket-mb does.
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * 1024 * 1024)
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    model = DDP(build_model(torch, a.dims), bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    # Synthetic per-rank batches of the bench's shape, made up front so the timed loop only trains.
    # Random labels keep the loss near ln K: a loss that underflows brings denormal arithmetic, which
    # would time the data rather than DDP (bench_ddp.cpp's dtlab data is chosen the same way).
    g = torch.Generator().manual_seed(1000 + rank)
    D, K = a.dims[0], a.dims[-1]
    batches = [(torch.randn(a.batch, D, generator=g), torch.randint(0, K, (a.batch,), generator=g))
               for _ in range(16)]
    times = []
    dist.barrier()
    t_begin = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            dist.barrier()
            t_begin = time.perf_counter()
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP's all-reduces overlap this; it returns once every bucket is averaged
        opt.step()
        last_loss = loss.item()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    wall = time.perf_counter() - t_begin
    if rank == 0:
        timed = sorted(times[a.warmup:])
        med = timed[len(timed) // 2]
        with open(out_path, "w") as f:
            json.dump({"torch": torch.__version__, "world": a.world, "batch": a.batch, "steps": a.steps,
                       "median_ms": 1e3 * med, "min_ms": 1e3 * timed[0],
                       "samples_per_sec": a.world * a.batch / med,
                       "samples_per_sec_wall": a.world * a.batch * a.steps / wall,
                       "bucket_cap_mb": a.bucket_cap_mb, "first_bucket_mb": a.first_bucket_mb,
                       "last_loss": last_loss}, f)
    dist.destroy_process_group()


def main():
    a = parse_args()
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        skip(f"/usr/bin/python3 has no torch ({e}); apt-get install python3-torch")
    if not dist.is_available() or not dist.is_gloo_available():
        skip(f"torch {torch.__version__} was built without torch.distributed gloo")
    # A free port: bind to port 0 and release it; the ranks rendezvous on it right after.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "torch_ddp.json")
        mp.spawn(worker, args=(a, port, out_path), nprocs=a.world, join=True)
        with open(out_path) as f:
            print(json.dumps(json.load(f)), flush=True)


if __name__ == "__main__":
    main()
