#!/usr/bin/env python3
"""PyTorch reference for bench/bench_step.cpp: the same model, init, data and optimizer, timed the
same way; with DEVICE cuda, the reference for bench/bench_cuda.cpp on the GPU (each step ends when
the GPU finished it). PRECISION bf16 or fp16 runs forward and loss under torch.autocast in that dtype
(fp32 parameters, gradients and AdamW state, PyTorch's usual 16-bit training; fp16 scales the loss by
GradScaler's 65536 and unscales before the step). Prints one JSON object.
Usage: torch_step.py SPEC BATCH STEPS WARMUP THREADS [DEVICE [PRECISION]]"""
import json, math, sys, time

try:
    import torch
except ImportError:
    print(json.dumps({"error": "torch not available"}))
    sys.exit(0)

spec, batch, steps, warmup, threads = sys.argv[1], *map(int, sys.argv[2:6])
device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
precision = sys.argv[7] if len(sys.argv) > 7 else "fp32"
amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
scaler = torch.cuda.amp.GradScaler() if precision == "fp16" and device == "cuda" else None


def step(opt, compute_loss):
    """One optimizer step: forward and loss under autocast when asked, backward, (unscale,) step."""
    opt.zero_grad(set_to_none=False)
    if amp_dtype is None:
        loss = compute_loss()
        loss.backward()
        opt.step()
        return loss
    with torch.autocast(device_type=device, dtype=amp_dtype):
        loss = compute_loss()
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss


if device == "cuda" and not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no CUDA device"}))
    sys.exit(0)
torch.set_num_threads(threads)
if device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32 GEMMs, as dtlab's cuBLAS calls
    torch.backends.cudnn.allow_tf32 = False
if spec.startswith("gpt:"):  # nanoGPT's GPT (tests/nanogpt_torch.py) on tokens (b*T + t) * 7 % V, next token as target
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from nanogpt_torch import GPT
    g = dict(kv.split("=") for kv in spec[4:].split(","))
    L, H, C, T, V = (int(g[k]) for k in ("layers", "heads", "embd", "ctx", "vocab"))
    torch.manual_seed(0)
    model = GPT(L, H, C, T, V).to(device)
    seq = torch.stack([(torch.arange(T + 1) + b * T) * 7 % V for b in range(batch)])
    idx, tgt = seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, first_loss = [], None
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = step(opt, lambda: model(idx, tgt))
        if device == "cuda":
            torch.cuda.synchronize()
        if first_loss is None:
            first_loss = loss.item()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"median_ms": 1e3 * times[len(times) // 2], "min_ms": 1e3 * times[0], "first_loss": first_loss,
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device, "precision": precision}))
    sys.exit(0)
dims = [int(d) for d in spec.split(":")[1].split(",")]
torch.manual_seed(0)
layers = []
for i in range(len(dims) - 1):
    layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
    if i + 2 < len(dims):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers).to(device)
# Deterministic input shared with the C++ side: x[b, j] = sin(0.01 * (b * D + j)), y[b] = b % K.
D, K = dims[0], dims[-1]
# (in double, as math.sin computes it, then rounded: fast for the GEMM-bound bench's 33M inputs)
x = torch.sin(0.01 * torch.arange(batch * D, dtype=torch.float64)).to(torch.float32).view(batch, D)
y = torch.tensor([b % K for b in range(batch)], dtype=torch.int64)
x, y = x.to(device), y.to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
times, first_loss = [], None
for i in range(warmup + steps):
    t0 = time.perf_counter()
    loss = step(opt, lambda: loss_fn(model(x), y))
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if first_loss is None:
        first_loss = loss.item()
    if i >= warmup:
        times.append(dt)
times.sort()
print(json.dumps({"median_ms": 1e3 * times[len(times) // 2], "min_ms": 1e3 * times[0],
                  "first_loss": first_loss, "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device, "precision": precision}))
