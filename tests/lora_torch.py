#!/usr/bin/env python3
"""LoRA against PyTorch (run by CTest; exits 77 = skipped when torch or numpy is absent).

Checks, with Debian's python3-torch (peft itself is not needed):
  1. `dtlab-cli train --lora-rank 4 --merge-lora --save F` writes a file that loads strictly into a
     plain torch.nn.Sequential, whose logits equal `dtlab-cli eval --init F --logits`;
  2. the adapter init follows torch's stream as peft draws it: after torch.manual_seed(seed) and the
     Sequential, per Linear nn.Linear(in, r, bias=False), nn.Linear(r, out, bias=False), then
     kaiming_uniform_(A, a=sqrt(5)) again; B zeros (docs/course_sources.md §6d).
Usage: lora_torch.py PATH/TO/dtlab-cli
"""
import math, os, sys, tempfile

from torch_common import check, cli, failures, load_safetensors, np, torch  # noqa: F401 (exits 77 without torch)


dims, r, seed = [2, 16, 16, 3], 4, 3
spec = "mlp:" + ",".join(map(str, dims))
torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    merged = os.path.join(tmp, "merged.safetensors")
    cli("train", "--model", spec, "--steps", 30, "--seed", seed, "--lora-rank", r, "--merge-lora", "--save", merged)
    model = torch.nn.Sequential(*[m for i in range(len(dims) - 1) for m in
                                  ([torch.nn.Linear(dims[i], dims[i + 1])] + ([torch.nn.ReLU()] if i + 2 < len(dims) else []))])
    model.load_state_dict(load_safetensors(merged), strict=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, dims[0])).astype(np.float32)
    data = os.path.join(tmp, "d.npz")
    np.savez(data, x=x, y=np.zeros(64, dtype=np.int64))
    logits = os.path.join(tmp, "logits.npy")
    cli("eval", "--init", merged, "--data", data, "--logits", logits)
    with torch.no_grad():
        diff = (model(torch.from_numpy(x)) - torch.from_numpy(np.load(logits))).abs().max().item()
    check(diff < 1e-5, f"--merge-lora loads into torch.nn.Sequential; logits equal dtlab's eval (max abs diff {diff:.2e})")

    adapters = os.path.join(tmp, "adapters.safetensors")
    cli("train", "--model", spec, "--steps", 1, "--seed", seed, "--lora-rank", r, "--optimizer", "sgd", "--lr", "1e-12",
        "--save", adapters)
    ours = load_safetensors(adapters)
    torch.manual_seed(seed)
    base = [torch.nn.Linear(dims[i], dims[i + 1]) for i in range(len(dims) - 1)]
    worst = 0.0
    for i in range(len(dims) - 1):
        a = torch.nn.Linear(dims[i], r, bias=False)
        torch.nn.Linear(r, dims[i + 1], bias=False)
        torch.nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
        worst = max(worst, (ours[f"base_model.model.{2 * i}.lora_A.weight"] - a.weight.detach()).abs().max().item())
    check(worst < 1e-6, f"lora_A after torch.manual_seed({seed}) follows peft's draws (max abs diff {worst:.2e})")

sys.exit(1 if failures else 0)
