#!/usr/bin/env python3
"""DDP's buckets, iteration by iteration, in torch and in dtlab (optional CTest `ddp_buckets_torch`).

Runs torch.nn.parallel.DistributedDataParallel on 2 gloo ranks with the model dtlab calls
mlp:2,512,512,512,3, records the bytes of every bucket all-reduce per iteration through a comm
hook, and compares them with the 'DDP bucket N' spans of `dtlab-cli train --trace` for the same
settings:
  - find_unused_parameters=False: iteration 1 all-reduces ONE bucket of every gradient; the
    rebuild after it gives sized buckets in gradient-ready order;
  - find_unused_parameters=True: the sized assignment from the start, never rebuilt;
  - an explicit bucket_cap_mb.
Then a layer the forward skips on every rank: torch raises "Expected to have finished reduction in
the prior iteration" at the next forward (no hang), and so must dtlab.

Usage: ddp_buckets_torch.py PATH/TO/dtlab-cli. Exit 77 (skip) without torch.
"""
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    print("skip: torch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

CLI = sys.argv[1] if len(sys.argv) > 1 else ""
DIMS = [2, 512, 512, 512, 3]
ITERATIONS = 3


def sequential(skip=None):
    layers = []
    for i in range(len(DIMS) - 1):
        layers.append(torch.nn.Linear(DIMS[i], DIMS[i + 1]))
        if i < len(DIMS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Branchy(torch.nn.Module):
    """The Sequential, but iteration 2 (1-based) bypasses Linear 2 and its ReLU, as --skip-layer 2."""

    def __init__(self):
        super().__init__()
        self.seq = sequential()
        self.skip = False

    def forward(self, x):
        for i, m in enumerate(self.seq):
            if self.skip and i in (2, 3):
                continue
            x = m(x)
        return x


def run_case(kwargs, mode):
    """One DDP run of ITERATIONS iterations: its bucket log, and the error that ended it ("" if none)."""
    torch.manual_seed(0)
    model = Branchy() if mode == "skip" else sequential()
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    log = []
    it = [0]

    def hook(state, bucket):
        log.append([it[0], bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size()])
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    x = torch.randn(16, DIMS[0])
    error = ""
    try:
        for i in range(ITERATIONS):
            it[0] = i
            if mode == "skip":
                model.skip = i == 1
            ddp(x).sum().backward()
    except RuntimeError as e:
        error = str(e).split("\n")[0]
    return {"log": log, "error": error, "error_iteration": it[0]}


def worker(rank, world, port, cases, out):
    """Every case, one after another in the same 2 processes (one torch start-up for all); a case that
    ends in an error (the skipped layer's) must come last: its reduction is left abandoned."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results = []
    for kwargs, mode in cases:
        results.append(run_case(kwargs, mode))
        if results[-1]["error"]:
            break
        dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    # Leave without tearing gloo down: its teardown can stall (or abort, with an abandoned reduction).
    sys.stdout.flush()
    os._exit(0)


def torch_run(cases):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.json")
        with socket.socket() as sock:  # a free port for this run's rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(worker, args=(2, port, cases, out), nprocs=2, join=True)
        with open(out) as f:
            return json.load(f)


def torch_cases(cases):
    """torch_run in a fresh interpreter, its own session, so a stalled run's spawned ranks are ended
    with it, not left spinning."""
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--torch-cases", json.dumps(cases)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise SystemExit(f"torch's runs {cases} took more than 180 s (gloo stalled); its processes were ended")
    if p.returncode != 0:
        raise SystemExit(f"torch's runs {cases} failed: {err[-2000:]}")
    results = json.loads(out.strip().splitlines()[-1])
    if len(results) != len(cases):
        raise SystemExit(f"torch's runs {cases}: only {len(results)} came back ({results[-1]['error'] if results else ''})")
    return results


def per_iteration(log):
    """[[bytes of bucket 0, bucket 1, ...] per iteration]."""
    its = [[] for _ in range(ITERATIONS)]
    for i, b, nbytes in log:
        its[i].append((b, nbytes))
    return [[n for _, n in sorted(x)] for x in its]


def dtlab_run(flags):
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "t.json")
        cmd = [CLI, "train", "--strategy", "ddp", "--world", "2", "--model", "mlp:" + ",".join(map(str, DIMS)),
               "--batch", "16", "--steps", str(ITERATIONS), "--trace", trace] + flags
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, DTLAB_DEVICE="cpu"))
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    its = [[] for _ in range(ITERATIONS)]
    for e in events:
        if e.get("pid") == 0 and e.get("ph") == "X" and e.get("name", "").startswith("DDP bucket "):
            its[e["args"]["iteration"]].append((e["args"]["bucket"], e["args"]["bytes"]))
    return [[n for _, n in sorted(x)] for x in its]


def check(ok, what, failures):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def main():
    failures = []
    CASES = [
        ("find_unused_parameters=False (torch's default)", {}, []),
        ("find_unused_parameters=True", {"find_unused_parameters": True}, ["--find-unused-parameters"]),
        ("bucket_cap_mb=1 given explicitly", {"bucket_cap_mb": 1}, ["--bucket-cap-mb", "1"]),
    ]
    # torch's runs of every case in one start-up, the skipped layer's last (it ends in an error).
    theirs = torch_cases([[kwargs, "plain"] for _, kwargs, _ in CASES] + [[{}, "skip"]])
    for (name, kwargs, flags), run in zip(CASES, theirs):
        want = per_iteration(run["log"])
        got = dtlab_run(flags)
        check(got == want, f"{name}: bucket bytes per iteration, torch {want}, dtlab {got}", failures)
        if not kwargs.get("find_unused_parameters"):
            check(len(want[0]) == 1 and len(want[1]) > 1, f"{name}: one bucket in iteration 1, sized buckets after the rebuild", failures)

    skipped = theirs[-1]
    check("Expected to have finished reduction in the prior iteration" in skipped["error"] and skipped["error_iteration"] == 2,
          f"torch: a layer skipped on every rank in iteration 2 raises at iteration 3's forward ({skipped['error'][:80]!r})", failures)
    p = subprocess.run([CLI, "train", "--strategy", "ddp", "--world", "2", "--model", "mlp:" + ",".join(map(str, DIMS)),
                        "--batch", "16", "--steps", "4", "--skip-layer", "2", "--skip-every", "2", "--timeout", "60"],
                       capture_output=True, text=True, env=dict(os.environ, DTLAB_DEVICE="cpu"))
    check(p.returncode != 0 and "expected to have finished reduction in the prior iteration" in p.stderr and "watchdog" not in p.stderr,
          f"dtlab: the same run fails at once with torch's error, not a watchdog timeout ({p.stderr.strip()[:100]!r})", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-cases":
        print(json.dumps(torch_run(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
