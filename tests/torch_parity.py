#!/usr/bin/env python3
"""PyTorch parity for dtlab-cli (run by CTest; exits 77 = skipped when torch is absent).

Checks, with Debian's python3-torch:
  1. training: dtlab-cli train and the same loop in torch (same seed, data, sampler, optimizer)
     give the same per-step losses and the same final parameters, for AdamW and SGD+momentum;
  2. checkpoints: dtlab's safetensors file loads into torch.nn.Sequential with load_state_dict
     (strict) and torch's logits equal `dtlab-cli eval --logits`;
  3. the sampler: `dtlab-cli sampler --json` equals torch's DistributedSampler;
  4. --clip-grad-norm: each step's norm equals torch.nn.utils.clip_grad_norm_'s return value, and the
     clipped run's losses and parameters equal torch's.
Usage: torch_parity.py PATH/TO/dtlab-cli
"""
import json, os, struct, sys, tempfile

from torch_common import CLI, check, cli, failures, load_safetensors, np, sequential, torch  # noqa: F401 (exits 77 without torch)


def torch_train(dims, x, y, batch, steps, seed, make_opt, clip=None, norms=None):
    torch.manual_seed(seed)
    model = sequential(dims)
    opt = make_opt(model.parameters())
    ds = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler)
    losses, epoch = [], 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            if clip is not None:
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return model, losses


torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    n, dims = 200, [4, 16, 16, 3]
    x = rng.standard_normal((n, dims[0])).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    data = os.path.join(tmp, "d.npz")
    np.savez(data, x=x, y=y)
    spec = "mlp:" + ",".join(map(str, dims))

    runs = {
        "adamw": (["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01"],
                  lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.01)),
        "sgd": (["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.001"],
                lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.001)),
        # A max norm below the gradients' (about 0.3 to 1 here): every step clips.
        "sgd_clip": (["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--clip-grad-norm", "0.1"],
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    }
    for name, (flags, make_opt) in runs.items():
        ckpt = os.path.join(tmp, f"{name}.safetensors")
        steps = 25  # 200 / 32 -> 7 batches per epoch, so 25 steps cross three set_epoch calls
        out = cli("train", "--model", spec, "--data", data, "--batch", 32, "--steps", steps, "--seed", 3,
                  "--threads", 1, *flags, "--save", ckpt, "--json")
        rows = [json.loads(l) for l in out.splitlines()]
        ours = [r["loss"] for r in rows if "step" in r]
        clip = 0.1 if name == "sgd_clip" else None
        torch_norms = []
        model, theirs = torch_train(dims, x, y, 32, steps, 3, make_opt, clip, torch_norms)
        if clip is not None:
            our_norms = [r["grad_norm"] for r in rows if "step" in r]
            norm_diff = max(abs(a - b) / b for a, b in zip(our_norms, torch_norms))
            clipped = sum(b > clip for b in torch_norms)
            check(len(our_norms) == steps and norm_diff < 1e-5 and clipped == steps,
                  f"{name}: {steps} per-step gradient norms equal clip_grad_norm_'s, every step clipped "
                  f"(max rel diff {norm_diff:.2e}, {clipped} clipped)")
        loss_diff = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(ours, theirs))
        check(len(ours) == steps and loss_diff < 1e-5,
              f"{name}: {steps} per-step losses equal torch's (max rel diff {loss_diff:.2e})")
        sd = load_safetensors(ckpt)
        param_diff = max((sd[k] - v).abs().max().item() for k, v in model.state_dict().items())
        check(param_diff < 1e-5, f"{name}: final parameters equal torch's (max abs diff {param_diff:.2e})")

        # The checkpoint loads strictly into a fresh Sequential; logits equal dtlab's.
        fresh = sequential(dims)
        fresh.load_state_dict(sd, strict=True)
        logits_path = os.path.join(tmp, f"{name}_logits.npy")
        cli("eval", "--init", ckpt, "--data", data, "--logits", logits_path, "--threads", 1)
        ours_logits = torch.from_numpy(np.load(logits_path))
        with torch.no_grad():
            theirs_logits = fresh(torch.from_numpy(x))
        logit_diff = (ours_logits - theirs_logits).abs().max().item()
        check(ours_logits.shape == theirs_logits.shape and logit_diff < 1e-5,
              f"{name}: checkpoint loads into torch.nn.Sequential; logits {tuple(ours_logits.shape)} "
              f"equal dtlab's (max abs diff {logit_diff:.2e})")

    # Sampler against torch's DistributedSampler, shuffled and not, padded and dropped.
    class Len:
        def __init__(self, n): self.n = n
        def __len__(self): return self.n
    cases = [(10, 4, 0, 0, False), (10, 4, 0, 1, False), (17, 3, 42, 0, True), (17, 3, 42, 2, False),
             (3, 8, 5, 0, False), (1000, 8, 7, 3, False), (1001, 8, 7, 3, True)]
    for n_, w, seed, epoch, drop in cases:
        args = ["sampler", "--n", n_, "--world", w, "--seed", seed, "--epoch", epoch, "--shuffle", "--json"]
        if drop:
            args.append("--drop-last")
        ours = [r["indices"] for r in json.loads(cli(*args))["ranks"]]
        theirs = []
        for r in range(w):
            s = torch.utils.data.distributed.DistributedSampler(Len(n_), num_replicas=w, rank=r, shuffle=True,
                                                                seed=seed, drop_last=drop)
            s.set_epoch(epoch)
            theirs.append(list(iter(s)))
        check(ours == theirs, f"sampler n={n_} world={w} seed={seed} epoch={epoch} drop_last={drop} equals torch")

print(f"{'FAILED' if failures else 'passed'}: torch parity ({len(failures)} failures), torch {torch.__version__}")
sys.exit(1 if failures else 0)
