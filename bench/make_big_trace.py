#!/usr/bin/env python3
"""Writes a large Kineto-format trace set for benchmarking dtlab's trace loader.

Usage: bench/make_big_trace.py --out DIR [--ranks 4] [--mb 100] [--gzip]

Writes DIR/rank{R}.json (rank{R}.json.gz with --gzip), whose sizes add up to about --mb megabytes
(10^6 bytes, before compression): the iterations of tests/data/traces/make_kineto_fixture.py (the
"mlp:2,512,512,3" DDP step on NCCL: many small CPU ops, launches and kernels, two all-reduces per
iteration) simulated once as a block of iterations, then repeated with advancing timestamps, fresh
External ids / correlations, ProfilerStep numbers and process-group Seq, so every repetition is a
valid continuation and the all-reduce kernels still end at the same instant on every rank.
Deterministic (the same bytes every run) and written with plain string formatting, a few seconds
for 100 MB.
"""
import argparse, gzip, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data", "traces"))
import make_kineto_fixture as kf  # noqa: E402  (the event shapes live there)

BLOCK = 8            # iterations simulated once, then repeated
GAP_NS = 40_000      # between the end of one block and the start of the next


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=float, default=100.0, help="total size of the files, in 10^6 bytes")
    ap.add_argument("--gzip", action="store_true", help="write rank{R}.json.gz")
    a = ap.parse_args(argv)
    if not 1 <= a.ranks <= 1024:
        ap.error(f"--ranks {a.ranks} is not between 1 and 1024.")
    if not 0 < a.mb <= 100000:
        ap.error(f"--mb {a.mb} is not a size in megabytes above 0 (at most 100000).")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out} exists and is not a directory.")
    return a


def write_rank(path, sim, reps, period_ns, id_span, gz):
    """The block of iterations `reps` times, shifted by a whole period each time."""
    shift = kf.clock_shift(sim.rank)
    meta, pre, post = kf.frame_events(sim)
    t_end = sim.last + (reps - 1) * period_ns
    pre[0].dur = t_end + 3000 - pre[0].ts          # the profiler's span covers every repetition
    post[0].ts = t_end + 4000                       # "Record Window End"
    body = kf.body_events(sim)
    name = f"/tmp/dtlab_big_trace/rank{sim.rank}.json"
    written = 0
    with open(path, "wb") as raw, \
            (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if gz else raw) as f:
        def put(text):
            nonlocal written
            data = text.encode()
            written += len(data)
            f.write(data)
        put(kf.header(sim, name))
        put(",\n".join(kf.render_event(e, shift) for e in meta + pre))
        for k in range(reps):
            t, ids = shift + k * period_ns, k * id_span
            steps, seqs = k * BLOCK, k * 2 * BLOCK
            put(",\n" + ",\n".join(kf.render_event(e, t, ids, steps, seqs) for e in body))
        put(",\n" + ",\n".join(kf.render_event(e, shift) for e in post))
        put(kf.footer(name))
    return written


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    sims = kf.simulate(a.ranks, iterations=BLOCK)
    first = min(s.first for s in sims)
    period = max(s.last for s in sims) - first + GAP_NS
    # ids used in a block (External id, correlation, flow ids), so repetitions never collide
    id_span = max(max(s.ext, s.corr) for s in sims) + 1000
    # size of one block per rank, to choose the repetitions
    block_bytes = sum(len(kf.render_event(e, kf.clock_shift(sims[0].rank))) + 2
                      for e in kf.body_events(sims[0]))
    target_per_rank = a.mb * 1e6 / a.ranks
    reps = max(1, int(round(target_per_rank / block_bytes)))
    total = 0
    for s in sims:
        path = os.path.join(a.out, f"rank{s.rank}.json" + (".gz" if a.gzip else ""))
        total += write_rank(path, s, reps, period, id_span, a.gzip)
    print(f"{a.out}: {a.ranks} ranks, {reps * BLOCK} iterations each, {total / 1e6:.1f} MB of JSON"
          f" in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
