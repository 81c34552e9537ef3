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
