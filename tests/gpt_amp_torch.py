#!/usr/bin/env python3
"""The GPT under --amp against torch.autocast (run by CTest; exits 77 = skipped when torch is absent).

`dtlab-cli train --model gpt... --amp bf16` is nanoGPT's GPT (tests/nanogpt_torch.py) trained under
`torch.autocast("cpu", dtype=torch.bfloat16)` (docs/course_sources.md §6e): float32 parameters,
gradients and optimizer state; every Linear, the attention's matmuls, its softmax and GELU in bf16;
the embeddings, LayerNorms, residual adds and the loss in float32 (torch 1.13's CPU autocast lists).
Held here, from the same weights on the same batches, in one rank, DDP on 2, FSDP on 2, the 1F1B and
ZB-H1 pipelines, TP 2 with and without sequence parallelism, and with activation checkpointing:
  - the per-step losses equal torch's autocast run within bf16's rtol (1.6e-2);
  - the float32 parameters after the steps are within twice bf16's own effect of torch's autocast
    run (the distance of torch's float32 run from it): the two engines accumulate their matmuls in
    different orders, so their bf16 roundings part at the last bit and the runs drift apart by about
    that effect; a wrong gradient or a lost step lands far beyond it. Which tensors autocast rounds is
    checked bit for bit by tests/test_gpt_amp.cpp;
  - and the same for --amp with --lora-rank (peft's Linear under autocast).
Usage: gpt_amp_torch.py PATH/TO/dtlab-cli
"""
import json, math, os, sys, tempfile

from torch_common import char_windows, check, cli, ddp_steps, failures, load_safetensors, params, save_safetensors, torch  # noqa: F401 (exits 77 without torch)

from nanogpt_torch import GPT  # noqa: E402


def torch_train(model, windows, batch, steps, seed, make_opt, world, amp):
    """DDP on `world` ranks as one process (each rank's DistributedSampler shard, the mean of the
    ranks' mean losses), each forward under autocast when `amp`."""
    opt = make_opt([p for p in model.parameters() if p.requires_grad])
    losses = []
    for shards in ddp_steps(len(windows), world, batch, seed, steps):
        opt.zero_grad()
        total = 0.0
        for r in range(world):
            rows = windows[shards[r]]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = model(rows[:, :-1].contiguous(), rows[:, 1:].contiguous()) / world
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses


torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    L, H, C, T = 2, 4, 32, 16
    text_path, V, windows = char_windows(tmp, 6000, T)
    spec = f"gpt:layers={L},heads={H},embd={C},ctx={T}"
    common = ["--model", spec, "--data", "text:" + text_path, "--threads", 1]
    torch.manual_seed(11)
    start = GPT(L, H, C, T, V)
    init_path = os.path.join(tmp, "start.safetensors")
    save_safetensors(init_path, params(start))
    steps, batch = 20, 4
    # (SGD: AdamW's normalised steps turn a near-zero gradient's rounding into a full step either way.)
    flags = ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"]

    def make_opt(p):
        return torch.optim.SGD(p, lr=0.1, momentum=0.9)

    def run_torch(world, amp, wrap=None):
        m = GPT(L, H, C, T, V)
        m.load_state_dict(start.state_dict())
        if wrap:
            m = wrap(m)
        losses = torch_train(m, windows, batch, steps, 3, make_opt, world, amp)
        return losses, m

    def held(label, world, strategy, values=params, wrap=None):
        ckpt = os.path.join(tmp, "".join(c if c.isalnum() else "_" for c in label) + ".safetensors")
        out = cli("train", *common, *strategy, *flags, "--amp", "bf16", "--init", init_path, "--seed", 3, "--batch", batch,
                  "--steps", steps, "--save", ckpt, "--json")
        ours = [q["loss"] for q in map(json.loads, out.splitlines()) if "step" in q]
        theirs, m_amp = run_torch(world, True, wrap)
        _, m32 = run_torch(world, False, wrap)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) if len(ours) == steps else float("inf")
        check(rel < 1.6e-2, f"{label}: {steps} per-step losses equal torch.autocast's within bf16's rtol 1.6e-2 (max relative diff {rel:.2e})")
        sd = load_safetensors(ckpt)
        amp_vals, f32_vals = values(m_amp), values(m32)
        # Each tensor's largest difference, relative to its largest value; the worst over the tensors.
        def dist(a, b):
            return max((a[k] - b[k]).abs().max().item() / max(b[k].abs().max().item(), 1e-12) for k in b)
        ours_d, effect = dist(sd, amp_vals), dist(f32_vals, amp_vals)
        check(ours_d < 2 * effect, f"{label}: parameters after {steps} steps {ours_d:.2e} from torch.autocast's, within twice "
                                   f"bf16's effect (torch's float32 run is {effect:.2e} from it)")

    layouts = {
        "world 1": (1, []),
        "world 1, activation checkpointing": (1, ["--activation-checkpointing"]),
        "ddp 2": (2, ["--strategy", "ddp", "--world", 2]),
        "fsdp 2": (2, ["--strategy", "fsdp", "--world", 2]),
        "pipeline 1f1b": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 4, "--schedule", "1f1b"]),
        "pipeline zb-h1": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 4, "--schedule", "zb-h1"]),
        "tp 2": (1, ["--strategy", "ddp", "--world", 2, "--tp", 2]),
        "tp 2 + sp": (1, ["--strategy", "ddp", "--world", 2, "--tp", 2, "--sequence-parallel"]),
    }
    for layout, (world, strategy) in layouts.items():
        held(f"--amp bf16, sgd, {layout}", world, strategy)

    # LoRA on c_attn under autocast: peft's Linear (base(x) + lora_B(lora_A(x)) * scaling), every
    # matmul of it in bf16; the adapters drawn as tests/gpt_torch.py checks.
    r, alpha = 4, 8.0

    class LoraLinear(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base, self.scaling = base, alpha / r
            self.lora_A = torch.nn.Linear(base.in_features, r, bias=False)
            self.lora_B = torch.nn.Linear(r, base.out_features, bias=False)
            torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            torch.nn.init.zeros_(self.lora_B.weight)

        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

    def lora_wrap(m):  # torch.manual_seed(3), GPT(config) (its draws discarded), then the adapters
        torch.manual_seed(3)
        GPT(L, H, C, T, V)
        for p in m.parameters():
            p.requires_grad_(False)
        for blk in m.transformer.h:
            blk.attn.c_attn = LoraLinear(blk.attn.c_attn)
        return m

    def merged(m):  # peft's merge_and_unload
        out = {k.replace("c_attn.base.", "c_attn."): v.detach().clone() for k, v in m.named_parameters() if "lora_" not in k}
        for i, blk in enumerate(m.transformer.h):
            a = blk.attn.c_attn
            out[f"transformer.h.{i}.attn.c_attn.weight"] += a.scaling * (a.lora_B.weight @ a.lora_A.weight).detach()
        return out

    held("--amp bf16, LoRA, sgd, world 1 (merged)", 1, ["--lora-rank", r, "--lora-alpha", alpha, "--merge-lora"], merged, lora_wrap)

print(f"{'FAILED' if failures else 'passed'}: GPT autocast torch parity ({len(failures)} failures), torch {torch.__version__}")
sys.exit(1 if failures else 0)
