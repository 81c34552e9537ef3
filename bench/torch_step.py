#!/usr/bin/env python3
"""PyTorch reference for bench/bench_step.cpp: the same model, init, data and optimizer, timed the
same way; with DEVICE cuda, the reference for bench/bench_cuda.cpp on the GPU (each step ends when
the GPU finished it). Prints one JSON object. Usage: torch_step.py SPEC BATCH STEPS WARMUP THREADS [DEVICE]"""
import json, math, sys, time

try:
    import torch
except ImportError:
    print(json.dumps({"error": "torch not available"}))
    sys.exit(0)

spec, batch, steps, warmup, threads = sys.argv[1], *map(int, sys.argv[2:6])
device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
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
        opt.zero_grad(set_to_none=False)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if first_loss is None:
            first_loss = loss.item()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({"median_ms": 1e3 * times[len(times) // 2], "min_ms": 1e3 * times[0], "first_loss": first_loss,
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device}))
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
    opt.zero_grad(set_to_none=False)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if first_loss is None:
        first_loss = loss.item()
    if i >= warmup:
        times.append(dt)
times.sort()
print(json.dumps({"median_ms": 1e3 * times[len(times) // 2], "min_ms": 1e3 * times[0],
                  "first_loss": first_loss, "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device}))
