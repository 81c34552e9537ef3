#!/usr/bin/env python3
"""DDP communication hooks against PyTorch (run by CTest; exits 77 = skipped when torch is absent).

`dtlab-cli train --strategy ddp --world 2 --comm-hook fp16` against torch's DistributedDataParallel
on 2 processes (gloo) with `register_comm_hook(None, fp16_compress_hook)`
(torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py; docs/course_sources.md §6e): the
same seed, data, DistributedSampler shards and SGD give the same per-step losses and parameters.
PyTorch 1.13 refuses bf16_compress_hook off CUDA and gloo has no bfloat16, so `--comm-hook bf16` is
held to the hook's own steps written out in torch (cast to bfloat16, divide by the world size, sum,
cast back): two bfloat16 values add exactly in float32, so their float32 sum rounded once to
bfloat16 is the 16-bit all-reduce's. `--comm-hook topk:ratio=0.1` is held to the same algorithm
written as a torch DDP hook (class TopK). `--comm-hook powersgd:rank=R,start=S` is held to torch's own
powerSGD_hook with PowerSGDState(matrix_approximation_rank=R, start_powerSGD_iter=S) and its other
defaults (error feedback, warm start, random_seed 0), within 1e-4: the factors' sums and torch's
vectorised randn differ from dtlab's in the last bits; `powersgd:rank=1,start=2,error_feedback=false`
to PowerSGDState(use_error_feedback=False) the same way. Each is also held apart from the plain run,
and the run without error feedback apart from the one with it.
Usage: comm_hook_torch.py PATH/TO/dtlab-cli
"""
import datetime, json, math, os, socket, sys, tempfile, time

from torch_common import check, cli, failures, load_safetensors, np, sequential, torch  # noqa: F401 (exits 77 without torch)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd  # noqa: E402

DIMS, BATCH, STEPS, SEED, WORLD = [4, 16, 16, 3], 16, 20, 3, 2
TOPK = "topk:ratio=0.1"  # 10% of each bucket's entries per rank
PSGD1, PSGD2 = "powersgd:rank=1,start=2", "powersgd:rank=2,start=3"  # Q of 4 entries (torch's scalar randn) and of 16
PSGD1_NOEF = PSGD1 + ",error_feedback=false"  # PowerSGDState(use_error_feedback=False)


def bf16_written_out(process_group, bucket):
    """bf16_compress_hook's steps, with the sum taken in float32 (gloo has no bfloat16)."""
    compressed = bucket.buffer().to(torch.bfloat16).div_(WORLD)
    wide = compressed.float()
    fut = dist.all_reduce(wide, async_op=True).get_future()

    def decompress(fut):
        out = bucket.buffer()
        out.copy_(fut.value()[0].to(torch.bfloat16))
        return out
    return fut.then(decompress)


class TopK:
    """Top-k sparsification with error feedback (Stich, Cordonnier and Jaggi 2018, "Sparsified SGD
    with Memory"), written as a DDP comm hook: the remembered error (per parameter, in gradient units)
    added to the bucket, the ceil(ratio n) entries of largest magnitude kept (the lower index on a
    tie), the rest remembered, the kept values and int64 indices all-gathered, every rank's entries
    added into a zeroed bucket in rank order, divided by the world size."""

    def __init__(self, ratio):
        self.ratio, self.error = ratio, {}

    def __call__(self, bucket):
        buf, params = bucket.buffer(), bucket.parameters()
        errs = [self.error.get(id(p), torch.zeros(p.numel())) for p in params]
        acc = buf + torch.cat(errs)
        n = acc.numel()
        k = min(n, max(1, math.ceil(self.ratio * n)))
        kept = torch.sort(torch.sort(-acc.abs(), stable=True).indices[:k]).values
        values = acc[kept].clone()
        acc[kept] = 0
        at = 0
        for p in params:
            self.error[id(p)] = acc[at:at + p.numel()].clone()
            at += p.numel()
        all_values = [torch.empty(k) for _ in range(WORLD)]
        all_indices = [torch.empty(k, dtype=torch.int64) for _ in range(WORLD)]
        dist.all_gather(all_values, values)
        dist.all_gather(all_indices, kept)
        out = torch.zeros(n)
        for v, i in zip(all_values, all_indices):
            out.index_add_(0, i, v)
        buf.copy_(out / WORLD)
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut


def topk_hook(state, bucket):  # DDP passes the state registered with the hook
    return state(bucket)


