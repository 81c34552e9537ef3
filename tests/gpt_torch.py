#!/usr/bin/env python3
"""The GPT against PyTorch (run by CTest; exits 77 = skipped when torch is absent).

nanoGPT's GPT (tests/nanogpt_torch.py, docs/course_sources.md §6g) checked against dtlab-cli on a
character-level slice of the shipped text:
  1. initialisation: `--seed S` gives the values torch.manual_seed(S); GPT(config) gives (torch's
     AVX2 normal_ uses SLEEF's log/cos/sin, so equal to about 1e-7, not bit for bit);
  2. training from the same weights (`--init`, a safetensors file written here): per-step losses and
     the final parameters after 20 steps equal torch's, AdamW and SGD with momentum, one rank,
     DDP on 2 ranks (each rank's DistributedSampler shard, gradients averaged), the GPipe, 1F1B and
     ZB-H1 pipelines, TP 2 and 4, TP 2 with sequence parallelism, and the 2 x 2 x 2 mesh;
  3. the checkpoint loads into the torch GPT (load_state_dict, strict but for the tied lm_head and
     the causal-mask buffers, which nanoGPT's state_dict also lists) and gives dtlab's loss;
  4. LoRA on c_attn (peft's draws and math);
  5. --precision bf16 against torch's GPT in bf16 with fp32 master weights, in 8 layouts.
Usage: gpt_torch.py PATH/TO/dtlab-cli
"""
import copy, json, math, os, struct, sys, tempfile

from torch_common import CLI, char_windows, check, cli, ddp_steps, failures, load_safetensors, np, params, save_safetensors, torch  # noqa: F401 (exits 77 without torch)

from nanogpt_torch import GPT  # noqa: E402


def torch_train(model, windows, batch, steps, seed, make_opt, world, bf16=False):
    """DDP on `world` ranks as one process: each rank's DistributedSampler shard, the mean of the
    ranks' mean losses (DDP averages the gradients). `bf16`: the model's bf16 copy runs the passes (the
    loss on its logits .float()) and an fp32 master copy of each parameter takes the optimizer's step,
    then is rounded into the bf16 parameter (Megatron's layout, dtlab's --precision bf16); the bf16
    model is returned beside the losses."""
    if bf16:
        run = copy.deepcopy(model).to(torch.bfloat16)
        named = list(run.named_parameters())
        master = [p.detach().float().clone().requires_grad_(True) for _, p in named]
        opt = make_opt(master)
    else:
        run = model
        opt = make_opt(model.parameters())

    def loss_of(idx, tgt):
        if not bf16:
            return run(idx, tgt)
        x = run.transformer.wte(idx) + run.transformer.wpe(torch.arange(idx.size(1)))
        for blk in run.transformer.h:
            x = blk(x)
        logits = run.lm_head(run.transformer.ln_f(x)).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))

    losses = []
    for shards in ddp_steps(len(windows), world, batch, seed, steps):
        if bf16:
            for _, p in named:
                p.grad = None
        else:
            opt.zero_grad()
        total = 0.0
        for r in range(world):
            rows = windows[shards[r]]
            loss = loss_of(rows[:, :-1].contiguous(), rows[:, 1:].contiguous()) / world
            loss.backward()
            total += loss.item()
        if bf16:
            for q, (_, p) in zip(master, named):
                q.grad = p.grad.float()
        opt.step()
        if bf16:
            with torch.no_grad():
                for q, (_, p) in zip(master, named):
                    p.copy_(q)
        losses.append(total)
    return (losses, run) if bf16 else losses


torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    L, H, C, T = 2, 4, 32, 16  # 4 heads: a TP group of 4 holds one each
    text_path, V, windows = char_windows(tmp, 6000, T)
    spec = f"gpt:layers={L},heads={H},embd={C},ctx={T}"
    common = ["--model", spec, "--data", "text:" + text_path, "--threads", 1]

    # 1. The initial values for a seed (an SGD step of lr 1e-12 moves no value by more than 1e-11).
    ckpt0 = os.path.join(tmp, "init.safetensors")
    cli("train", *common, "--seed", 5, "--steps", 1, "--batch", 4, "--optimizer", "sgd", "--lr", "1e-12", "--save", ckpt0)
    ours0 = load_safetensors(ckpt0)
    torch.manual_seed(5)
    ref = GPT(L, H, C, T, V)
    theirs0 = params(ref)
    same_names = sorted(ours0) == sorted(theirs0)
    init_diff = max((ours0[k] - v).abs().max().item() for k, v in theirs0.items()) if same_names else float("inf")
    check(same_names and init_diff < 1e-6,
          f"--seed 5 gives nanoGPT's initial values for torch.manual_seed(5) (names {'equal' if same_names else 'differ'}, "
          f"max abs diff {init_diff:.2e})")

    # 2. Training from the same weights.
    torch.manual_seed(11)
    start = GPT(L, H, C, T, V)
    init_path = os.path.join(tmp, "start.safetensors")
    save_safetensors(init_path, params(start))
    runs = {
        "adamw": (["--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1"],
                  lambda p: torch.optim.AdamW(p, lr=0.003, weight_decay=0.1)),
        "sgd": (["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"],
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    }
    steps, batch = 20, 4

    def held_to_torch(label, world, flags, model, make_opt, values):
        """dtlab-cli train with `flags` from `start` against torch_train on `model`: the per-step losses
        and values(model) after the steps, both within 1e-4. Returns dtlab's checkpoint."""
        ckpt = os.path.join(tmp, "".join(c if c.isalnum() else "_" for c in label) + ".safetensors")
        out = cli("train", *common, *flags, "--init", init_path, "--seed", 3, "--batch", batch, "--steps", steps, "--save", ckpt,
                  "--json")
        ours = [q["loss"] for q in map(json.loads, out.splitlines()) if "step" in q]
        theirs = torch_train(model, windows, batch, steps, 3, make_opt, world)
        loss_diff = max(abs(a - b) for a, b in zip(ours, theirs)) if len(ours) == steps else float("inf")
        check(loss_diff < 1e-4, f"{label}: {steps} per-step losses equal torch's (max abs diff {loss_diff:.2e})")
        sd = load_safetensors(ckpt)
        param_diff = max((sd[k] - v).abs().max().item() for k, v in values(model).items())
        check(param_diff < 1e-4, f"{label}: parameters after {steps} steps equal torch's (max abs diff {param_diff:.2e})")
        return ckpt

    # One rank, DDP on two, two pipelines (a block per stage, the tied weight summed over the
    # embedding group), Megatron TP over 2 and 4 ranks (heads and MLP columns split; with sequence
    # parallelism the positions too) and the 2 x 2 x 2 mesh (2 replicas of 2 stages of 2 TP shards),
    # each held to torch's one rank (or two, for two replicas) on the same batches.
    layouts = {
        "world 1": (1, []),
        "world 2": (2, ["--strategy", "ddp", "--world", 2]),
        "pipeline gpipe": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 2, "--schedule", "gpipe"]),
        "pipeline 1f1b": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 4, "--schedule", "1f1b"]),
        "pipeline zb-h1": (1, ["--strategy", "pipeline", "--stages", 2, "--microbatches", 4, "--schedule", "zb-h1"]),
        "tp 2": (1, ["--strategy", "ddp", "--world", 2, "--tp", 2]),
        "tp 4": (1, ["--strategy", "ddp", "--world", 4, "--tp", 4]),
        "tp 2 + sp": (1, ["--strategy", "ddp", "--world", 2, "--tp", 2, "--sequence-parallel"]),
        "mesh 2x2x2": (2, ["--strategy", "pipeline", "--world", 8, "--tp", 2, "--stages", 2, "--dp", 2, "--microbatches", 2]),
        "mesh 2x2x2 + sp, zb-h1": (2, ["--strategy", "pipeline", "--world", 8, "--tp", 2, "--stages", 2, "--dp", 2, "--microbatches", 2,
                                     "--sequence-parallel", "--schedule", "zb-h1"]),
    }
    for layout, (world, strategy) in layouts.items():
        for name, (flags, make_opt) in runs.items():
            model = GPT(L, H, C, T, V)
            model.load_state_dict(start.state_dict())
            ckpt = held_to_torch(f"{name}, {layout}", world, [*strategy, *flags], model, make_opt, params)

    # 3. The checkpoint in nanoGPT's GPT.
    fresh = GPT(L, H, C, T, V)
    missing, unexpected = fresh.load_state_dict(load_safetensors(ckpt), strict=False)
    allowed = {"lm_head.weight"} | {f"transformer.h.{i}.attn.bias" for i in range(L)}
    check(set(missing) <= allowed and not unexpected,
          f"the checkpoint loads into nanoGPT's GPT (missing only the tied lm_head and mask buffers: {sorted(missing)})")
    with torch.no_grad():
        full = fresh(windows[:, :-1].contiguous(), windows[:, 1:].contiguous()).item()
    final = json.loads(cli("eval", "--init", ckpt, "--model", spec, "--data", "text:" + text_path, "--json"))
    check(abs(final["loss"] - full) < 1e-4, f"dtlab-cli eval's loss {final['loss']:.6f} equals torch's {full:.6f} on the loaded GPT")

    # 4. LoRA on c_attn (peft's LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"]), its math written
    #    out: peft itself is not installed): the adapters' draws, then training with the base frozen.
    r, alpha = 4, 8.0

    class LoraLinear(torch.nn.Module):  # peft's Linear: base(x) + lora_B(lora_A(x)) * scaling
        def __init__(self, base):
            super().__init__()
            self.base, self.scaling = base, alpha / r
            self.lora_A = torch.nn.Linear(base.in_features, r, bias=False)
            self.lora_B = torch.nn.Linear(r, base.out_features, bias=False)
            torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # reset_lora_parameters
            torch.nn.init.zeros_(self.lora_B.weight)

        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

    def lora_gpt(seed):  # torch.manual_seed(seed), GPT(config), get_peft_model: the base's values from `start`
        torch.manual_seed(seed)
        m = GPT(L, H, C, T, V)
        for p in m.parameters():
            p.requires_grad_(False)
        for blk in m.transformer.h:
            blk.attn.c_attn = LoraLinear(blk.attn.c_attn)
        with torch.no_grad():
            for k, v in params(start).items():
                dict(m.named_parameters())[k.replace("c_attn.", "c_attn.base.")].copy_(v)
        return m

    def merged(m):  # peft's merge_and_unload: W + scaling B A
        out = {k.replace("c_attn.base.", "c_attn."): v.detach().clone() for k, v in m.named_parameters() if "lora_" not in k}
        for i, blk in enumerate(m.transformer.h):
            a = blk.attn.c_attn
            out[f"transformer.h.{i}.attn.c_attn.weight"] += a.scaling * (a.lora_B.weight @ a.lora_A.weight).detach()
        return out

    lora_flags = ["--lora-rank", r, "--lora-alpha", alpha]
    adapters = os.path.join(tmp, "adapters.safetensors")
    cli("train", *common, "--init", init_path, "--seed", 3, "--steps", 1, "--batch", 4, *lora_flags, "--optimizer", "sgd",
        "--lr", "1e-12", "--save", adapters)
    ours = load_safetensors(adapters)
    ref = lora_gpt(3)
    worst = max((ours[f"base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight"] - blk.attn.c_attn.lora_A.weight).abs().max().item()
                for i, blk in enumerate(ref.transformer.h))
    check(worst < 1e-6, f"LoRA: lora_A after torch.manual_seed(3) and GPT(config) follows peft's draws (max abs diff {worst:.2e})")
    lora_layouts = {k: layouts[k] for k in ("world 1", "world 2", "pipeline 1f1b", "pipeline zb-h1", "tp 2", "tp 2 + sp",
                                             "mesh 2x2x2 + sp, zb-h1")}
    for layout, (world, strategy) in lora_layouts.items():
        flags, make_opt = runs["adamw"]
        held_to_torch(f"LoRA, adamw, {layout} (merged)", world, [*strategy, *flags, *lora_flags, "--merge-lora"], lora_gpt(3), make_opt,
                      merged)

    # 5. bf16 (--precision bf16: Megatron's layout, docs/course_sources.md §6e): torch's GPT after
    #    .to(torch.bfloat16) computes every op in bf16 (float32 inside, rounded once), the loss on its
    #    logits .float(), and an fp32 master copy of each parameter takes the optimizer's step, then is
    #    rounded into the bf16 parameter. dtlab's attention rounds once where torch's unfused one rounds
    #    q k^T, the scaling and the softmax apart, and its DDP all-reduces bf16 gradients on a ring:
    #    equal within bf16 rounding, as torch.testing.assert_close's bf16 rtol (1.6e-2) measures it.
    bf16_layouts = {k: layouts[k] for k in ("world 1", "world 2", "pipeline 1f1b", "pipeline zb-h1", "tp 2", "tp 2 + sp",
                                            "mesh 2x2x2 + sp, zb-h1")}
    bf16_layouts["fsdp 2"] = (2, ["--strategy", "fsdp", "--world", 2])
    for layout, (world, strategy) in bf16_layouts.items():
        flags, make_opt = runs["sgd"]
        label = f"bf16, sgd, {layout}"
        ckpt = os.path.join(tmp, "".join(c if c.isalnum() else "_" for c in label) + ".safetensors")
        out = cli("train", *common, *strategy, *flags, "--precision", "bf16", "--init", init_path, "--seed", 3, "--batch", batch,
                  "--steps", steps, "--save", ckpt, "--json")
        ours = [q["loss"] for q in map(json.loads, out.splitlines()) if "step" in q]
        theirs, m16 = torch_train(start, windows, batch, steps, 3, make_opt, world, bf16=True)
        final = {k: v.detach().float() for k, v in m16.named_parameters()}
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) if len(ours) == steps else float("inf")
        check(rel < 1.6e-2, f"{label}: {steps} per-step losses equal torch's within bf16's rtol 1.6e-2 (max relative diff {rel:.2e})")
        # The parameters (the bf16 values --save writes, widened), measured in bf16 ulps of each
        # tensor's largest value: dtlab's distance from torch's bf16 run is held to bf16's own effect,
        # the distance between torch's bf16 and float32 runs, plus one ulp (a wrong gradient or a
        # missed rounding moves parameters by tens of ulps).
        sd = load_safetensors(ckpt)

        def ulps(a, b):
            top = max(a.abs().max().item(), b.abs().max().item(), 2.0 ** -126)
            return (a - b).abs().max().item() / 2.0 ** (math.floor(math.log2(top)) - 7)

        m32 = GPT(L, H, C, T, V)
        m32.load_state_dict(start.state_dict())
        torch_train(m32, windows, batch, steps, 3, make_opt, world)
        p32 = params(m32)
        worst = max(ulps(sd[k], v) for k, v in final.items())
        effect = max(ulps(p32[k], v) for k, v in final.items())
        check(worst <= effect + 1, f"{label}: parameters after {steps} steps within {worst:.2f} bf16 ulp of torch's bf16 run "
                                   f"(torch's bf16 and float32 runs differ by {effect:.2f})")

print(f"{'FAILED' if failures else 'passed'}: GPT torch parity ({len(failures)} failures), torch {torch.__version__}")
sys.exit(1 if failures else 0)
