"""What the torch checks run by CTest share: the skip when torch is absent (exit 77), dtlab-cli
(argv[1]) as a function, and ok/FAIL lines collected in `failures`."""
import json, struct, subprocess, sys

try:
    import numpy as np  # noqa: F401 (re-exported)
    import torch  # noqa: F401 (re-exported)
except ImportError as e:
    print(f"skipped: {e.name} is not installed (apt-get install python3-torch)")
    sys.exit(77)

CLI = sys.argv[1]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def cli(*args):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"dtlab-cli {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def load_safetensors(path):  # docs/cli.md's snippet
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    dtypes = {"F32": np.float32, "I64": np.int64}
    return {k: torch.from_numpy(np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                                              dtype=dtypes[v["dtype"]]).reshape(v["shape"]).copy())
            for k, v in header.items() if k != "__metadata__"}


def save_safetensors(path, sd):  # float32 tensors, as dtlab-cli --init reads them
    header, blobs, off = {}, [], 0
    for k, v in sd.items():
        b = v.detach().contiguous().numpy().astype(np.float32).tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def char_windows(tmp, chars_of_text, T):
    """The shipped text's first `chars_of_text` characters as dtlab-cli's --data text:PATH reads them:
    written to tmp/t.txt; the sorted characters are the vocabulary; sample i is tokens[i T .. i T + T]
    and the next T (non-overlapping windows of T + 1). Returns (path, vocabulary size, windows)."""
    import os
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "shakespeare_sonnets.txt")
    text = open(src, encoding="utf-8").read()[:chars_of_text]
    path = os.path.join(tmp, "t.txt")
    open(path, "w", encoding="utf-8").write(text)
    chars = sorted(set(text))
    tokens = torch.tensor([chars.index(c) for c in text], dtype=torch.int64)
    n = (len(tokens) - 1) // T
    return path, len(chars), torch.stack([tokens[i * T:i * T + T + 1] for i in range(n)])


def params(model):  # named_parameters(): a tied weight once (nanoGPT's transformer.wte.weight)
    return {k: v.detach() for k, v in model.named_parameters()}


def ddp_steps(n, world, batch, seed, steps):
    """The rows each of `world` DDP ranks trains on, step by step, for `steps` steps over `n` samples:
    each rank's DistributedSampler shard (shuffle, `seed`, set_epoch each epoch) cut into batches, an
    epoch's last (short) batch included, as dtlab's loader does. Yields a list of index lists, rank by rank."""
    samplers = [torch.utils.data.distributed.DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=seed)
                for r in range(world)]
    done, epoch = 0, 0
    while done < steps:
        orders = []
        for s in samplers:
            s.set_epoch(epoch)
            orders.append(list(iter(s)))
        for start in range(0, len(orders[0]), batch):
            yield [o[start:start + batch] for o in orders]
            done += 1
            if done == steps:
                return
        epoch += 1


def sequential(dims):
    """dtlab's mlp:D0,...,Dk as torch.nn.Sequential: Linear, ReLU, ..., Linear."""
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)