def rank_main(rank, port, hooks, data, outdir):
    """Every hook's run, one after another in the same 2 processes (one torch start-up for all)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    # Every gloo call fails after 60 s instead of waiting forever (the caller retries the runs once).
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    for hook in hooks:
        run_hook(rank, hook, data, os.path.join(outdir, ref_name(hook)))
        dist.barrier()
    dist.destroy_process_group()


def ref_name(hook):
    return f"{hook.replace(':', '_')}.pt"


def run_hook(rank, hook, data, out):
    torch.manual_seed(SEED)
    model = torch.nn.parallel.DistributedDataParallel(sequential(DIMS))
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, bf16_written_out)
    elif hook.startswith("topk:ratio="):
        model.register_comm_hook(TopK(float(hook.split("=")[1])), topk_hook)
    elif hook.startswith("powersgd:"):
        args = dict(kv.split("=") for kv in hook.split(":")[1].split(","))
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(args["rank"]),
                                       start_powerSGD_iter=int(args["start"]),
                                       use_error_feedback=args.get("error_feedback", "true") == "true")
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    z = np.load(data)
    ds = torch.utils.data.TensorDataset(torch.from_numpy(z["x"]), torch.from_numpy(z["y"]))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=SEED)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=sampler)
    losses, epoch = [], 0
    while len(losses) < STEPS:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / WORLD)
            if len(losses) == STEPS:
                break
        epoch += 1
    if rank == 0:
        torch.save({"losses": losses, "state": model.module.state_dict()}, out)


def spawn_bounded(fn, args, limit_s=90):
    """mp.spawn with a wall-clock limit: gloo's own timeout does not cover every wait (a rank left
    connected nowhere after another process took the port), so a run past `limit_s` is killed and
    raised as a failure, which the caller retries once."""
    ctx = mp.start_processes(fn, args=args, nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise RuntimeError(f"torch's ranks ran past {limit_s} s; killed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        n = 200
        x = rng.standard_normal((n, DIMS[0])).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
        data = os.path.join(tmp, "d.npz")
        np.savez(data, x=x, y=y)
        spec = "mlp:" + ",".join(map(str, DIMS))
        finals = {}
        hooks = ("none", "fp16", "bf16", TOPK, PSGD1, PSGD2, PSGD1_NOEF)
        for attempt in (1, 2):  # a run that failed (a port taken, a gloo timeout) gets one more try
            try:
                spawn_bounded(rank_main, (free_port(), hooks, data, tmp), limit_s=180)
                break
            except Exception as e:  # noqa: BLE001 (torch.multiprocessing raises its own kinds)
                print(f"torch's runs of the hooks failed (attempt {attempt}): {e}")
                if attempt == 2:
                    raise
        for hook in hooks:
            ckpt = os.path.join(tmp, f"{hook.replace(':', '_')}.safetensors")
            out = cli("train", "--model", spec, "--data", data, "--strategy", "ddp", "--world", WORLD, "--batch", BATCH,
                      "--steps", STEPS, "--seed", SEED, "--threads", 1, "--optimizer", "sgd", "--lr", 0.05, "--momentum", 0.9,
                      "--comm-hook", hook, "--save", ckpt, "--json")
            ours = [json.loads(l)["loss"] for l in out.splitlines() if '"step"' in l]
            ref = os.path.join(tmp, ref_name(hook))
            theirs = torch.load(ref)
            what = {"none": "plain DDP", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook's steps",
                    TOPK: "a top-k hook with error feedback", PSGD1: "powerSGD_hook (rank 1, from iteration 2)",
                    PSGD2: "powerSGD_hook (rank 2, from iteration 3)",
                    PSGD1_NOEF: "powerSGD_hook (rank 1, from iteration 2, use_error_feedback=False)"}[hook]
            tol = 1e-4 if hook.startswith("powersgd") else 1e-5
            loss_diff = max(abs(a - b) for a, b in zip(ours, theirs["losses"])) if len(ours) == STEPS else float("inf")
            check(loss_diff < tol, f"--comm-hook {hook}: {STEPS} per-step losses equal torch's DDP with {what} "
                                   f"(max abs diff {loss_diff:.2e})")
            sd = load_safetensors(ckpt)
            param_diff = max((sd[k] - v).abs().max().item() for k, v in theirs["state"].items())
            check(param_diff < tol, f"--comm-hook {hook}: parameters after {STEPS} steps equal torch's (max abs diff {param_diff:.2e})")
            finals[hook] = sd
        # The hooks round: their runs are not the plain one (the comparisons above could not pass by
        # ignoring the flag).
        for hook in ("fp16", "bf16", TOPK, PSGD1, PSGD2, PSGD1_NOEF):
            apart = max((finals[hook][k] - v).abs().max().item() for k, v in finals["none"].items())
            check(apart > 1e-6, f"--comm-hook {hook}: the run differs from plain DDP's (by {apart:.2e}): the hook acted")
        apart = max((finals[PSGD1_NOEF][k] - v).abs().max().item() for k, v in finals[PSGD1].items())
        check(apart > 1e-4, f"--comm-hook {PSGD1_NOEF}: the run differs from the one with error feedback (by {apart:.2e})")
    print(f"{'FAILED' if failures else 'passed'}: DDP comm hooks against torch ({len(failures)} failures), torch {torch.__version__}")
    sys.exit(1 if failures else 0)
