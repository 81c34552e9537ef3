#!/usr/bin/env python3
"""--amp against torch.autocast (run by CTest; exits 77 = skipped when torch is absent).

`dtlab-cli train --amp bf16` is PyTorch's usual 16-bit training: float32 parameters, gradients and
optimizer state, each Linear on bfloat16 casts of its input, weight and bias under
`torch.autocast("cpu", dtype=torch.bfloat16)` (docs/course_sources.md §6e), ReLU on the bfloat16
activations, the loss in float32. Here dtlab runs it alone and under DDP (2 ranks, every all-reduce
float32) against torch's single process with the same seed, data, batches and SGD: per-step losses
and final parameters within bf16's rounding (rtol 1.6e-2, torch.testing's), and apart from the fp32
run (the casts act). The parameters torch saves are float32, as dtlab's checkpoint is.
Usage: amp_torch.py PATH/TO/dtlab-cli
"""
import json, os, sys, tempfile

from torch_common import check, cli, failures, load_safetensors, np, sequential, torch  # noqa: F401 (exits 77 without torch)

DIMS, BATCH, STEPS, SEED = [4, 32, 32, 3], 32, 20, 5


def torch_run(data, amp, batch):
    torch.manual_seed(SEED)
    model = sequential(DIMS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    z = np.load(data)
    ds = torch.utils.data.TensorDataset(torch.from_numpy(z["x"]), torch.from_numpy(z["y"]))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    losses = []
    for xb, yb in torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if len(losses) == STEPS:
            break
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(1)
        n = BATCH * STEPS  # one epoch: every step a fresh slice of the permutation
        x = rng.standard_normal((n, DIMS[0])).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
        data = os.path.join(tmp, "d.npz")
        np.savez(data, x=x, y=y)
        spec = "mlp:" + ",".join(map(str, DIMS))
        ref, ref_sd = torch_run(data, True, BATCH)
        _, fp32_sd = torch_run(data, False, BATCH)
        for strategy, world in (("single", 1), ("ddp", 2)):
            ckpt = os.path.join(tmp, f"{strategy}.safetensors")
            args = ["train", "--model", spec, "--data", data, "--strategy", strategy, "--batch", BATCH // world, "--steps", STEPS,
                    "--seed", SEED, "--threads", 1, "--optimizer", "sgd", "--lr", 0.1, "--amp", "bf16", "--save", ckpt, "--json"]
            if world > 1:
                args += ["--world", world]
            out = cli(*args)
            ours = [json.loads(l)["loss"] for l in out.splitlines() if '"step"' in l]
            what = f"--amp bf16 --strategy {strategy}" + (f" --world {world}" if world > 1 else "")
            if strategy == "single":  # DDP's shards are DistributedSampler's, not this one permutation
                worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(ours, ref)) if len(ours) == STEPS else float("inf")
                check(worst < 1.6e-2, f"{what}: {STEPS} per-step losses equal torch.autocast(bf16)'s within bf16's rtol "
                                      f"(largest relative difference {worst:.2e})")
            sd = load_safetensors(ckpt)
            check(all(sd[k].dtype == torch.float32 for k in sd), f"{what}: the saved parameters are float32")
            if strategy == "single":
                diff = max(((sd[k] - v).abs() / (v.abs() + 1e-2)).max().item() for k, v in ref_sd.items())
                apart = max((sd[k] - v).abs().max().item() for k, v in fp32_sd.items())
                check(diff < 1.6e-2, f"{what}: parameters after {STEPS} steps equal torch's within bf16's rtol (largest {diff:.2e})")
                check(apart > 1e-6, f"{what}: the run differs from fp32's (by {apart:.2e}): the casts act")
    print(f"{'FAILED' if failures else 'passed'}: --amp against torch.autocast ({len(failures)} failures), torch {torch.__version__}")
    sys.exit(1 if failures else 0)
