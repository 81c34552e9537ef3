#!/usr/bin/env python3
"""dtlab's ring all-reduce beside PyTorch gloo's all_reduce: same world size, same sizes, same machine.

Usage: bench/gloo_allreduce.py [--cli build/bin/dtlab-cli] [--world 4] [--min-bytes 1024] [--max-bytes 67108864]
Runs `dtlab-cli bench collectives --json`, then the same sweep with torch.distributed (gloo, one
process per rank on localhost), and prints both bus bandwidths (nccl-tests factor 2(n-1)/n) and
their ratio. Without torch it prints dtlab's figures and says why gloo is missing.
"""
import argparse, json, os, socket, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
here = os.path.dirname(os.path.abspath(__file__))
ap.add_argument("--cli", default=os.path.join(here, "..", "build", "bin", "dtlab-cli"))
ap.add_argument("--world", type=int, default=4)
ap.add_argument("--min-bytes", type=int, default=1024)
ap.add_argument("--max-bytes", type=int, default=64 << 20)
ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
ap.add_argument("--out", default="", help=argparse.SUPPRESS)
args = ap.parse_args()


def sizes():
    s, out = args.min_bytes, []
    while s <= args.max_bytes:
        out.append(s // 4 * 4)
        s *= 2
    return out


def worker():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world)
    rows = []
    for S in sizes():
        t = torch.ones(S // 4)
        iters = max(5, min(200, (256 << 20) // S))
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dist.barrier()
        dt = (time.perf_counter() - t0) / iters
        rows.append({"size": S, "time_us": dt * 1e6})
    if args.rank == 0:
        json.dump(rows, open(args.out, "w"))
    dist.destroy_process_group()


if args.worker:
    worker()
    sys.exit(0)

n = args.world
factor = 2 * (n - 1) / n
ours = json.loads(subprocess.run([args.cli, "bench", "collectives", "--op", "allreduce", "--world", str(n),
                                  "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--json"],
                                 check=True, capture_output=True, text=True).stdout)
gloo = None
try:
    import torch  # noqa: F401
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gloo.json")
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--rank", str(r), "--port", str(port),
                                   "--world", str(n), "--min-bytes", str(args.min_bytes),
                                   "--max-bytes", str(args.max_bytes), "--out", out]) for r in range(n)]
        if any(p.wait(timeout=900) != 0 for p in procs):
            sys.exit("gloo workers failed")
        gloo = {r["size"]: r for r in json.load(open(out))}
except ImportError:
    print("# gloo not measured: /usr/bin/python3 has no torch (apt-get install python3-torch)")

print(f"# all_reduce, world {n}: dtlab threads backend (ring) vs PyTorch gloo (one process per rank)")
print(f"# single-thread memcpy in dtlab's run: {ours['memcpy_gbps']:.2f} GB/s; busbw = algbw * 2(n-1)/n")
print(f"#{'size':>12} {'dtlab us':>10} {'dtlab busbw':>12} {'gloo us':>10} {'gloo busbw':>11} {'ratio':>7}")
for row in ours["rows"]:
    S = row["size"]
    line = f" {S:>12} {row['time_us']:>10.1f} {row['busbw']:>12.3f}"
    if gloo and S in gloo:
        g = gloo[S]["time_us"]
        gbus = S / (g * 1e-6) / 1e9 * factor
        line += f" {g:>10.1f} {gbus:>11.3f} {row['busbw'] / gbus:>6.2f}x"
    print(line)
