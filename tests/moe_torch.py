#!/usr/bin/env python3
"""The GPT's mixture of experts (--moe) against PyTorch (run by CTest; exits 77 = skipped without torch).

tests/nanogpt_torch.py's GPT with MoE blocks (its MoE class: Megatron-core's router, top-k softmax,
capacity with the "position" drop policy and the Switch load-balancing loss; docs/course_sources.md
§6i) checked against dtlab-cli on a slice of the shipped text:
  1. initialisation: `--seed S --moe ...` gives torch.manual_seed(S); GPT(config, moe)'s values
     (the router's and each expert's draws in construction order, the experts' c_proj scaled too);
  2. training from the same weights for 12 steps: per-step cross-entropy losses and the final
     parameters equal torch's (loss + load-balancing losses backpropagated) within 1e-4, dropless and
     with a capacity that drops, every block and every other block, on one rank, DDP on 2 ranks,
     FSDP on 2, a 1F1B and a ZB-H1 pipeline, with activation checkpointing, and expert-parallel
     (--ep 2 on 2 and 4 ranks: the all-to-alls, the experts reduced over the expert-data-parallel
     group, and --save gathering every expert).
Usage: moe_torch.py PATH/TO/dtlab-cli
"""
import json, os, sys, tempfile

from torch_common import char_windows, check, cli, ddp_steps, failures, load_safetensors, params, save_safetensors, torch  # noqa: F401 (exits 77 without torch)
from nanogpt_torch import GPT  # noqa: E402


def torch_train(model, windows, batch, steps, seed, make_opt, world, micro=1):
    """DDP on `world` ranks as one process (each rank's DistributedSampler shard, gradients averaged):
    each rank's loss is its mean cross-entropy plus its MoE blocks' load-balancing losses, on its own
    tokens. A pipeline's `micro` micro-batches (torch.tensor_split) each route and count their own
    tokens, their losses weighed by their share of the batch (Megatron computes the aux loss per
    micro-batch and scales it by 1 / micro-batches). Returns the per-step mean cross-entropy."""
    opt = make_opt(model.parameters())
    losses = []
    for shards in ddp_steps(len(windows), world, batch, seed, steps):
        opt.zero_grad()
        total = 0.0
        for r in range(world):
            rows = windows[shards[r]]
            for mb in torch.tensor_split(rows, micro):
                ce = model(mb[:, :-1].contiguous(), mb[:, 1:].contiguous())
                share = len(mb) / len(rows) / world
                ((ce + model.aux_loss()) * share).backward()
                total += ce.item() * share
        opt.step()
        losses.append(total)
    return losses


torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    L, H, C, T = 2, 2, 16, 8
    text_path, V, windows = char_windows(tmp, 4000, T)
    spec = f"gpt:layers={L},heads={H},embd={C},ctx={T}"
    common = ["--model", spec, "--data", "text:" + text_path, "--threads", 1]

    # 1. Initial values: 4 experts, top 2, every block.
    moe = dict(E=4, K=2, capacity=0.0, aux=0.01)
    ckpt0 = os.path.join(tmp, "init.safetensors")
    cli("train", *common, "--moe", "experts=4,top_k=2", "--seed", 5, "--steps", 1, "--batch", 4, "--optimizer", "sgd", "--lr", "1e-12",
        "--save", ckpt0)
    ours0 = load_safetensors(ckpt0)
    torch.manual_seed(5)
    theirs0 = params(GPT(L, H, C, T, V, moe))
    same_names = sorted(ours0) == sorted(theirs0)
    init_diff = max((ours0[k] - v).abs().max().item() for k, v in theirs0.items()) if same_names else float("inf")
    check(same_names and init_diff < 1e-6,
          f"--moe experts=4,top_k=2 --seed 5 gives torch.manual_seed(5); GPT(config, MoE)'s values (names "
          f"{'equal' if same_names else 'differ'}, max abs diff {init_diff:.2e})")

    # 2. Training from the same weights.
    steps, batch = 12, 4
    runs = {
        "adamw": (["--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1"], lambda p: torch.optim.AdamW(p, lr=0.003, weight_decay=0.1)),
        "sgd": (["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"], lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    }
    # (moe flag, the reference's MoE arguments, its every)
    mixtures = {
        "dropless, top 2 of 4": ("experts=4,top_k=2", dict(E=4, K=2, capacity=0.0, aux=0.01), 1),
        "capacity 1.0 (drops), top 1 of 4, aux 0.1": ("experts=4,top_k=1,capacity=1.0,aux=0.1", dict(E=4, K=1, capacity=1.0, aux=0.1), 1),
        "top 2 of 3, capacity 1.25, every 2": ("experts=3,top_k=2,capacity=1.25,every=2", dict(E=3, K=2, capacity=1.25, aux=0.01), 2),
    }
    layouts = {
        "world 1": (1, []),
        "ddp 2": (2, ["--strategy", "ddp", "--world", 2]),
        "fsdp 2": (2, ["--strategy", "fsdp", "--world", 2]),
        "pipeline 1f1b": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 2, "--schedule", "1f1b"]),
        "pipeline zb-h1": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 2, "--schedule", "zb-h1"]),
        "recompute": (1, ["--activation-checkpointing"]),
        "ddp 2, ep 2": (2, ["--strategy", "ddp", "--world", 2, "--ep", 2]),
        "ddp 4, ep 2": (4, ["--strategy", "ddp", "--world", 4, "--ep", 2]),
    }
    for mix, (flag, margs, every) in mixtures.items():
        torch.manual_seed(11)
        start = GPT(L, H, C, T, V, margs, every)
        init_path = os.path.join(tmp, "start.safetensors")
        save_safetensors(init_path, params(start))
        for layout, (world, strategy) in layouts.items():
            if mix != "dropless, top 2 of 4" and layout not in ("world 1", "ddp 2", "pipeline 1f1b", "ddp 4, ep 2"):
                continue  # the layouts' code paths are the first mixture's; the others vary the router
            if "ep 2" in layout and margs["E"] % 2:
                continue  # (3 experts do not split over 2 ranks)
            for name, (flags, make_opt) in runs.items():
                if name == "sgd" and layout != "world 1":
                    continue
                label = f"{mix}, {name}, {layout}"
                ckpt = os.path.join(tmp, "run.safetensors")
                out = cli("train", *common, *strategy, *flags, "--moe", flag, "--init", init_path, "--seed", 3, "--batch", batch,
                          "--steps", steps, "--save", ckpt, "--json")
                ours = [q["loss"] for q in map(json.loads, out.splitlines()) if "step" in q]
                model = GPT(L, H, C, T, V, margs, every)
                model.load_state_dict(start.state_dict())
                micro = int(strategy[strategy.index("--microbatches") + 1]) if "--microbatches" in strategy else 1
                theirs = torch_train(model, windows, batch, steps, 3, make_opt, world, micro)
                loss_diff = max(abs(a - b) for a, b in zip(ours, theirs)) if len(ours) == steps else float("inf")
                check(loss_diff < 1e-4, f"{label}: {steps} per-step losses equal torch's (max abs diff {loss_diff:.2e})")
                sd = load_safetensors(ckpt)
                param_diff = max((sd[k] - v).abs().max().item() for k, v in params(model).items())
                check(param_diff < 1e-4, f"{label}: parameters after {steps} steps equal torch's (max abs diff {param_diff:.2e})")

print(f"{'FAILED' if failures else 'passed'}: MoE torch parity ({len(failures)} failures), torch {torch.__version__}")
sys.exit(1 if failures else 0)
