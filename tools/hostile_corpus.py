#!/usr/bin/env python3
"""Hostile-input corpus for dtlab-cli and dtlab (issue 22).

Generates 600+ hostile cases into a temporary directory (removed at the end unless --keep),
runs them against copies of the binaries, classifies every run and prints a Markdown table of
counts per category and outcome, then every case that is not a clean error or an expected run,
each with the command that reproduces it.

    python3 tools/hostile_corpus.py --bin-dir /tmp/hostile-bin [--jobs 2] [--timeout 20]
                                    [--only CATEGORY] [--list] [--case ID] [--keep DIR]

Copy the binaries first (the build directory changes under you while someone builds):
    mkdir -p /tmp/hostile-bin && cp build/bin/dtlab-cli build/bin/dtlab /tmp/hostile-bin/

Outcomes:
  clean error     exit 2 (3: a collective failed; dtlab scripts and lessons may end with 1, as
                  documented), stderr one line starting "dtlab-cli: " / "dtlab: ", no named output
                  or temp file (*.tmp.*) left behind
  ran             exit 0 where the input is valid (cases generated as expected-ok or either)
  crash           killed by a signal, "internal error", "terminate called", sanitizer output, or an
                  exit code the case does not allow
  hang            not finished within --timeout seconds (the process group is killed), or rank
                  processes left running after their launcher ended
  silently wrong  exit 0 on input that must be refused, a non-finite loss or checkpoint after exit
                  0, an output or temp file left behind by a failed run, a failed save that changed
                  the previous file, or the wrong rank blamed for a fault
  untidy error    refused with an allowed exit code, but stderr is not the one-sentence form
  refused valid   exit 2/3 on input generated as valid

Every child runs under `ulimit -v` (4 GiB), so an input that makes a binary allocate without bound
fails fast instead of exhausting the shared machine. Exit code 1 when any case crashed, hung or was
silently wrong; 0 otherwise. Python 3 standard library only.
"""

import argparse
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor

CATEGORIES = ["flags", "figures", "safetensors", "sharded", "npz", "csv", "lessons", "multiprocess", "traces"]
OUTCOMES = ["clean error", "ran", "crash", "hang", "silently wrong", "untidy error", "refused valid"]
FAILING = ("crash", "hang", "silently wrong")
MEM_LIMIT_KB = 4 * 1024 * 1024
CRASH_MARKERS = ["internal error", "terminate called", "Assertion", "AddressSanitizer", "runtime error:",
                 "ThreadSanitizer", "LeakSanitizer", "Segmentation fault", "stack smashing", "double free",
                 "free(): ", "malloc(): ", "Aborted", "core dumped"]
MODEL = "mlp:2,4,3"
PARAMS = {"0.weight": [4, 2], "0.bias": [4], "2.weight": [3, 4], "2.bias": [3]}


# ----------------------------------------------------------------------------------------------
# cases and results

class Case:
    """One hostile input: what to run, what is acceptable, and what to check afterwards."""

    def __init__(self, cat, name, argv, expect="error", prog="cli", codes=(2,), outputs=(), unchanged=(),
                 tidy="one", check=None, err_check=None, runner=None, stdin=None, env=None):
        self.cat, self.name, self.argv, self.expect, self.prog = cat, name, list(argv), expect, prog
        self.env = dict(env or {})  # variables the case sets (a fake peer's runner adds MASTER_PORT)
        self.codes, self.outputs, self.unchanged, self.tidy = tuple(codes), list(outputs), dict(unchanged), tidy
        self.check, self.err_check, self.runner, self.stdin = check, err_check, runner, stdin
        self.id = ""
        self.dir = ""

    def command(self, bins, shown=False):
        exe = {"cli": "dtlab-cli", "gui": "dtlab"}[self.prog]
        argv = [os.path.join(bins, exe)] + self.argv
        if self.prog == "gui" and shown:
            argv = ["xvfb-run", "-a"] + argv
        return argv

    def repro(self, bins):
        cmd = "ulimit -v %d; " % MEM_LIMIT_KB + "".join("%s=%s " % (k, shlex.quote(v)) for k, v in self.env.items())
        cmd += " ".join(shlex.quote(a) for a in self.command(bins, True))
        if self.stdin is not None:
            cmd += " < " + shlex.quote(self.stdin)
        return "cd %s && (%s)" % (shlex.quote(self.dir), cmd)


class Result:
    def __init__(self):
        self.rc = None
        self.timed_out = False
        self.stdout = ""
        self.stderr = ""
        self.wall = 0.0
        self.note = ""           # what a custom runner saw (kills, leftovers)
        self.verdict = None       # a custom runner's own outcome, with reason
        self.reason = ""


def read_capture(path, limit=1 << 19):
    """The whole capture, or its first and last `limit` bytes when it is longer."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(0)
            if size <= 2 * limit:
                data = f.read()
            else:
                data = f.read(limit) + b"\n[... %d bytes ...]\n" % (size - 2 * limit)
                f.seek(size - limit)
                data += f.read()
        return data.decode("utf-8", "replace")
    except OSError:
        return ""


class Runner:
    """Runs cases; every child in its own session so a hang is killed with its whole group."""

    def __init__(self, bins, timeout, display):
        self.bins, self.timeout, self.display = bins, timeout, display
        self.env = dict(os.environ)
        self.env.pop("DTLAB_DEVICE", None)

    def env_for(self, case):
        env = dict(self.env)
        env.update(case.env)
        if case.prog == "gui":
            env["DISPLAY"] = self.display
            env["XDG_CONFIG_HOME"] = os.path.join(case.dir, ".config")
            env["XDG_STATE_HOME"] = os.path.join(case.dir, ".state")
        return env

    def spawn(self, case, out, err):
        argv = ["/bin/sh", "-c", "ulimit -v %d; ulimit -c 0; exec \"$@\"" % MEM_LIMIT_KB, "sh"] + case.command(self.bins)
        stdin = open(os.path.join(case.dir, case.stdin), "rb") if case.stdin else subprocess.DEVNULL
        try:
            return subprocess.Popen(argv, cwd=case.dir, stdout=out, stderr=err, stdin=stdin,
                                    env=self.env_for(case), start_new_session=True)
        finally:
            if case.stdin:
                stdin.close()

    def run(self, case):
        if case.runner:
            return case.runner(self, case)
        return self.execute(case)

    def execute(self, case, during=None, after=None):
        """Runs one case to its end or the timeout; during(p, res) runs once the process has
        started, after(p, res) once it has ended (both for the multi-process runners)."""
        res = Result()
        out_path, err_path = os.path.join(case.dir, ".stdout"), os.path.join(case.dir, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            p = self.spawn(case, out, err)
            if during:
                during(p, res)
            try:
                res.rc = p.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                res.timed_out = True
                kill_group(p)
                res.rc = p.wait()
            if after:
                after(p, res)
            res.wall = time.monotonic() - t0
        kill_group(p)  # anything the case started and left behind
        res.stdout, res.stderr = read_capture(out_path), read_capture(err_path)
        return res


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------------------------
# classification

def stderr_lines(text):
    return [l for l in text.splitlines() if l.strip()]


def tidy_error(case, res):
    prefix = "dtlab-cli: " if case.prog == "cli" else "dtlab: "
    lines = stderr_lines(res.stderr)
    if not lines:
        return False
    if len(lines[0]) > 4096:  # a sentence, not the input echoed back
        return False
    if case.tidy == "one":
        return len(lines) == 1 and lines[0].startswith(prefix)
    if case.tidy == "first":  # a sentence, then the schedule grid it refers to
        return lines[0].startswith(prefix) and not any(l.startswith(prefix) for l in lines[1:])
    if case.tidy == "ranks":  # launch: each rank's sentence, prefixed, then the launcher's
        return all(re.match(r"^(\[rank \d+\] )?dtlab-cli: ", l) for l in lines)
    return True


def leftovers(case):
    """Named outputs and temp files a failed run left behind."""
    found = []
    for o in case.outputs:
        if o in case.unchanged:
            continue
        if os.path.lexists(os.path.join(case.dir, o)):
            found.append(o)
    for root, dirs, files in os.walk(case.dir):
        for f in files + dirs:
            if ".tmp." in f:
                found.append(os.path.relpath(os.path.join(root, f), case.dir))
    return found


def changed_files(case):
    bad = []
    for path, data in case.unchanged.items():
        try:
            with open(os.path.join(case.dir, path), "rb") as f:
                now = f.read()
        except OSError:
            now = None
        if now != data:
            bad.append(path)
    return bad


def classify(case, res):
    """Returns (outcome, reason)."""
    if res.verdict:
        return res.verdict, res.reason
    first = (stderr_lines(res.stderr) or [""])[0][:300]
    if res.timed_out:
        return "hang", "no exit within the timeout; killed (%s)" % (first or "no stderr")
    if res.rc is None or res.rc < 0:
        sig = -res.rc if res.rc is not None else 0
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return "crash", "killed by %s; stderr: %s" % (name, first or "(empty)")
    text = res.stderr + "\n" + res.stdout
    for m in CRASH_MARKERS:
        if m in text:
            line = next((l for l in text.splitlines() if m in l), m)
            return "crash", "exit %d with '%s'" % (res.rc, line.strip()[:300])
    if res.rc == 0:
        if case.expect == "error":
            why = case.check(case, res) if case.check else None
            return "silently wrong", "exit 0 on input that must be refused" + ("; " + why if why else "")
        left = [l for l in leftovers(case) if ".tmp." in l]
        if left:
            return "silently wrong", "exit 0 but temp files left: " + ", ".join(left)
        if case.check:
            why = case.check(case, res)
            if why:
                return "silently wrong", why
        return "ran", ""
    if res.rc in case.codes:
        left = leftovers(case)
        if left:
            return "silently wrong", "exit %d but left %s behind; stderr: %s" % (res.rc, ", ".join(left), first)
        changed = changed_files(case)
        if changed:
            return "silently wrong", "exit %d but changed %s, which a failed run must keep; stderr: %s" % (
                res.rc, ", ".join(changed), first)
        if case.err_check:
            why = case.err_check(case, res)
            if why:
                return "silently wrong", why
        if not tidy_error(case, res):
            lines = stderr_lines(res.stderr)
            return "untidy error", "exit %d, stderr %d lines (the first %d characters long): %s" % (
                res.rc, len(lines), len(lines[0]) if lines else 0, " | ".join(l[:200] for l in lines[:3]))
        if case.expect == "ok":
            return "refused valid", "exit %d: %s" % (res.rc, first)
        return "clean error", ""
    return "crash", "unexpected exit code %d; stderr: %s" % (res.rc, first or "(empty)")


# ----------------------------------------------------------------------------------------------
# post-run checks

def json_objects(text):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                pass


def check_losses(case, res):
    for o in json_objects(res.stdout):
        for k in ("loss", "train_loss"):
            if k in o:
                v = o[k]
                if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
                    return "exit 0 but %s is %s at %s (trained on non-finite values)" % (
                        k, v, "step %s" % o["step"] if "step" in o else "the summary")
    return None


def st_parse(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n].decode("utf-8")), raw[8 + n:]


def check_saved(name):
    def check(case, res):
        path = os.path.join(case.dir, name)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            raw = f.read()
        try:
            header, data = st_parse(raw)
        except Exception:
            return "exit 0 but the saved %s is not a readable safetensors file" % name
        for k, v in header.items():
            if k == "__metadata__" or v.get("dtype") != "F32":
                continue
            b, e = v["data_offsets"]
            vals = struct.unpack("<%df" % ((e - b) // 4), data[b:e])
            bad = [x for x in vals if not math.isfinite(x)]
            if bad:
                return "exit 0 but the saved %s holds %d non-finite values in %s (e.g. %s)" % (name, len(bad), k, bad[0])
        return None
    return check


def all_checks(*checks):
    def check(case, res):
        for c in checks:
            why = c(case, res)
            if why:
                return why
        return None
    return check


TRAIN_CHECK = all_checks(check_losses, check_saved("out.safetensors"))


def blames(rank_expected, text_of):
    """err_check: the diagnosis must name rank_expected as the missing / late rank."""
    def check(case, res):
        culprits = diagnosed_ranks(text_of(res))
        if culprits and rank_expected not in culprits:
            return "exit %d but the diagnosis blames rank %s, not rank %d: %s" % (
                res.rc, ", ".join(map(str, sorted(culprits))), rank_expected, stderr_lines(res.stderr)[0][:400])
        if not culprits:
            return "exit %d but no rank is named as the cause: %s" % (res.rc, " | ".join(stderr_lines(res.stderr))[:400])
        return None
    return check


# How a diagnosis names the rank at fault, most explicit first: the first kind that matches wins,
# so "rank 1 skipped #2 ...; the last message from rank 0 was ..." blames rank 1 only.
BLAME_PATTERNS = [
    [r"rank (\d+) skipped collective", r"rank (\d+) was killed", r"rank (\d+) (?:is|was) stopped",
     r"rank (\d+) \(pid \d+\) is stopped"],
    [r"rank (\d+) missing", r"ranks? ([\d, ]+) (?:are |is )?missing", r"missing: ranks? ([\d, ]+)"],
    [r"waiting for data from rank (\d+)", r"lost rank (\d+)", r"lost (?:the )?connection (?:to|with) rank (\d+)"],
]


def diagnosed_ranks(line):
    for group in BLAME_PATTERNS:
        found = set()
        for pat in group:
            for m in re.finditer(pat, line):
                found.update(int(r) for r in re.findall(r"\d+", m.group(1)))
        if found:
            return found
    return set()


def launch_diagnosis(res):
    """The failing rank's own sentence, as `launch` names the failing rank in its last line."""
    lines = stderr_lines(res.stderr)
    last = next((l for l in reversed(lines) if "launch: rank" in l), "")
    m = re.search(r"launch: rank (\d+) (was killed|was stopped|exited)", last)
    if not m:
        return " ".join(lines)
    r = int(m.group(1))
    if m.group(2) != "exited":
        return "rank %d %s" % (r, m.group(2))
    if r == 0:
        own = [l for l in lines if l.startswith("dtlab-cli: ") and "launch:" not in l]
    else:
        own = [l[len("[rank %d] " % r):] for l in lines if l.startswith("[rank %d] dtlab-cli: " % r)]
    return own[0] if own else last


# ----------------------------------------------------------------------------------------------
# file builders (safetensors, npy, npz)

def st_bytes(header, data, hlen=None, pad=True, raw_header=None):
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode("utf-8")
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if hlen is None else hlen
    return struct.pack("<Q", n & 0xFFFFFFFFFFFFFFFF) + text + data


def npy_bytes(descr, shape, body, fortran=False, version=(1, 0), header=None, magic=b"\x93NUMPY"):
    if header is None:
        shp = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shp)
    h = header.encode("latin-1") if isinstance(header, str) else header
    lenfmt = "<H" if version[0] == 1 else "<I"
    pre = len(magic) + 2 + struct.calcsize(lenfmt)
    h += b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    return magic + bytes(version) + struct.pack(lenfmt, len(h)) + h + body


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def i64(vals):
    return struct.pack("<%dq" % len(vals), *vals)


def npz_bytes(members, compress=False):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
            for name, data in members:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
                z.writestr(info, data)
    return buf.getvalue()


N_ROWS, N_FEAT = 30, 2


def data_xy(seed=0):
    rnd = random.Random(seed)
    x = [rnd.gauss(0, 1) for _ in range(N_ROWS * N_FEAT)]
    y = [i % 3 for i in range(N_ROWS)]
    return x, y


def npz_xy(x, y, xdescr="<f4", ydescr="<i8", xshape=None, yshape=None, compress=False, xbody=None, ybody=None):
    xs = xshape if xshape is not None else (len(x) // N_FEAT, N_FEAT)
    ys = yshape if yshape is not None else (len(y),)
    xb = xbody if xbody is not None else f32(x)
    yb = ybody if ybody is not None else i64(y)
    return npz_bytes([("x.npy", npy_bytes(xdescr, xs, xb)), ("y.npy", npy_bytes(ydescr, ys, yb))], compress)


# ----------------------------------------------------------------------------------------------
# the corpus

class Corpus:
    def __init__(self, root, bins):
        self.root, self.bins = root, bins
        self.cases = []
        self.base = os.path.join(root, "base")
        self.work = os.path.join(root, "work")
        os.makedirs(self.base, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        self.counter = {}

    def add(self, case, files=None):
        n = self.counter.get(case.cat, 0) + 1
        self.counter[case.cat] = n
        slug = re.sub(r"[^A-Za-z0-9]+", "-", case.name).strip("-")[:48] or "case"
        case.id = "%s-%03d-%s" % (case.cat, n, slug)
        case.dir = os.path.join(self.work, case.id)
        os.makedirs(case.dir, exist_ok=True)
        for path, data in (files or {}).items():
            full = os.path.join(case.dir, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if isinstance(data, str):
                data = data.encode("utf-8")
            with open(full, "wb") as f:
                f.write(data)
        self.cases.append(case)
        return case

    # -- base artifacts made by the binary itself ------------------------------------------------

    def make_base(self):
        cli = os.path.join(self.bins, "dtlab-cli")

        def run(args):
            p = subprocess.run([cli] + args, cwd=self.base, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                sys.exit("hostile_corpus: making the base artifacts failed: dtlab-cli %s: exit %d: %s" % (
                    " ".join(args), p.returncode, p.stderr.strip()))

        run(["train", "--steps", "1", "--model", MODEL, "--batch", "8", "--save", "base.safetensors"])
        sonnets = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "shakespeare_sonnets.txt")
        run(["train", "--steps", "1", "--model", GPT, "--batch", "4", "--data", "text:" + sonnets, "--save", "gpt.safetensors"])
        with open(os.path.join(self.base, "gpt.safetensors"), "rb") as f:
            self.gpt_ckpt = f.read()
        run(["train", "--strategy", "fsdp", "--world", "2", "--steps", "1", "--model", MODEL, "--batch", "8",
             "--save-sharded", "sharded"])
        for name, args in (("1f1b", ["--schedule", "1f1b", "--stages", "2", "--microbatches", "2"]),
                           ("zbh1", ["--schedule", "zb-h1", "--stages", "2", "--microbatches", "2"]),
                           ("inter", ["--schedule", "interleaved", "--stages", "2", "--microbatches", "2", "--chunks", "2"]),
                           ("gpipe", ["--schedule", "gpipe", "--stages", "4", "--microbatches", "4"])):
            run(["schedule"] + args + ["--csv", name + ".csv"])
        with open(os.path.join(self.base, "base.safetensors"), "rb") as f:
            self.ckpt = f.read()
        self.ckpt_header, self.ckpt_data = st_parse(self.ckpt)
        self.ckpt_hlen = struct.unpack("<Q", self.ckpt[:8])[0]
        self.shard_files = {}
        for f in sorted(os.listdir(os.path.join(self.base, "sharded"))):
            with open(os.path.join(self.base, "sharded", f), "rb") as fh:
                self.shard_files[f] = fh.read()
        self.index = json.loads(self.shard_files["index.json"])
        self.csv = {}
        for name in ("1f1b", "zbh1", "inter", "gpipe"):
            with open(os.path.join(self.base, name + ".csv")) as f:
                self.csv[name] = f.read()

    def build(self):
        self.make_base()
        gen_flags(self)
        gen_figures(self)
        gen_safetensors(self)
        gen_sharded(self)
        gen_npz(self)
        gen_csv(self)
        gen_lessons(self)
        gen_multiprocess(self)
        gen_traces(self)


# ---- 1. flags ---------------------------------------------------------------------------------

TINY = ["--model", MODEL, "--batch", "8", "--steps", "1"]


def merge(base, extra):
    """base's flags with the ones extra gives again left out (a repeated flag is refused, which
    would hide what the case means to test), then extra."""
    extra = list(extra)
    given = set(a for a in extra if a.startswith("--"))
    if "--epochs" in given:
        given.add("--steps")
    out, i = [], 0
    while i < len(base):
        t = base[i]
        if t.startswith("--") and t in given:
            i += 2 if i + 1 < len(base) and not base[i + 1].startswith("--") else 1
            continue
        out.append(t)
        i += 1
    return out + extra


def tiny(*extra):
    return ["train"] + merge(TINY, extra)

TRAIN_INT_BAD = {
    "--world": ["0", "-1", "65", "9223372036854775808", "nan", "1.5"],
    "--batch": ["0", "-1", "1048577", "9223372036854775808", "", "0x10"],
    "--steps": ["0", "-1", "1099511627777", "18446744073709551616", "1e3", "٣"],
    "--epochs": ["0", "-1", "1073741825", "nan", " 1"],
    "--seed": ["-1", "4294967296", "18446744073709551615", "x"],
    "--log-every": ["0", "-1", "1099511627777", "+3"],
    "--threads": ["-1", "257", "2147483648", "inf"],
    "--accum": ["0", "-1", "1048577", "2147483648"],
    "--node-size": ["0", "65", "-1"],
    "--skip-layer": ["-1", "1048577", "9223372036854775808"],
    "--skip-every": ["0", "-1", "1099511627777"],
    "--monitor": ["0", "65536", "-1"],
    "--stages": ["0", "65", "-1"],
    "--microbatches": ["0", "4097", "-1"],
    "--chunks": ["0", "65", "-1"],
    "--dp": ["0", "65", "-1"],
}
TRAIN_FLOAT_BAD = {
    "--lr": [("nan", "error"), ("inf", "error"), ("-1", "error"), ("0", "error"), ("1e308", "error"), ("", "error"),
             ("1e-400", "error"), ("0x1p-3", "either")],
    "--momentum": [("nan", "error"), ("-inf", "error"), ("1e308", "either"), ("-1", "either"), ("1,5", "error")],
    "--weight-decay": [("nan", "error"), ("inf", "error"), ("-1", "either"), ("1e308", "either")],
    "--bucket-cap-mb": [("nan", "error"), ("0", "either"), ("-1", "either"), ("1e308", "either"), ("1e-300", "either")],
    "--first-bucket-mb": [("nan", "error"), ("-1", "either"), ("1e308", "either")],
    "--monitor-wait": [("nan", "error"), ("-1", "either"), ("1e308", "either")],
    "--timeout": [("nan", "error"), ("inf", "error"), ("0", "either"), ("-1", "either"), ("1e308", "either"),
                  ("1e-300", "either")],
}


def gen_flags(c):
    gen_flags_cli(c)
    gen_flags_train(c)
    gen_flags_eval(c)
    gen_flags_subcommands(c)
    gen_flags_launch(c)
    gen_flags_lab(c)


def gen_flags_cli(c):
    """The command line itself: subcommands at the top, flag syntax."""
    cat = "flags"
    # subcommands at the top
    for args, exp, name in (([], "error", "no subcommand"), (["bogus"], "error", "unknown subcommand"),
                            ([""], "error", "empty subcommand"), (["bench"], "error", "bench without what"),
                            (["tr\u00e4in"], "error", "unicode subcommand"), (["--version"], "ok", "version"),
                            (["train", "--help"], "ok", "train help"), (["x" * 100000], "error", "100k-char argument"),
                            (["train", "--steps=1", "--model=" + MODEL, "--batch=8"], "ok", "equals form"),
                            (["train"] + TINY + ["extra", "positional"], "error", "positional junk"),
                            (tiny("--steps", "1", "--steps", "2"), "error", "repeated flag"),
                            (["train"] + TINY + ["--bogus-flag"], "error", "unknown flag"),
                            (["train"] + TINY + ["-"], "error", "lone dash"),
                            (["train", "--steps"], "error", "missing value at end"),
                            (["train", "--model", "--steps", "1"], "error", "flag as value"),
                            (["train"] + TINY + ["--epochs", "1"], "error", "steps and epochs"),
                            (tiny("--model", MODEL, "--model", MODEL), "error", "repeated model")):
        c.add(Case(cat, "cli " + name, args, exp))


def gen_flags_train(c):
    """train: bad numbers, bad strings and combinations, allowed boundaries."""
    cat = "flags"
    # train: every numeric flag with bad values
    for opt, vals in TRAIN_INT_BAD.items():
        for v in vals:
            c.add(Case(cat, "train %s %s" % (opt, v or "empty"), tiny(opt, v), "error"))
    for opt, vals in TRAIN_FLOAT_BAD.items():
        for v, exp in vals:
            c.add(Case(cat, "train %s %s" % (opt, v or "empty"), tiny(opt, v), exp))
    # train: strings and combinations
    huge_model = "mlp:2," + ",".join(["4"] * 20000) + ",3"
    strings = [
        (["--strategy", "bogus"], "error"), (["--strategy", ""], "error"), (["--optimizer", "lion"], "error"),
        (["--profile", "warp9"], "error"), (["--trace-clock", "sundial"], "error"), (["--sharding", "half"], "error"),
        (["--wrap", "blanket"], "error"), (["--backward-prefetch", "later"], "error"), (["--schedule", "2f2b"], "error"),
        (["--device", "tpu"], "error"), (["--device", "cuda"], "error"), (["--backend", "nccl"], "error"),
        (["--backend", "mpi"], "error"), (["--backend", "socket"], "error"),
        (["--model", "mlp:"], "error"), (["--model", "mlp:2"], "error"), (["--model", "mlp:0,4,3"], "error"),
        (["--model", "mlp:2,-4,3"], "error"), (["--model", "mlp:2,,3"], "error"), (["--model", "mlp:2,4,3,"], "error"),
        (["--model", "mlp:2,4.5,3"], "error"), (["--model", "mlp:2,99999999999999999999,3"], "error"),
        (["--model", "mlp:2,65536,65536,3"], "error"), (["--model", "mlp:2,40000,40000,3"], "error"),
        (["--model", huge_model], "either"), (["--model", "mlp:2,\u0664,3"], "error"), (["--model", "cnn:2,4,3"], "error"),
        (["--model", "mlp:3,4,3"], "error"),
        (["--data", "spiral:classes=0"], "error"), (["--data", "spiral:points=1000000000000"], "error"),
        (["--data", "spiral:noise=nan"], "error"), (["--data", "spiral:noise=-1"], "error"),
        (["--data", "spiral:classes=4"], "error"), (["--data", "spiral:bogus=1"], "error"),
        (["--data", "spiral:classes=3,classes=2"], "either"), (["--data", "spiral:"], "either"),
        (["--data", "blobs:dim=0"], "error"), (["--data", "blobs:dim=3"], "error"),
        (["--data", "blobs:spread=inf"], "error"), (["--data", "blobs:points=-5"], "error"),
        (["--data", "missing.npz"], "error"), (["--data", "/dev/zero"], "error"), (["--data", "."], "error"),
        (["--data", ""], "error"), (["--data", "spiral:classes=3,points=100000,seed=99999999999999999999"], "error"),
        (["--split", "1,1"], "error"), (["--save", ""], "error"), (["--save", "nodir/x.safetensors"], "error"),
        (["--save", "."], "error"), (["--save", "/proc/version"], "error"), (["--trace", ""], "error"),
        (["--trace", "nodir/t.json"], "error"), (["--save-sharded", "sh"], "error"), (["--init", ""], "error"),
        (["--init", "missing.safetensors"], "error"), (["--init", "/dev/null"], "error"),
        (["--skip-layer", "2"], "error"), (["--strategy", "ddp", "--world", "2", "--find-unused-parameters",
                                            "--static-buckets"], "either"),
        (["--strategy", "pipeline", "--batch", "7", "--microbatches", "4"], "error"),
        (["--strategy", "pipeline", "--stages", "4"], "error"),
        (["--strategy", "pipeline", "--schedule", "1f1b", "--chunks", "2"], "error"),
        (["--strategy", "pipeline", "--split", "0,2"], "error"), (["--strategy", "pipeline", "--split", "1,x"], "error"),
        (["--strategy", "pipeline", "--split", "-1,3"], "error"), (["--strategy", "pipeline", "--split", "1,1,1"], "error"),
        (["--strategy", "ddp", "--world", "2", "--dp", "2"], "either"),
        (["--strategy", "fsdp", "--world", "2", "--sharding", "hybrid", "--node-size", "3"], "error"),
        (["--strategy", "single", "--world", "2"], "either"),
        (["--monitor", "29999"], "error"),
        (["--fault", "skip"], "error"), (["--fault", "skip:rank=1"], "error"), (["--fault", "explode:rank=1,collective=1"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "skip:rank=2,collective=1"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "skip:rank=-1,collective=1"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "skip:rank=0,collective=-1"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "skip:rank=0,collective=99999999999999999999"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "delay:rank=1,collective=1,ms=-5"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "delay:rank=1,collective=1,ms=nan"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "delay:rank=1,collective=1,ms=1e300"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "delay:rank=1,collective=1,ms=9223372036854775807"], "error"),
        (["--strategy", "ddp", "--world", "2", "--fault", "skip:rank=1,collective=1,rank=0"], "error"),
    ]
    for extra, exp in strings:
        shown = " ".join(a if len(a) < 40 else a[:20] + "..." for a in extra) or "empty"
        outputs = []
        for flag in ("--save", "--trace"):
            if flag in extra:
                v = extra[extra.index(flag) + 1]
                if v and not v.startswith("/") and v != ".":
                    outputs.append(v)
        c.add(Case(cat, "train " + shown, tiny(*extra, "--timeout", "2"), exp, codes=(2, 3),
                   outputs=outputs))
    # a fault that fires: exit 3, naming rank 1
    c.add(Case(cat, "train ddp skip fault diagnosed",
               ["train", "--strategy", "ddp", "--world", "2", "--model", MODEL, "--batch", "8", "--steps", "2",
                "--timeout", "1", "--fault", "skip:rank=1,collective=2"], "error", codes=(3,),
               err_check=blames(1, lambda r: stderr_lines(r.stderr)[0] if stderr_lines(r.stderr) else "")))
    # boundary values that are allowed: the run must go through
    for extra in (["--world", "64", "--strategy", "ddp"], ["--batch", "1048576"], ["--seed", "4294967295"],
                  ["--threads", "0"], ["--lr", "1e-12"], ["--log-every", "1099511627776"], ["--skip-every", "1099511627776"],
                  ["--momentum", "0", "--optimizer", "sgd"], ["--epochs", "1", "--batch", "1024"],
                  ["--strategy", "pipeline", "--microbatches", "8"], ["--strategy", "fsdp", "--world", "3", "--sharding", "zero1"],
                  ["--timeout", "0.001"], ["--data", "spiral:classes=3,points=1"], ["--model", "mlp:2,1,3"]):
        c.add(Case(cat, "train valid " + " ".join(extra), tiny(*extra, "--json"), "ok", check=TRAIN_CHECK))
    # a save over an existing good checkpoint that fails must keep it
    c.add(Case(cat, "train failing run keeps old save",
               tiny("--data", "missing.npz", "--save", "keep.safetensors"), "error",
               outputs=["keep.safetensors"], unchanged={"keep.safetensors": c.ckpt}),
          files={"keep.safetensors": c.ckpt})


def gen_flags_eval(c):
    """eval: its flags and a missing or unusable --init."""
    cat = "flags"
    # eval
    ev = ["eval", "--init", "m.safetensors"]
    files = {"m.safetensors": c.ckpt}
    for extra, exp, outs in (([], "ok", []), (["--batch", "0"], "error", []), (["--batch", "16777216"], "ok", []),
                             (["--batch", "-1"], "error", []), (["--threads", "257"], "error", []),
                             (["--logits", ""], "error", []), (["--logits", "nodir/l.npy"], "error", ["nodir/l.npy"]),
                             (["--logits", "."], "error", []), (["--model", "mlp:2,4,4"], "error", []),
                             (["--model", "mlp:2,8,3"], "error", []), (["--data", "bogus"], "error", []),
                             (["--data", "spiral:classes=5"], "error", []), (["--json", "--logits", "l.npy"], "ok", [])):
        c.add(Case(cat, "eval " + (" ".join(extra) or "plain"), ev + extra, exp, outputs=outs), files=files)
    for args, name in ((["eval"], "no init"), (["eval", "--init", ""], "empty init"), (["eval", "--init", "."], "dir init"),
                       (["eval", "--init", "missing.safetensors"], "missing init")):
        c.add(Case(cat, "eval " + name, args, "error"))


def gen_flags_subcommands(c):
    """The planning and measuring subcommands: sampler, plan, schedule, bench."""
    cat = "flags"
    # sampler
    for extra, exp in ((["--n", "10", "--world", "4"], "ok"), (["--n", "-1"], "error"), (["--n", "4294967297"], "error"),
                       (["--n", "nan"], "error"), (["--n", "0", "--world", "4"], "either"), (["--n", "10", "--world", "0"], "error"),
                       (["--n", "10", "--world", "65537"], "error"), (["--n", "10", "--world", "4", "--rank", "4"], "error"),
                       (["--n", "10", "--rank", "-1"], "error"), (["--n", "10", "--epoch", "-1"], "error"),
                       (["--n", "10", "--epoch", "1099511627776", "--shuffle"], "ok"),
                       (["--n", "10", "--seed", "4294967296"], "error"), (["--world", "4"], "error"),
                       (["--n", "4294967296", "--world", "65536", "--rank", "0"], "either"),
                       (["--n", "4294967296", "--world", "65536", "--rank", "0", "--shuffle"], "either"),
                       (["--n", "3", "--world", "65536", "--rank", "65535", "--drop-last"], "either")):
        c.add(Case(cat, "sampler " + " ".join(extra), ["sampler"] + extra + ["--json"], exp))
    # plan
    for extra, exp in ((["--params", "7B", "--world", "8"], "ok"), (["--params", "nan", "--world", "8"], "error"),
                       (["--params", "inf", "--world", "8"], "error"), (["--params", "-5", "--world", "8"], "error"),
                       (["--params", "0", "--world", "8"], "either"), (["--params", "1e308", "--world", "8"], "either"),
                       (["--params", "1e400", "--world", "8"], "error"), (["--params", "7X", "--world", "8"], "error"),
                       (["--params", "", "--world", "8"], "error"), (["--params", "7B", "--world", "0"], "error"),
                       (["--params", "7B", "--world", "1048576", "--node-size", "1048576"], "ok"),
                       (["--params", "7B", "--world", "8", "--node-size", "3", "--strategy", "hybrid"], "either"),
                       (["--params", "7B", "--world", "8", "--node-size", "9"], "error"),
                       (["--params", "7B", "--world", "8", "--dtype", "fp8"], "error"),
                       (["--params", "7B", "--world", "8", "--optimizer", "lion"], "error"),
                       (["--params", "7B", "--world", "8", "--strategy", "zero4"], "error"),
                       (["--params", "7B", "--world", "8", "--unit-params", "8B"], "either"),
                       (["--params", "7B", "--world", "8", "--unit-params", "nan"], "error"),
                       (["--params", "1e30", "--world", "1", "--unit-params", "1e30", "--prefetch"], "either")):
        c.add(Case(cat, "plan " + " ".join(extra), ["plan"] + extra + ["--json"], exp))
    # schedule (flags; files are the csv category)
    for extra, exp, outs in ((["--schedule", "bogus", "--stages", "2", "--microbatches", "2"], "error", []),
                             (["--schedule", "1f1b", "--stages", "0", "--microbatches", "2"], "error", []),
                             (["--schedule", "1f1b", "--stages", "65", "--microbatches", "2"], "error", []),
                             (["--schedule", "1f1b", "--stages", "2", "--microbatches", "1025"], "error", []),
                             (["--schedule", "interleaved", "--stages", "2", "--microbatches", "2", "--chunks", "17"], "error", []),
                             (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--chunks", "2"], "error", []),
                             (["--schedule", "1f1b", "--stages", "2"], "error", []), ([], "error", []),
                             (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--csv", ""], "error", []),
                             (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--csv", "nodir/s.csv"], "error",
                              ["nodir/s.csv"]),
                             (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--csv", "."], "error", []),
                             (["--schedule", "interleaved", "--stages", "4", "--microbatches", "3", "--chunks", "2"], "either", []),
                             (["--schedule", "zb-h1", "--stages", "64", "--microbatches", "1024"], "ok", []),
                             (["--schedule", "interleaved", "--stages", "64", "--microbatches", "1024", "--chunks", "16"], "either", [])):
        c.add(Case(cat, "schedule " + (" ".join(extra) or "no flags"), ["schedule"] + extra + ["--json"], exp, outputs=outs))
    # bench collectives
    small = ["--min-bytes", "4", "--max-bytes", "64", "--iters", "1", "--warmup", "0", "--timeout", "2"]
    for extra, exp in ((["--world", "2"], "ok"), (["--world", "0"], "error"), (["--world", "65"], "error"),
                       (["--min-bytes", "3"], "error"), (["--max-bytes", "2147483649"], "error"),
                       (["--min-bytes", "64", "--max-bytes", "4"], "error"), (["--iters", "0"], "error"),
                       (["--warmup", "-1"], "error"), (["--world", "4", "--root", "4", "--op", "broadcast"], "error"),
                       (["--op", "alltoall"], "error"), (["--algo", "quantum"], "error"),
                       (["--op", "broadcast", "--algo", "naive", "--world", "3"], "either"),
                       (["--timeout", "0"], "either"), (["--timeout", "nan"], "error"), (["--profile", "warp9"], "error"),
                       (["--world", "2", "--fault", "skip:rank=9,collective=1"], "error"),
                       (["--min-bytes", "5", "--max-bytes", "5"], "either"), (["--world", "64"], "ok")):
        args = ["bench", "collectives"] + merge(small, extra)
        c.add(Case(cat, "bench " + " ".join(extra), args, exp, codes=(2, 3)))


def gen_flags_launch(c):
    """launch: its own flags and the command it starts."""
    cat = "flags"
    # launch (flags; faults are the multiprocess category)
    tr = ["--", "train", "--model", MODEL, "--batch", "8", "--steps", "1", "--timeout", "2"]
    for pre, post, exp in (([], tr, "error"), (["--nproc-per-node", "0"], tr, "error"),
                           (["--nproc-per-node", "1025"], tr, "error"), (["--nproc-per-node", "2", "--nnodes", "2"], tr, "error"),
                           (["--nproc-per-node", "2", "--node-rank", "1"], tr, "error"),
                           (["--nproc-per-node", "2", "--master-port", "0"], tr, "error"),
                           (["--nproc-per-node", "2", "--master-port", "65536"], tr, "error"),
                           (["--nproc-per-node", "2", "--timeout", "nan"], tr, "error"),
                           (["--nproc-per-node", "2"], [], "error"),
                           (["--nproc-per-node", "2"], ["--", "eval", "--init", "x"], "error"),
                           (["--nproc-per-node", "2"], tr + ["--backend", "threads"], "error"),
                           (["--nproc-per-node", "2"], tr + ["--bogus"], "error"),
                           (["--nproc-per-node", "2"], tr + ["--strategy", "ddp", "--world", "3"], "either"),
                           (["--nproc-per-node", "2", "--master-addr", ""], tr + ["--strategy", "ddp"], "error"),
                           (["--nproc-per-node", "2", "--master-addr", "256.1.1.1"], tr + ["--strategy", "ddp"], "error"),
                           (["--nproc-per-node", "1"], tr + ["--strategy", "ddp"], "ok"),
                           (["--nproc-per-node", "2"], tr + ["--strategy", "ddp"], "ok")):
        c.add(Case(cat, "launch " + " ".join(pre + post[1:4]), ["launch"] + pre + post, exp, codes=(1, 2, 3), tidy="ranks"))


def gen_flags_lab(c):
    """dtlab (the lab): its own flags, started and quit at once."""
    cat = "flags"
    # the lab's own flags: parse, start and quit
    base = ["--world", "2", "--model", "tiny", "--steps", "20"]
    gui = [
        (["--world", "0"], "error"), (["--world", "17"], "error"), (["--world", "-1"], "error"),
        (["--batch", "0"], "error"), (["--steps", "0"], "error"), (["--lr", "nan"], "error"), (["--lr", "0"], "error"),
        (["--lr", "1e7"], "error"), (["--bucket-cap-mb", "0"], "error"), (["--bucket-cap-mb", "inf"], "error"),
        (["--timeout", "0"], "error"), (["--timeout", "inf"], "error"), (["--speed", "nan"], "error"),
        (["--speed", "-1"], "error"), (["--speed", "1e308"], "error"), (["--width", "100"], "error"),
        (["--height", "1000000000"], "error"), (["--frames", "0"], "error"), (["--bench-frames", "0"], "error"),
        (["--model", "bogus"], "error"), (["--model", "mlp:2,65536,65536,3"], "error"),
        (["--model", "mlp:2,40000,40000,3"], "error"), (["--strategy", "x"], "error"), (["--data", "missing.npz"], "error"),
        (["--lesson", "no_such_lesson", "--play"], "error"), (["--play"], "error"),
        (["--script", "s.txt"], "ok"), (["--screenshot", ""], "error"), (["--attach", "127.0.0.1:1"], "error"),
        (["--attach", "nonsense"], "error"), (["--attach", "127.0.0.1:99999"], "error"), (["--device", "tpu"], "error"),
        (["--backend", "nccl"], "error"), (["--compare", "bogus", "--strategy", "pipeline"], "error"),
        (["--fault", "skip:rank=9,collective=1"], "error"), (["--skip-layer", "99"], "error"), (["--clock", "sundial"], "error"),
        (["--unknown-flag"], "error"), (["--seed", "-1"], "error"), (["--seed", "4294967296"], "error"),
        (["--config-dir", "/dev/null"], "either"),
        (["--world", "16", "--strategy", "fsdp"], "ok"), (["--speed", "0"], "ok"),
    ]
    for extra, exp in gui:
        run = [] if "--play" in extra or "--script" in extra or "--screenshot" in extra else ["--run", "quit"]
        c.add(Case(cat, "dtlab " + " ".join(extra), merge(base, extra) + run, exp, prog="gui", codes=(1, 2) if
                   "--config-dir" in extra else (2,)),
              files={"s.txt": "quit\n"} if "--script" in extra else None)
    # --run together with --script: refused before any window opens
    c.add(Case(cat, "dtlab --script and --run", base + ["--script", "s.txt", "--run", "quit"], "error", prog="gui"),
          files={"s.txt": "quit\n"})
    c.add(Case(cat, "dtlab --screenshot into missing dir", base + ["--screenshot", "nodir/x.png", "--frames", "2"], "error",
               prog="gui", codes=(1, 2), outputs=["nodir/x.png"]))




# ---- 2. safetensors checkpoints ---------------------------------------------------------------

# ---- 1b. figures and outputs (issue 40): what must not come out wrong ------------------------

def still_fifo(name):
    def check(case, res):
        import stat
        st = os.lstat(os.path.join(case.dir, name))
        return None if stat.S_ISFIFO(st.st_mode) else "%s is no longer a FIFO: the save replaced it" % name
    return check


def prints(*parts, absent=()):
    """check: what the run printed (stdout and stderr) says each part and none of `absent`."""
    def check(case, res):
        text = res.stderr + res.stdout
        for p in parts:
            if p not in text:
                return "the output does not say %r" % p
        for p in absent:
            if p in text:
                return "the output says %r" % p
        return None
    return check


def summary_of(res):
    objs = list(json_objects(res.stdout))
    return objs[-1] if objs else {}


def gen_figures(c):
    """Outputs over non-files, figures that came out wrong, valid input refused, misleading messages."""
    cat = "figures"
    # class 4: a FIFO, socket or device at an output path is refused and left as it was
    for flag, args in (("--save", tiny("--save", "pipe")), ("--trace", tiny("--trace", "pipe")),
                       ("--csv", ["schedule", "--csv", "pipe"])):
        case = c.add(Case(cat, "output %s into a FIFO" % flag, args, "error", check=still_fifo("pipe"),
                          err_check=all_checks(still_fifo("pipe"), says("is a FIFO"))))
        os.mkfifo(os.path.join(case.dir, "pipe"))
    c.add(Case(cat, "output --save onto /dev/null", tiny("--save", "/dev/null"), "error", err_check=says("is a device")))
    # class 6: figures
    tp1 = tiny("--strategy", "ddp", "--world", "2", "--tp", "2", "--json")
    c.add(Case(cat, "one replica under --tp: overlap null, not -1", tp1, "ok",
               check=lambda case, res: None if summary_of(res).get("overlap", 0) is None else
               "the summary's overlap is %r, not null" % summary_of(res).get("overlap")))
    c.add(Case(cat, "one replica under --tp: no -100% in words", tiny("--strategy", "ddp", "--world", "2", "--tp", "2"), "ok",
               check=prints("nothing to overlap", absent=("-100%",))))
    c.add(Case(cat, "a NaN loss after the last update", ["train", "--lr", "1e5", "--optimizer", "sgd", "--steps", "3",
                                                        "--save", "m.safetensors"], "error", outputs=["m.safetensors"],
               err_check=says("NaN loss over the training set")))
    for steps in ("0", "5"):
        c.add(Case(cat, "--inject-overflow %s never fires" % steps,
                   tiny("--strategy", "ddp", "--world", "2", "--precision", "fp16", "--inject-overflow", steps),
                   "error", err_check=says("would never fire")))
    c.add(Case(cat, "--drop-last with fewer samples than ranks",
               tiny("--strategy", "ddp", "--world", "4", "--batch", "1", "--drop-last", "--data", "blobs:points=1,classes=3"),
               "error", err_check=says("data-parallel ranks")))
    for extra, what in ((["--hidden", "4098"], "--hidden 4098 is not divisible"),
                        (["--seq", "2050", "--sequence-parallel"], "--seq 2050 is not divisible")):
        args = ["plan", "--params", "7B", "--world", "64", "--tp", "4", "--stages", "4", "--layers", "32", "--hidden", "4096",
                "--seq", "2048", "--micro-batch", "1"]
        args = merge(args, extra)
        c.add(Case(cat, "plan " + " ".join(extra), args, "error", err_check=says(what)))
    for extra in ([], ["--lora-rank", "4"], ["--strategy", "dp", "--world", "3"], ["--precision", "bf16"]):
        args = tiny("--activation-checkpointing", *extra)
        c.add(Case(cat, "checkpointing predicts what it measures " + " ".join(extra), args, "ok",
                   check=prints("predicted", absent=("differs",))))
    # class 8: valid input refused
    c.add(Case(cat, "--algo auto on partial nodes", tiny("--strategy", "ddp", "--world", "6", "--algo", "auto",
                                                         "--profile", "ib2x4", "--model", "mlp:2,1024,1024,3"), "ok"))
    # an allocation failure in a rank thread (not the main thread): that rank fails with a sentence,
    # the process ends (OpenBLAS's exit handler would wait forever for its threads otherwise)
    # (each rank's first activation, 3000 x 1000000 floats, is 12 GB: every rank fails at once)
    for strategy, world, extra in (("ddp", "2", []), ("fsdp", "4", []), ("pipeline", "2", ["--microbatches", "1"])):
        c.add(Case(cat, "a rank's activations larger than memory: %s world %s" % (strategy, world),
                   ["train", "--strategy", strategy, "--world", world, "--model", "mlp:2,1000000,3",
                    "--data", "spiral:points=4000", "--batch", "3000", "--steps", "1"] + extra,
                   "error", err_check=says("out of memory (its last activity: ")))
    # class 9: messages
    c.add(Case(cat, "--lora-rank 2147483647", tiny("--lora-rank", "2147483647"), "error",
               err_check=says("use 0 to 65536", absent=("out of memory",))))
    c.add(Case(cat, "--inject-overflow-rank huge", tiny("--strategy", "ddp", "--world", "2", "--precision", "fp16",
                                                        "--inject-overflow", "1", "--inject-overflow-rank", "99999999999"),
               "error", err_check=says("use 0 to 63", absent=("2147483647",))))
    c.add(Case(cat, "plan --params 1e300", ["plan", "--params", "1e300", "--world", "8"], "error",
               err_check=says("'1e300' is more than 1e15", absent=("1e+30",))))


def st_reference(raw, base_header):
    """What a correct loader must do with raw for model mlp:2,4,3 without --model:
    'error' (refuse), 'ok' (same header, only tensor bytes differ) or 'either' (a valid file whose
    metadata or padding differs)."""
    if len(raw) < 8:
        return "error"
    n = struct.unpack("<Q", raw[:8])[0]
    if n == 0 or n > len(raw) - 8 or n > 100_000_000:
        return "error"
    text = raw[8:8 + n]
    try:
        def no_dups(pairs):
            keys = [k for k, _ in pairs]
            if len(keys) != len(set(keys)):
                raise ValueError("duplicate key")
            return dict(pairs)
        header = json.loads(text.decode("utf-8"), object_pairs_hook=no_dups,
                            parse_constant=lambda s: (_ for _ in ()).throw(ValueError(s)))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "error"
    if not isinstance(header, dict):
        return "error"
    data_size = len(raw) - 8 - n
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or any(not isinstance(v, str) for v in meta.values()):
        return "error"
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if set(tensors) != set(PARAMS):
        return "error"
    spans = []
    for k, v in tensors.items():
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            return "error"
        if v["dtype"] != "F32":
            return "error"
        sh, off = v["shape"], v["data_offsets"]
        if not isinstance(sh, list) or any(type(d) is not int for d in sh) or sh != PARAMS[k]:
            return "error"
        if not isinstance(off, list) or len(off) != 2 or any(type(d) is not int for d in off):
            return "error"
        if off[0] < 0 or off[1] < off[0] or off[1] - off[0] != 4 * math.prod(sh):
            return "error"
        spans.append(tuple(off))
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            return "error"
        pos = e
    if pos != data_size:
        return "error"
    if meta.get("model", MODEL) != MODEL:
        return "error"
    if "step" in meta and not re.fullmatch(r"\d+", meta["step"]):
        return "error"
    if raw[:8 + n] == st_bytes(base_header, b"")[:8 + n] and header == base_header:
        return "ok"
    if {k: v for k, v in header.items() if k != "__metadata__"} != {k: v for k, v in base_header.items() if k != "__metadata__"}:
        return "either"  # the same tensors at other places: a valid file with other values
    return "either"


def st_eval(c, name, data, exp, extra=()):
    """A safetensors case: eval with data as the checkpoint, writing logits."""
    c.add(Case("safetensors", name, ["eval", "--init", "in.safetensors", "--logits", "out.npy"] + list(extra), exp,
               outputs=["out.npy"]), files={"in.safetensors": data})


def st_train(c, name, data, exp):
    """A safetensors case: train one step from data as the checkpoint, saving out.safetensors."""
    c.add(Case("safetensors", "train " + name, ["train", "--init", "in.safetensors", "--steps", "1", "--batch", "8",
                                               "--json", "--save", "out.safetensors"], exp,
               outputs=["out.safetensors"], check=TRAIN_CHECK), files={"in.safetensors": data})


def mutated(header, mut):
    """A deep copy of the JSON header, changed by mut."""
    h = json.loads(json.dumps(header))
    mut(h)
    return h


def gen_safetensors(c):
    st_eval(c, "valid checkpoint", c.ckpt, "ok")
    st_train(c, "valid checkpoint", c.ckpt, "ok")
    gen_safetensors_framing(c)
    gen_safetensors_tensors(c)
    gen_safetensors_header(c)
    gen_safetensors_files(c)
    gen_safetensors_bitflips(c)


def gen_safetensors_framing(c):
    """The framing: truncations, trailing bytes, the header length field."""
    raw, hend = c.ckpt, 8 + c.ckpt_hlen
    # truncations
    for off in sorted(set([0, 1, 4, 7, 8, 9, 10, 50, hend // 2, hend - 1, hend, hend + 1, hend + 16, hend + 50,
                           len(raw) - 4, len(raw) - 1])):
        st_eval(c, "truncated at %d of %d" % (off, len(raw)), raw[:off], "error")
    for off in (8, hend - 3, hend + 20, len(raw) - 1):
        st_train(c, "truncated at %d" % off, raw[:off], "error")
    # trailing bytes
    for extra in (b"\x00", b"abcd", b"\x00" * (1 << 20)):
        st_eval(c, "%d trailing bytes" % len(extra), raw + extra, "error")
    # header length field
    body = raw[8:]
    for n in (0, 1, 7, c.ckpt_hlen - 1, c.ckpt_hlen + 1, len(raw) - 8, len(raw) - 7, 2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63,
              2 ** 64 - 1, 100_000_001):
        st_eval(c, "header length %d" % n, struct.pack("<Q", n) + body, "error")


def gen_safetensors_tensors(c):
    """The tensor entries: dtypes, shapes, offsets, the set of tensors and their names."""
    H, D = c.ckpt_header, c.ckpt_data
    # dtypes
    for v in ("F16", "BF16", "I64", "F64", "f32", "", 5, None, ["F32"], "F32\u0000"):
        st_eval(c, "dtype %r" % (v,), st_bytes(mutated(H, lambda h: h["0.weight"].__setitem__("dtype", v)), D), "error")
    # shapes
    for v in ([4], [2, 4], [4, 2, 1], [-4, -2], [4.0, 2], [2 ** 62, 2 ** 62], [], "42", [True, 2], [8], [2 ** 64, 0],
              [0, 2]):
        st_eval(c, "shape %r" % (v,), st_bytes(mutated(H, lambda h: h["0.weight"].__setitem__("shape", v)), D), "error")
    # offsets
    w0 = H["0.weight"]["data_offsets"]
    for v in ([0, 0], [w0[0], w0[1] + 1], [w0[1], w0[0]], [-32, 0], [0.0, 32.0], [0, 2 ** 64], [0, 2 ** 63],
              [w0[0] + 1, w0[1] + 1], "0,32", [0], [0, 32, 64], [2 ** 63 - 8, 2 ** 63 + 24]):
        st_eval(c, "offsets %r" % (v,), st_bytes(mutated(H, lambda h: h["0.weight"].__setitem__("data_offsets", v)), D),
                "error")
    st_eval(c, "data_offsets missing", st_bytes(mutated(H, lambda h: h["0.weight"].pop("data_offsets")), D), "error")
    b0, b1 = H["0.bias"]["data_offsets"]

    def overlap(h):
        h["0.bias"]["data_offsets"] = [b0 - 8, b1 - 8]
    st_eval(c, "overlapping tensors", st_bytes(mutated(H, overlap), D), "error")

    def swap(h):  # 0.weight and 0.bias trade places: still a valid layout
        wl = w0[1] - w0[0]
        bl = b1 - b0
        h["0.bias"]["data_offsets"] = [w0[0], w0[0] + bl]
        h["0.weight"]["data_offsets"] = [w0[0] + bl, w0[0] + bl + wl]
    st_eval(c, "tensors at swapped places", st_bytes(mutated(H, swap), D), "either")
    # tensor set
    st_eval(c, "tensor 2.bias missing", st_bytes(mutated(H, lambda h: h.pop("2.bias")), D[:H["2.bias"]["data_offsets"][0]]),
            "error")

    def extra_tensor(h):
        h["4.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(D), len(D) + 4]}
    st_eval(c, "extra tensor", st_bytes(mutated(H, extra_tensor), D + f32([1.0])), "error")

    def rename(h):
        h["0.Weight"] = h.pop("0.weight")
    st_eval(c, "tensor renamed", st_bytes(mutated(H, rename), D), "error")
    text = json.dumps(H, separators=(",", ":")).encode()
    dup = text.replace(b'"0.bias":', b'"0.weight":', 1)
    st_eval(c, "duplicate tensor name", st_bytes(None, D, raw_header=dup), "error")

    def empty_name(h):
        h[""] = h.pop("0.weight")
    st_eval(c, "empty tensor name", st_bytes(mutated(H, empty_name), D), "error")

    def nul_name(h):
        h["0.weight\u0000"] = h.pop("0.weight")
    st_eval(c, "tensor name with NUL", st_bytes(mutated(H, nul_name), D), "error")

    def long_name(h):
        h["w" * 100000] = h.pop("0.weight")
    st_eval(c, "100k-char tensor name", st_bytes(mutated(H, long_name), D), "error")


def gen_safetensors_header(c):
    """The header as a whole: its metadata and its JSON structure."""
    H, D = c.ckpt_header, c.ckpt_data
    text = json.dumps(H, separators=(",", ":")).encode()
    # metadata
    for v, exp in (("mlp:2,100000,100000,3", "error"), ("mlp:2,4,4", "error"), ("mlp:", "error"), ("", "error"),
                   ("mlp:99999999999999999999", "error"), ("mlp:2,65536,65536,3", "error"), ("mlp:2,4,3 ", "either"),
                   ("mlp:2," + ",".join(["4"] * 20000) + ",3", "error")):
        st_eval(c, "metadata model %r" % v[:30],
                st_bytes(mutated(H, lambda h: h["__metadata__"].__setitem__("model", v)), D), exp)
    for v, exp in (("-1", "error"), ("1e99", "error"), ("18446744073709551616", "error"), ("", "error"), ("x", "error"),
                   ("9223372036854775807", "either")):
        st_eval(c, "metadata step %r" % v, st_bytes(mutated(H, lambda h: h["__metadata__"].__setitem__("step", v)), D),
                exp)
    for v in ([], None, {"step": 1}, "meta", {"model": ["mlp:2,4,3"]}):
        st_eval(c, "metadata %r" % (v,), st_bytes(mutated(H, lambda h: h.__setitem__("__metadata__", v)), D), "error")
    st_eval(c, "metadata missing", st_bytes(mutated(H, lambda h: h.pop("__metadata__")), D), "either")
    st_eval(c, "metadata missing, --model given", st_bytes(mutated(H, lambda h: h.pop("__metadata__")), D), "ok",
            extra=("--model", MODEL))
    # header structure
    for rawh, name, exp in ((b"[]", "header is a list", "error"), (b'"str"', "header is a string", "error"),
                            (b"1", "header is a number", "error"), (b"null", "header is null", "error"),
                            (b"{}", "header is empty object", "error"),
                            (b"[" * 100000 + b"]" * 100000, "header nested 100k deep (lists)", "error"),
                            (b'{"a":' * 100000 + b"1" + b"}" * 100000, "header nested 100k deep (objects)", "error"),
                            (b"\xef\xbb\xbf" + text, "header with BOM", "either"),
                            (text + b" " * 1000, "header with 1000 spaces of padding", "either"),
                            (text + b"\x00" * 8, "header padded with NULs", "either"),
                            (b"   " + text, "header with leading spaces", "either"),
                            (text.replace(b'"spiral"', b'"spir\xffl"'), "invalid UTF-8 in metadata", "error"),
                            (text[:-1] + b",/*c*/}", "header with a comment", "error"),
                            (text.replace(b'"F32"', b'"\\u0046\\u0033\\u0032"'), "dtype written with escapes", "either")):
        st_eval(c, name, st_bytes(None, D, raw_header=rawh, pad=False), exp)


def gen_safetensors_files(c):
    """Special files as the checkpoint: empty, devices, a directory, a loop, a FIFO."""
    cat = "safetensors"
    # special files
    c.add(Case(cat, "empty file", ["eval", "--init", "in.safetensors"], "error"), files={"in.safetensors": b""})
    for path, name in (("/dev/null", "/dev/null"), ("/dev/zero", "/dev/zero"), ("/dev/urandom", "/dev/urandom"),
                       (".", "a directory"), ("missing.safetensors", "missing file"), ("loop", "a symlink loop"),
                       ("fifo", "a FIFO with no writer")):
        case = c.add(Case(cat, "init is " + name, ["eval", "--init", path], "error"))
        if path == "loop":
            os.symlink("loop", os.path.join(case.dir, "loop"))
        if path == "fifo":
            os.mkfifo(os.path.join(case.dir, "fifo"))


def gen_safetensors_bitflips(c):
    """Random damage at fixed seeds, judged by st_reference."""
    H, raw, hend = c.ckpt_header, c.ckpt, 8 + c.ckpt_hlen
    # bit flips at fixed seeds: a flip in the header must be refused unless the file stays valid
    for seed in range(36):
        rnd = random.Random(1000 + seed)
        pos = rnd.randrange(len(raw))
        bit = rnd.randrange(8)
        flipped = bytearray(raw)
        flipped[pos] ^= 1 << bit
        flipped = bytes(flipped)
        exp = st_reference(flipped, H)
        where = "header" if pos < hend else "data"
        if seed < 28:
            st_eval(c, "bit flip seed %d (byte %d bit %d, %s)" % (seed, pos, bit, where), flipped, exp)
        else:
            st_train(c, "bit flip seed %d (byte %d bit %d, %s)" % (seed, pos, bit, where), flipped,
                     "either" if exp != "error" else "error")
    for seed in range(8):
        rnd = random.Random(2000 + seed)
        pos = rnd.randrange(len(raw) - 8)
        junk = bytes(rnd.randrange(256) for _ in range(8))
        bad = raw[:pos] + junk + raw[pos + 8:]
        st_eval(c, "8 random bytes at %d (seed %d)" % (pos, seed), bad, st_reference(bad, H))



# ---- 3. sharded checkpoints -------------------------------------------------------------------

def gen_sharded(c):
    cat = "sharded"
    rank0, rank1 = "rank-00000-of-00002.safetensors", "rank-00001-of-00002.safetensors"

    def add(name, index=None, files_mut=None, exp="error", extra=(), raw_index=None):
        files = {"ck/" + k: v for k, v in c.shard_files.items()}
        if index is not None or raw_index is not None:
            files["ck/index.json"] = raw_index if raw_index is not None else json.dumps(index, indent=1)
        drop = []
        if files_mut:
            drop = files_mut(files) or []
        for d in drop:
            files.pop("ck/" + d, None)
        c.add(Case(cat, name, ["train", "--init", "ck", "--steps", "1", "--batch", "8", "--json", "--save",
                               "out.safetensors"] + list(extra), exp, outputs=["out.safetensors"], check=TRAIN_CHECK),
              files=files)

    def idx(mut):
        i = json.loads(json.dumps(c.index))
        mut(i)
        return i

    def piece(i, param="0.weight", k=0):
        return i["params"][param]["pieces"][k]

    add("valid sharded checkpoint", exp="ok")
    add("valid, resumed by fsdp world 3", exp="ok", extra=("--strategy", "fsdp", "--world", "3"))
    add("valid, resumed by ddp world 2", exp="ok", extra=("--strategy", "ddp", "--world", "2", "--timeout", "5"))
    for key in ("offset", "length"):
        for v in (2 ** 63, 2 ** 64, 1e30, 0.5, -1, "0", None, True, [0]):
            add("piece %s %r" % (key, v), idx(lambda i: piece(i).__setitem__(key, v)))
    add("piece length 0", idx(lambda i: piece(i).__setitem__("length", 0)))
    for v in ("../" * 8 + "etc/passwd", "/etc/passwd", "", "missing.safetensors", ".", "index.json",
              "a" * 5000, "rank-00000-of-00002.safetensors\u0000x", rank1):
        add("piece file %r" % v[:40], idx(lambda i: piece(i).__setitem__("file", v)))
    for v in ("0.weight@1", "", "2.weight@0", "0.bias@0", 7):
        add("piece tensor %r" % (v,), idx(lambda i: piece(i).__setitem__("tensor", v)))
    add("pieces empty", idx(lambda i: i["params"]["0.weight"].__setitem__("pieces", [])))
    add("one piece missing (gap)", idx(lambda i: i["params"]["0.weight"]["pieces"].pop(1)))
    add("piece duplicated (covered twice)", idx(lambda i: i["params"]["0.weight"]["pieces"].append(
        dict(i["params"]["0.weight"]["pieces"][0]))))

    def overlapping(i):
        p = i["params"]["0.weight"]["pieces"]
        p[1]["offset"] = p[1]["offset"] - 1
    add("pieces overlap by one", idx(overlapping))

    def beyond(i):
        p = i["params"]["0.weight"]["pieces"]
        p.append({"file": rank1, "length": 2, "offset": 8, "tensor": "0.weight@6"})
    add("extra piece past the end", idx(beyond))
    for v in ([], [-4, 2], [4, 3], [2, 4], [2 ** 40, 2 ** 40], [4.5, 2], "4,2", None, [4, 2, 1]):
        add("shape %r" % (v,), idx(lambda i: i["params"]["0.weight"].__setitem__("shape", v)))
    add("param missing", idx(lambda i: i["params"].pop("2.bias")))
    add("extra param", idx(lambda i: i["params"].__setitem__("4.weight", dict(i["params"]["2.bias"]))))
    add("params a list", idx(lambda i: i.__setitem__("params", [])))
    add("pieces an object", idx(lambda i: i["params"]["0.weight"].__setitem__("pieces", {})))
    for key, v, exp in (("format", "dtlab", "error"), ("format", None, "error"), ("model", "mlp:2,4,4", "error"),
                        ("model", "mlp:2,100000,100000,3", "error"), ("model", "", "error"), ("world", -1, "either"),
                        ("world", 2 ** 63, "either"), ("step", -1, "error"), ("step", "x", "error"),
                        ("step", 1.5, "error")):
        add("index %s %r" % (key, v), idx(lambda i: i.__setitem__(key, v)), exp=exp)
    # Index version 2 (a piece's box in the full tensor, written by --tp runs): a version this dtlab
    # does not read, a box in a version 1 index, and boxes that do not fit the tensor.
    for v in (3, 0, "2", 1.5, None):
        add("index version %r" % (v,), idx(lambda i: i.__setitem__("version", v)))
    add("box in a version 1 index", idx(lambda i: (i.pop("version", None), piece(i).__setitem__(
        "box", {"offsets": [0, 0], "sizes": [4, 2]}))))
    for v in ({"offsets": [0, 0], "sizes": [5, 2]}, {"offsets": [0], "sizes": [4]}, {"offsets": [-1, 0], "sizes": [4, 2]},
              {"offsets": [2 ** 63 - 8, 0], "sizes": [4, 2]}, {"offsets": [0, 0], "sizes": [4.5, 2]}, {"sizes": [4, 2]},
              {"offsets": [0, 0], "sizes": [0, 2]}, [0, 0], 7):
        add("piece box %r" % (v,), idx(lambda i: piece(i).__setitem__("box", v)))
    add("index.json empty", raw_index="")
    add("index.json not JSON", raw_index="{not json")
    add("index.json nested 100k deep", raw_index="[" * 100000 + "]" * 100000)
    whole = c.shard_files["index.json"]
    for frac in (0.1, 0.5, 0.9):
        add("index.json truncated at %d%%" % int(frac * 100), raw_index=whole[:int(len(whole) * frac)])
    add("index.json missing", files_mut=lambda f: ["index.json"])
    add("index.json a directory", files_mut=lambda f: f.pop("ck/index.json") and f.__setitem__("ck/index.json/x", b"") and [])
    add("rank 1 file missing", files_mut=lambda f: [rank1])
    add("rank 0 file empty", files_mut=lambda f: f.__setitem__("ck/" + rank0, b""))
    r0 = c.shard_files[rank0]
    for off in (8, len(r0) // 2, len(r0) - 1):
        add("rank 0 file truncated at %d" % off, files_mut=lambda f, off=off: f.__setitem__("ck/" + rank0, r0[:off]))

    def swapped(f):
        f["ck/" + rank0], f["ck/" + rank1] = f["ck/" + rank1], f["ck/" + rank0]
    add("rank files swapped", files_mut=swapped)
    n0 = struct.unpack("<Q", r0[:8])[0]
    for seed in range(6):
        rnd = random.Random(3000 + seed)
        pos = rnd.randrange(8, 8 + n0)
        b = bytearray(r0)
        b[pos] ^= 1 << rnd.randrange(8)
        try:
            h = json.loads(bytes(b[8:8 + n0]).decode())
            same = h == json.loads(r0[8:8 + n0].decode())
            exp = "either"
            if not same:
                exp = "either" if set(h) == set(json.loads(r0[8:8 + n0].decode())) else "error"
        except (ValueError, UnicodeDecodeError):
            exp = "error"
        add("rank 0 header bit flip seed %d (byte %d)" % (seed, pos), files_mut=lambda f, b=bytes(b): f.__setitem__(
            "ck/" + rank0, b), exp=exp)


# ---- 4. npz data ------------------------------------------------------------------------------


NPZ_TRAIN = ["train", "--model", MODEL, "--data", "in.npz", "--batch", "8", "--epochs", "1", "--no-shuffle", "--json",
             "--save", "out.safetensors"]


def npz_train(c, name, data, exp, extra=()):
    """An npz case: train one epoch on data, saving out.safetensors."""
    allow = "--allow-nonfinite" in extra  # then non-finite losses and parameters are what was asked for
    c.add(Case("npz", name, merge(NPZ_TRAIN, extra), exp, outputs=["out.safetensors"],
               check=None if allow else TRAIN_CHECK), files={"in.npz": data})


def npz_eval(c, name, data, exp):
    """An npz case: eval the base checkpoint on data, writing logits."""
    c.add(Case("npz", "eval " + name, ["eval", "--init", "m.safetensors", "--data", "in.npz", "--logits", "out.npy"],
               exp, outputs=["out.npy"]), files={"in.npz": data, "m.safetensors": c.ckpt})


def patch_bytes(data, off, new):
    """data with the bytes at off replaced by new."""
    return data[:off] + new + data[off + len(new):]


GPT = "gpt:layers=1,heads=2,embd=16,ctx=8"
TEXT_TRAIN = ["train", "--model", GPT, "--batch", "4", "--steps", "2", "--save", "out.safetensors"]


def gen_text(c):
    """A GPT's data: UTF-8 text files and .npz token streams, and generate's prompts."""
    verse = ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 4).encode()

    def text_case(name, data, exp, path="in.txt"):
        c.add(Case("npz", "text " + name, merge(TEXT_TRAIN, ["--data", "text:" + path]), exp, outputs=["out.safetensors"]),
              files={"in.txt": data} if data is not None else {})

    text_case("valid verse", verse, "ok")
    text_case("valid, non-ASCII", "Ζεύς και Ἥρα, ὦ φίλε. ".encode() * 8, "ok")
    text_case("empty", b"", "error")
    text_case("one window short", b"abcdefgh", "error")
    text_case("invalid UTF-8 byte", verse[:40] + b"\xff" + verse[40:], "error")
    text_case("truncated sequence at the end", verse + b"\xe2\x82", "error")
    text_case("overlong slash", verse[:20] + b"\xc0\xaf" + verse[20:], "error")
    text_case("UTF-16 surrogate", verse[:20] + b"\xed\xa0\x80" + verse[20:], "error")
    text_case("beyond U+10FFFF", verse[:20] + b"\xf4\x90\x80\x80" + verse[20:], "error")
    text_case("NUL bytes", verse.replace(b" ", b"\x00"), "ok")
    text_case("missing file", None, "error", path="missing.txt")
    text_case("a directory", None, "error", path=".")
    text_case("a device", None, "error", path="/dev/zero")
    c.add(Case("npz", "text: a GPT given points", merge(TEXT_TRAIN, ["--data", "spiral"]), "error", outputs=["out.safetensors"]))
    c.add(Case("npz", "text: an MLP given text", ["train", "--model", MODEL, "--data", "text", "--steps", "1"], "error"))
    toks = list(range(40)) * 3
    for name, member, exp in (
            ("int64", npy_bytes("<i8", (len(toks),), i64(toks)), "ok"),
            ("uint16", npy_bytes("<u2", (len(toks),), struct.pack("<%dH" % len(toks), *toks)), "ok"),
            ("int32 negative", npy_bytes("<i4", (len(toks),), struct.pack("<%di" % len(toks), *([-1] + toks[1:]))), "error"),
            ("2-D", npy_bytes("<i8", (len(toks) // 2, 2), i64(toks)), "error"),
            ("float", npy_bytes("<f4", (len(toks),), f32(toks)), "error"),
            ("too short", npy_bytes("<i8", (5,), i64(toks[:5])), "error"),
            ("truncated body", npy_bytes("<i8", (len(toks),), i64(toks)[:-8]), "error"),
            ("token 2^40", npy_bytes("<i8", (len(toks),), i64([1 << 40] + toks[1:])), "error")):
        c.add(Case("npz", "tokens " + name, merge(TEXT_TRAIN, ["--data", "in.npz"]), exp, outputs=["out.safetensors"]),
              files={"in.npz": npz_bytes([("tokens.npy", member)])})
    for name, args, exp in (
            ("an MLP checkpoint", ["--init", "m.safetensors"], "error"),
            ("a missing checkpoint", ["--init", "nothing.safetensors"], "error"),
            ("a prompt outside the text", ["--init", "g.safetensors", "--prompt", "\u03bb"], "error"),
            ("an empty prompt", ["--init", "g.safetensors", "--prompt", ""], "error"),
            ("a valid prompt", ["--init", "g.safetensors", "--prompt", "Shall", "--tokens", "20"], "ok"),
            ("temperature 0", ["--init", "g.safetensors", "--temperature", "0"], "error"),
            ("top-k larger than the vocabulary", ["--init", "g.safetensors", "--top-k", "100000", "--tokens", "5"], "ok")):
        c.add(Case("npz", "generate: " + name, ["generate"] + args, exp),
              files={"m.safetensors": c.ckpt, "g.safetensors": c.gpt_ckpt})


def gen_npz(c):
    x, y = data_xy()
    good = npz_xy(x, y)
    gen_text(c)
    npz_train(c, "valid npz", good, "ok")
    npz_train(c, "valid npz, deflated", npz_xy(x, y, compress=True), "ok")
    npz_eval(c, "valid npz", good, "ok")
    gen_npz_zip(c, x, y, good)
    gen_npz_headers(c, x, y)
    gen_npz_values(c, x, y)


def gen_npz_zip(c, x, y, good):
    """The zip container: truncations, broken records, wrong members."""
    # truncations
    for off in sorted(set([0, 1, 4, 10, 30, 60, 100, len(good) // 3, len(good) // 2, len(good) - 100, len(good) - 40,
                           len(good) - 22, len(good) - 21, len(good) - 1])):
        npz_train(c, "truncated at %d of %d" % (off, len(good)), good[:off], "error")
    comp = npz_xy(x, y, compress=True)
    for off in (len(comp) // 3, len(comp) - 30):
        npz_train(c, "deflated, truncated at %d" % off, comp[:off], "error")
    # zip structure
    eocd = good.rfind(b"PK\x05\x06")
    cd = good.find(b"PK\x01\x02")

    npz_train(c, "local header signature broken", patch_bytes(good, 0, b"PK\x09\x09"), "error")
    npz_train(c, "central directory signature broken", patch_bytes(good, cd, b"PK\x09\x09"), "error")
    npz_train(c, "EOCD entry count 65535", patch_bytes(good, eocd + 10, struct.pack("<H", 65535)), "error")
    npz_train(c, "EOCD directory offset past end", patch_bytes(good, eocd + 16, struct.pack("<I", 0xFFFFFFF0)), "error")
    npz_train(c, "EOCD directory size huge", patch_bytes(good, eocd + 12, struct.pack("<I", 0xFFFFFFF0)), "error")
    npz_train(c, "compression method 99",
              patch_bytes(patch_bytes(good, cd + 10, struct.pack("<H", 99)), 8, struct.pack("<H", 99)), "error")
    npz_train(c, "encrypted flag",
              patch_bytes(patch_bytes(good, cd + 8, struct.pack("<H", 1)), 6, struct.pack("<H", 1)), "error")
    npz_train(c, "CRC wrong", patch_bytes(good, cd + 16, struct.pack("<I", 0xDEADBEEF)), "error")
    npz_train(c, "sizes 4 GiB in directory",
              patch_bytes(patch_bytes(good, cd + 20, struct.pack("<I", 0xFFFFFFFE)), cd + 24, struct.pack("<I", 0xFFFFFFFE)),
              "error")
    npz_train(c, "name length huge", patch_bytes(good, cd + 28, struct.pack("<H", 65535)), "error")
    npz_train(c, "local offset past end", patch_bytes(good, cd + 42, struct.pack("<I", 0x7FFFFFFF)), "error")
    npz_train(c, "zip64 locator fake", good[:eocd] + b"PK\x06\x07" + struct.pack("<IQI", 0, 2 ** 62, 1) + good[eocd:],
              "error")
    ccd = comp.find(b"PK\x01\x02")
    npz_train(c, "deflate bomb size (4 GiB declared)", patch_bytes(comp, ccd + 24, struct.pack("<I", 0xFFFFFFFE)),
              "error")
    mid = len(comp) // 4
    npz_train(c, "deflate stream corrupted", patch_bytes(comp, mid, bytes(b ^ 0x5A for b in comp[mid:mid + 6])), "error")
    npz_train(c, "not a zip at all", b"\x93NUMPY not a zip" * 10, "error")
    npz_train(c, "a single .npy", npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x)), "error")
    npz_train(c, "empty zip", npz_bytes([]), "error")
    xn, yn = npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x)), npy_bytes("<i8", (N_ROWS,), i64(y))
    npz_train(c, "y missing", npz_bytes([("x.npy", xn)]), "error")
    npz_train(c, "x missing", npz_bytes([("y.npy", yn)]), "error")
    npz_train(c, "x twice", npz_bytes([("x.npy", xn), ("x.npy", xn), ("y.npy", yn)]), "error")
    npz_train(c, "extra member", npz_bytes([("x.npy", xn), ("y.npy", yn), ("z.npy", yn)]), "either")
    npz_train(c, "members in a folder", npz_bytes([("a/x.npy", xn), ("a/y.npy", yn)]), "error")


def gen_npz_headers(c, x, y):
    """The .npy members: dtypes, header texts, shapes."""
    xn, yn = npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x)), npy_bytes("<i8", (N_ROWS,), i64(y))
    # npy headers
    for descr, var, exp in (("<f8", "x", "error"), (">f4", "x", "error"), ("<f2", "x", "error"), ("|b1", "x", "error"),
                            ("<i4", "y", "error"), ("<f4", "y", "error"), ("<u8", "y", "error"), ("|O", "x", "error")):
        if var == "x":
            npz_train(c, "x dtype %s" % descr,
                      npz_bytes([("x.npy", npy_bytes(descr, (N_ROWS, N_FEAT), f32(x))), ("y.npy", yn)]), exp)
        else:
            npz_train(c, "y dtype %s" % descr,
                      npz_bytes([("x.npy", xn), ("y.npy", npy_bytes(descr, (N_ROWS,), i64(y)))]), exp)
    npz_train(c, "x fortran order",
              npz_bytes([("x.npy", npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x), fortran=True)), ("y.npy", yn)]), "either")
    npz_train(c, "npy bad magic",
              npz_bytes([("x.npy", npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x), magic=b"\x93NUMPZ")), ("y.npy", yn)]), "error")
    npz_train(c, "npy version 9.0",
              npz_bytes([("x.npy", npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x), version=(9, 0))), ("y.npy", yn)]), "error")
    npz_train(c, "npy version 2.0",
              npz_bytes([("x.npy", npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x), version=(2, 0))), ("y.npy", yn)]), "ok")
    hl = npy_bytes("<f4", (N_ROWS, N_FEAT), f32(x))
    npz_train(c, "npy header length 65535",
              npz_bytes([("x.npy", hl[:8] + struct.pack("<H", 65535) + hl[10:]), ("y.npy", yn)]), "error")
    for hdr_text, name in (("{'descr': '<f4', 'fortran_order': False}", "shape key missing"),
                           ("['descr', '<f4']", "header a list"), ("", "header empty"),
                           ("{'descr': '<f4', 'fortran_order': False, 'shape': (30, 2), 'shape': (3, 2)}", "shape twice"),
                           ("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (30, 2), }", "fortran_order Maybe"),
                           ("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "(" * 10000 + "30" + ")" * 10000 + ", 2), }",
                            "shape nested 10000 deep"),
                           ("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (30,), }", "structured dtype")):
        npz_train(c, "npy " + name, npz_bytes([("x.npy", npy_bytes("<f4", (), f32(x), header=hdr_text)), ("y.npy", yn)]),
                  "error")
    for shape, name in (((2 ** 40, 2), "x shape 2^40 x 2"), (((2 ** 62), (2 ** 62)), "x shape 2^62 x 2^62"),
                        ((-30, 2), "x shape negative"), ((N_ROWS * N_FEAT,), "x 1-D"), ((N_ROWS, N_FEAT, 1), "x 3-D"),
                        ((), "x scalar"), ((N_ROWS, 3), "x 3 features, body for 2"), ((0, 2), "x no rows"),
                        ((N_ROWS - 1, N_FEAT), "x one row fewer than y"), ((2 ** 63 - 1, 2), "x shape 2^63-1")):
        npz_train(c, name, npz_bytes([("x.npy", npy_bytes("<f4", shape, f32(x))), ("y.npy", yn)]), "error")
    npz_train(c, "y shape (30, 1)", npz_bytes([("x.npy", xn), ("y.npy", npy_bytes("<i8", (N_ROWS, 1), i64(y)))]), "error")
    npz_train(c, "x and y empty", npz_xy([], [], xshape=(0, 2), yshape=(0,)), "error")
    x3 = [v for i in range(N_ROWS) for v in (x[2 * i], x[2 * i + 1], 0.5)]
    npz_train(c, "x with 3 features for mlp:2",
              npz_bytes([("x.npy", npy_bytes("<f4", (N_ROWS, 3), f32(x3))), ("y.npy", yn)]), "error")


def gen_npz_values(c, x, y):
    """The values: non-finite inputs, denormals, labels out of range."""
    # values
    nan, inf = float("nan"), float("inf")
    for row, col, v, name in ((0, 0, nan, "NaN in row 0"), (N_ROWS - 1, 1, nan, "NaN in the last row"),
                              (0, 1, inf, "plus inf in row 0"), (N_ROWS - 1, 0, inf, "plus inf in the last row, feature 0"),
                              (N_ROWS - 1, 1, inf, "plus inf in the last row, feature 1"),
                              (N_ROWS - 1, 0, -inf, "minus inf in the last row, feature 0"),
                              (N_ROWS - 1, 1, -inf, "minus inf in the last row, feature 1"),
                              (13, 0, -inf, "minus inf in row 13"), (5, 0, 3e38, "3e38 in row 5")):
        xv = list(x)
        xv[row * N_FEAT + col] = v
        exp = "either" if math.isfinite(v) else "error"
        npz_train(c, name, npz_xy(xv, y), exp)
        if row == N_ROWS - 1 and col == 0 and v == inf:
            npz_train(c, name + " with --allow-nonfinite", npz_xy(xv, y), "either", extra=("--allow-nonfinite",))
            npz_eval(c, name, npz_xy(xv, y), "either")
    # one batch holding the whole set: a non-finite input whose loss stays finite (the ReLUs zero
    # it) still makes the update non-finite; the run must not end with exit 0 and NaN parameters
    for row, col, v in ((0, 0, inf), (N_ROWS - 1, 0, inf), (0, 1, -inf), (N_ROWS - 1, 0, nan)):
        xv = list(x)
        xv[row * N_FEAT + col] = v
        what = {inf: "plus inf", -inf: "minus inf"}.get(v, "NaN")
        npz_train(c, "%s in row %d feature %d, whole set in one batch" % (what, row, col), npz_xy(xv, y), "error",
                  extra=("--batch", "30"))
    npz_train(c, "all NaN", npz_xy([nan] * len(x), y), "error")
    npz_train(c, "all NaN with --allow-nonfinite", npz_xy([nan] * len(x), y), "ok", extra=("--allow-nonfinite",))
    npz_train(c, "denormal values", npz_xy([1e-40] * len(x), y), "ok")
    for v, exp in ((-1, "error"), (3, "error"), (2 ** 62, "error"), (-(2 ** 63), "error"), (2 ** 31, "error")):
        yv = list(y)
        yv[7] = v
        npz_train(c, "label %d" % v, npz_xy(x, yv), exp)
        if v in (3, 2 ** 62):
            npz_eval(c, "label %d" % v, npz_xy(x, yv), exp)
    npz_train(c, "labels all 0", npz_xy(x, [0] * N_ROWS), "ok")


# ---- 5. schedule CSV --------------------------------------------------------------------------

def csv_cells(text):
    return [row.split(",") for row in text.rstrip("\n").split("\n")]


def csv_text(rows):
    return "\n".join(",".join(r) for r in rows) + "\n"


def gen_csv(c):
    cat = "csv"

    def add(name, text, exp, extra=()):
        data = text.encode("utf-8") if isinstance(text, str) else text
        c.add(Case(cat, name, ["schedule", "--load", "s.csv"] + list(extra), exp, tidy="first"), files={"s.csv": data})

    for k, text in c.csv.items():
        add("valid %s" % k, text, "ok")
    add("valid 1f1b with --schedule 1f1b", c.csv["1f1b"], "ok", ("--schedule", "1f1b"))
    add("1f1b with --stages 3", c.csv["1f1b"], "error", ("--stages", "3"))
    add("1f1b with --microbatches 5", c.csv["1f1b"], "error", ("--microbatches", "5"))
    add("1f1b with --schedule interleaved", c.csv["1f1b"], "either", ("--schedule", "interleaved"))
    add("1f1b with --schedule gpipe", c.csv["1f1b"], "either", ("--schedule", "gpipe"))
    add("CRLF rows", c.csv["1f1b"].replace("\n", "\r\n"), "ok")
    add("quoted cells", csv_text([['"%s"' % x if x else x for x in r] for r in csv_cells(c.csv["1f1b"])]), "ok")
    add("trailing blank lines", c.csv["1f1b"] + "\n\n\n", "ok")
    add("--csv output too", c.csv["1f1b"], "ok", ("--csv", "copy.csv"))
    add("--csv output empty path", c.csv["1f1b"], "error", ("--csv", ""))
    base = csv_cells(c.csv["1f1b"])
    for k in ("1f1b", "zbh1", "gpipe", "inter"):
        rows = csv_cells(c.csv[k])
        cells = [(r, t) for r in range(len(rows)) for t in range(len(rows[r])) if rows[r][t]]
        rnd = random.Random(k)
        for n in range(3):
            r, t = cells[rnd.randrange(len(cells))]
            m = [list(row) for row in rows]
            m[r][t] = ""
            add("%s: %s removed" % (k, rows[r][t]), csv_text(m), "error")
        r, t = cells[rnd.randrange(len(cells))]
        m = [list(row) for row in rows]
        m[r].append(rows[r][t])
        add("%s: %s twice" % (k, rows[r][t]), csv_text(m), "error")
    m = [list(r) for r in base]
    m[0][0], m[0][3] = m[0][3], m[0][0]
    add("1f1b: B before F on rank 0", csv_text(m), "error")
    add("rank rows swapped (stage 1 on rank 0)", csv_text([base[1], base[0]]), "either")
    add("deadlock: both ranks wait", "0F0,0B0\n1B0,1F0\n", "error")
    add("action on a stage no rank holds", c.csv["1f1b"].rstrip("\n") + ",3F0\n", "error")
    for cell in ("65535F0", "0F65535", "65536F0", "0F65536", "2147483648F0", "0F9223372036854775808",
                 "-1F0", "0F-1", "0Q0", "0F", "F0", "0F0x", " 0 F 0", "0f0", "\u0660F0", "0F0\u0000", "0W0"):
        add("cell %r" % cell, c.csv["1f1b"].rstrip("\n").replace("0F0", cell, 1) + "\n", "error" if cell != " 0 F 0" else "either")
    add("sparse huge stage and micro-batch", "65535F65535\n", "error")
    add("stages not divisible by ranks", "0F0,0B0\n,\n,\n", "error")
    add("one row of 1M commas", "," * 1000000 + "\n", "error")
    add("10k empty rows and one action", "\n" * 10000 + "0F0\n", "error")
    add("a line of 2 MiB", "0F0," + "x" * (2 << 20) + "\n", "error")
    add("1000 ranks of gpipe", csv_text([["%dF0" % r] * 0 + [""] * r + ["%dF0" % r, "%dB0" % r] for r in range(1000)]), "either")
    add("empty file", "", "error")
    add("only commas", ",,,\n,,\n", "error")
    add("BOM before the first cell", "\ufeff" + c.csv["1f1b"], "either")
    add("binary junk", bytes(random.Random(7).randrange(256) for _ in range(4096)), "error")
    add("NUL bytes", b"\x00" * 100, "error")
    add("semicolons instead of commas", c.csv["1f1b"].replace(",", ";"), "error")
    for path, name in (("/dev/zero", "/dev/zero"), ("/dev/null", "/dev/null"), (".", "a directory"),
                       ("missing.csv", "a missing file")):
        c.add(Case(cat, "load " + name, ["schedule", "--load", path], "error", tidy="first"))
    case = c.add(Case(cat, "load a FIFO with no writer", ["schedule", "--load", "fifo"], "error", tidy="first"))
    os.mkfifo(os.path.join(case.dir, "fifo"))
    c.add(Case(cat, "save over a directory path", ["schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                                                   "--csv", "d/"], "error", tidy="first"), files={"d/keep": b""})
    c.add(Case(cat, "failed --csv keeps the old file", ["schedule", "--load", "bad.csv", "--csv", "keep.csv"], "error",
               tidy="first", outputs=["keep.csv"], unchanged={"keep.csv": c.csv["1f1b"].encode()}),
          files={"bad.csv": "0F0,0B0\n1B0,1F0\n", "keep.csv": c.csv["1f1b"]})


# ---- 6. lessons and scripts -------------------------------------------------------------------

LESSON_HEAD = "---\ntitle: Hostile base\nminutes: 5\nsummary: a tiny lesson\nworld: 2\nmodel: tiny\nsteps: 20\n---\n"
LESSON_BODY = ("\n## One\n\nRanks: {{world}}.\n\n```action\nstep collective 1\n```\n\n"
               "```question\nask: How many ranks run?\nanswer: world\nexpect: 2\n```\n")
GUI_BASE = ["--world", "2", "--model", "tiny", "--steps", "20"]


def lesson(head=LESSON_HEAD, body=LESSON_BODY):
    return head + body


def step(action=None, question=None, prose="Text."):
    s = "\n## Step\n\n%s\n" % prose
    if action is not None:
        s += "\n```action\n%s\n```\n" % action
    if question is not None:
        s += "\n```question\n%s\n```\n" % question
    return s


def gen_lessons(c):
    cat = "lessons"

    def play(name, text, exp, codes=(1, 2)):
        c.add(Case(cat, "lesson " + name, ["--lesson", "l.md", "--play"], exp, prog="gui", codes=codes),
              files={"l.md": text})

    def script(name, text, exp, codes=(1, 2), extra=()):
        c.add(Case(cat, "script " + name, merge(GUI_BASE, extra) + ["--script", "s.txt"], exp, prog="gui", codes=codes),
              files={"s.txt": text})

    def run(name, cmds, exp, codes=(1, 2)):
        c.add(Case(cat, "run " + name, GUI_BASE + ["--run", cmds], exp, prog="gui", codes=codes))

    play("valid base lesson", lesson(), "ok")
    play("CRLF line endings", lesson().replace("\n", "\r\n"), "either")
    play("BOM at the start", "\ufeff" + lesson(), "either")
    # header
    play("no header", LESSON_BODY, "error")
    play("header not closed", LESSON_HEAD[:-4] + LESSON_BODY, "error")
    play("no title", lesson(head=LESSON_HEAD.replace("title: Hostile base\n", "")), "error")
    play("no minutes", lesson(head=LESSON_HEAD.replace("minutes: 5\n", "")), "error")
    for v in ("nan", "-1", "1e308", "inf", "0", "61", "5.5", ""):
        play("minutes %r" % v, lesson(head=LESSON_HEAD.replace("minutes: 5", "minutes: " + v)), "error")
    for key, v in (("world", "17"), ("world", "nan"), ("world", "1e9"), ("model", "mlp:2,65536,65536,3"),
                   ("model", "mlp:2,40000,40000,3"), ("lr", "inf"), ("timeout", "nan"), ("bogus_key", "1"),
                   ("fault", "skip:rank=9,collective=1"), ("scenario", "--script x.txt"), ("scenario", "--world"),
                   ("scenario", "--world 2 --world"), ("scenario", "'unbalanced"), ("find_unused_parameters", "maybe"),
                   ("steps", "0"), ("batch", "99999999999999999999")):
        play("header %s: %s" % (key, v), lesson(head=LESSON_HEAD.replace("---\n", "---\n%s: %s\n" % (key, v), 1)),
             "error")
    play("header line without colon", lesson(head=LESSON_HEAD.replace("model: tiny", "model tiny")), "error")
    play("header only", LESSON_HEAD, "error")
    # steps and blocks
    play("action block not closed", LESSON_HEAD + "\n## One\n\n```action\nstep collective 1\n", "error")
    play("question block not closed", LESSON_HEAD + "\n## One\n\n```question\nask: x\nanswer: world\n", "error")
    play("two questions in a step", LESSON_HEAD + "\n## One\n\n```question\nask: a\nanswer: world\n```\n\n"
         "```question\nask: b\nanswer: world\n```\n", "error")
    play("question without ask", lesson(body=step(question="answer: world")), "error")
    play("question without answer", lesson(body=step(question="ask: x")), "error")
    play("unknown question key", lesson(body=step(question="ask: x\nanswer: world\nbogus: 1")), "error")
    play("one choice", lesson(body=step(question="ask: x\nchoice: a\nanswer: world")), "error")
    play("choices match none", lesson(body=step(question="ask: x\nchoice: a = 7\nchoice: b = 8\nanswer: world")), "error")
    for v in ("1e308", "nan", "inf", "-1e308", "1/0", "0/0", "world/0"):
        play("expect %s" % v, lesson(body=step(question="ask: x\nanswer: world\nexpect: " + v)), "error")
    for v in ("nan", "-1", "inf", "1e308%", "%"):
        play("tolerance %s" % v, lesson(body=step(question="ask: x\nanswer: world\nexpect: 2\ntolerance: " + v)),
             "either" if v == "1e308%" else "error")
    play("answer unknown figure", lesson(body=step(question="ask: x\nanswer: bogus.figure")), "error")
    play("answer nested 100 deep", lesson(body=step(question="ask: x\nanswer: " + "(" * 100 + "world" + ")" * 100)), "error")
    play("answer nested 100000 deep", lesson(body=step(question="ask: x\nanswer: " + "(" * 100000 + "world" + ")" * 100000)),
         "error")
    play("answer of 3000 characters", lesson(body=step(question="ask: x\nanswer: " + "+".join(["world"] * 500))), "error")
    play("answer !!!! 100000", lesson(body=step(question="ask: x\nanswer: " + "!" * 100000 + "world")), "error")
    play("figure marker not closed", lesson(body=step(prose="Ranks: {{world")), "error")
    play("empty figure marker", lesson(body=step(prose="Ranks: {{}}")), "error")
    play("figure markers nested", lesson(body=step(prose="Ranks: {{ {{world}} }}")), "error")
    play("figure marker in the figure", lesson(body=step(prose="{{" * 1000 + "world" + "}}" * 1000)), "error")
    play("10000 list levels of prose", lesson(body=step(prose="\n".join("  " * i + "- x" for i in range(10000)))), "either")
    play("20000 quote levels of prose", lesson(body=step(prose=">" * 20000 + " deep")), "either")
    play("a line of 900 KiB", lesson(body=step(prose="x" * (900 << 10))), "either")
    play("file of 2 MiB", lesson(body=step(prose=("x" * 1023 + "\n") * 2048)), "error")
    # actions
    for a, exp in (("stp collective 1", "error"), ("step collective 0", "error"), ("step collective -1", "error"),
                   ("step collective 1e9", "error"), ("step collective nan", "error"), ("step collective 100001", "error"),
                   ("wait 1e9s", "error"), ("wait infs", "error"), ("wait nans", "error"), ("wait -1s", "error"),
                   ("wait 3601s", "error"), ("run 1e308s", "error"), ("speed nan", "error"), ("set speed inf", "error"),
                   ("set speed 1e308", "either"), ("view bogus", "error"), ("screenshot x.png", "error"), ("quit", "error"),
                   ("inject skip rank 9 collective 1", "error"), ("inject skip rank -1 collective 1", "error"),
                   ("inject delay rank 1 collective 1 ms 1e300", "error"), ("scenario --world 99", "error"),
                   ("scenario --script x", "error"), ("mark bad-name!", "error"), ("expect 0", "error"),
                   ("expect 1/0", "error"), ("run until", "error"), ("run until world == 3 by ring", "error"),
                   ("run until run.finished by walk", "error"), ("set bogus on", "error"), ("wait 0s", "ok")):
        play("action %r" % a, lesson(body=step(action=a)), exp)
    # files
    for path, name in (("missing.md", "a missing file"), ("/dev/null", "/dev/null"), ("/dev/zero", "/dev/zero"),
                       (".", "a directory")):
        c.add(Case(cat, "lesson is " + name, ["--lesson", path, "--play"], "error", prog="gui"))
    play("binary junk", bytes(random.Random(11).randrange(256) for _ in range(8192)), "error")
    play("NUL bytes in the header", LESSON_HEAD.replace("title: Hostile base", "title: Hos\x00tile") + LESSON_BODY, "either")
    play("only NUL bytes", b"\x00" * 4096, "error")
    # scripts
    script("valid script", "step collective 1\nview ring\nquit\n", "ok")
    script("valid script without quit", "step collective 1\n", "ok")
    script("empty script", "", "error")
    script("comments only", "# nothing\n# at all\n", "error")
    for cmd in ("bogus", "step", "step warp", "step collective 0", "step collective 1e9", "step collective 1.5",
                "wait 1e9s", "wait inf", "wait nan", "wait -1s", "wait", "run 1e308s", "speed nan", "speed -1",
                "speed inf", "view", "view bogus", "screenshot", "clock sundial", "presentation maybe", "lesson bogus",
                "lesson goto 99999", "lesson open no_such_lesson", "quit now", "\u0455tep collective 1",
                "step collective 1\x00"):
        script("command %r" % cmd, cmd + "\nquit\n", "error")
    script("screenshot into a missing dir", "screenshot nodir/x.png\nquit\n", "error")
    script("a line of 900 KiB", "#" + "x" * (900 << 10) + "\nquit\n", "ok")
    script("file of 2 MiB", "# padding\n" * (200 << 10) + "quit\n", "error")
    script("binary junk", bytes(random.Random(12).randrange(256) for _ in range(8192)), "error")
    for path, name in (("missing.txt", "a missing file"), ("/dev/zero", "/dev/zero"), ("/dev/null", "/dev/null"),
                       (".", "a directory")):
        c.add(Case(cat, "script is " + name, GUI_BASE + ["--script", path], "error", prog="gui"))
    run("empty --run", "", "error")
    run("only semicolons", ";;;;", "error")
    run("10000 quits", ";".join(["quit"] * 10000), "ok")
    run("step collective 100000 on a 20-step run", "step collective 100000; quit", "either")


# ---- 7. multi-process faults ------------------------------------------------------------------

LAUNCH_TRAIN = ["launch", "--nproc-per-node", "2", "--", "train", "--strategy", "ddp", "--model", "mlp:2,8,3",
                "--batch", "8"]


def children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == pid:
                kids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def rank_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"RANK="):
                    return int(kv[5:])
    except (OSError, ValueError):
        pass
    return None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def signal_runner(target, sig, delay=1.0):
    """Runs the case, sends sig to rank `target` (or to the launcher: target None) `delay` seconds
    after both ranks started, then checks the launcher ends within the timeout and leaves no rank
    running."""
    def runner(r, case):
        ranks, left = {}, []

        def during(p, res):
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5 and len(ranks) < 2 and p.poll() is None:
                for k in children_of(p.pid):
                    rk = rank_of(k)
                    if rk is not None:
                        ranks[rk] = k
                time.sleep(0.05)
            time.sleep(delay)
            # The launcher is the ranks' parent: the case may run under a shell (the ulimit wrapper),
            # and a signal to that shell would never reach dtlab-cli.
            launcher = None
            for k in ranks.values():
                try:
                    with open("/proc/%d/stat" % k) as f:
                        st = f.read()
                    launcher = int(st[st.rindex(")") + 2:].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
            victim = (launcher or p.pid) if target is None else ranks.get(target)
            if victim is None or p.poll() is not None:
                res.note = "could not find rank %s among the launcher's children (found %s)" % (target, ranks)
                return
            os.kill(victim, sig)
            res.note = "sent %s to %s (pid %d) after %.1f s" % (
                signal.Signals(sig).name, "the launcher" if target is None else "rank %d" % target, victim,
                time.monotonic() - t0)

        def after(p, res):  # the ranks must go with their launcher (PR_SET_PDEATHSIG) within a few seconds
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(alive(k) for k in ranks.values()):
                time.sleep(0.1)
            left.extend(rk for rk, k in ranks.items() if alive(k))

        res = r.execute(case, during, after)
        for k in ranks.values():
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        if "could not find" in res.note:
            res.verdict, res.reason = "crash", res.note + "; the run ended early: exit %s" % res.rc
        elif left:
            res.verdict, res.reason = "hang", "%s; ranks %s still running 5 s after the launcher ended" % (res.note, left)
        elif target is None and not res.timed_out:
            res.verdict, res.reason = "ran", ""
        return res
    return runner


def gen_multiprocess(c):
    cat = "multiprocess"
    skip = LAUNCH_TRAIN + ["--steps", "3", "--timeout", "2", "--fault", "skip:rank=1,collective=2"]
    for i in range(20):
        c.add(Case(cat, "skip rank 1 collective 2, run %d" % (i + 1), skip, "error", codes=(3,), tidy="ranks",
                   err_check=blames(1, launch_diagnosis)))
    for i in range(2):
        c.add(Case(cat, "skip rank 0 collective 2, run %d" % (i + 1),
                   LAUNCH_TRAIN + ["--steps", "3", "--timeout", "2", "--fault", "skip:rank=0,collective=2"], "error",
                   codes=(3,), tidy="ranks", err_check=blames(0, launch_diagnosis)))
    for i in range(2):
        c.add(Case(cat, "delay rank 1 by 300 ms under a 3 s watchdog, run %d" % (i + 1),
                   LAUNCH_TRAIN + ["--steps", "3", "--timeout", "3", "--fault", "delay:rank=1,collective=2,ms=300"], "ok",
                   codes=(3,), tidy="ranks"))
        c.add(Case(cat, "delay rank 1 by 5 s past a 2 s watchdog, run %d" % (i + 1),
                   LAUNCH_TRAIN + ["--steps", "3", "--timeout", "2", "--fault", "delay:rank=1,collective=2,ms=5000"], "error",
                   codes=(3,), tidy="ranks", err_check=blames(1, launch_diagnosis)))
    long = LAUNCH_TRAIN + ["--steps", "200000", "--timeout", "2"]
    for target, sig, n in ((1, signal.SIGKILL, 2), (0, signal.SIGKILL, 1), (1, signal.SIGSTOP, 2), (0, signal.SIGSTOP, 1),
                           (1, signal.SIGTERM, 1)):
        for i in range(n):
            c.add(Case(cat, "%s rank %d mid-run, run %d" % (signal.Signals(sig).name, target, i + 1), long, "error",
                       codes=(1, 2, 3), tidy="ranks", err_check=blames(target, launch_diagnosis),
                       runner=signal_runner(target, sig)))
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
        c.add(Case(cat, "%s the launcher mid-run" % signal.Signals(sig).name, long, "either", codes=(1, 2, 3),
                   tidy="ranks", runner=signal_runner(None, sig)))
    # launch --timeout bounds how long the other ranks take to exit after one ended: a finished run
    # is never failed by it, and a value too small to tell a hang from an exit is refused up front.
    for t in ("0.001", "0.5"):
        c.add(Case(cat, "launch --timeout %s" % t, ["launch", "--nproc-per-node", "2", "--timeout", t] + LAUNCH_TRAIN[3:] +
                   ["--steps", "2"], "error", err_check=says("use at least 1 s")))
    c.add(Case(cat, "launch --timeout 1 on a run that finishes", ["launch", "--nproc-per-node", "2", "--timeout", "1"] +
               LAUNCH_TRAIN[3:] + ["--steps", "2"], "ok", codes=(3,), tidy="ranks"))
    gen_multiprocess_fake_master(c)
    gen_multiprocess_fake_rank(c)


# Fake peers (issue 40, class 2): what listens on MASTER_PORT, or joins rank 0, may be any program.
# The bytes follow engine/comm/socket_mesh.{h,cpp}: Hello, rank 0's reply, WireHeader.

WIRE_MAGIC = 0x424c5444  # "DTLB"
SOCKET_TRAIN = ["train", "--backend", "socket", "--strategy", "ddp", "--model", MODEL, "--batch", "8", "--steps", "1",
                "--timeout", "2"]


def hello_bytes(rank, world, port, ip=b"127.0.0.1", raw_ip=None):
    return struct.pack("<Iiii", WIRE_MAGIC, rank, world, port) + (raw_ip if raw_ip is not None else ip.ljust(48, b"\0")[:48])


def reply_bytes(status, nbytes, body=b""):
    return struct.pack("<iI", status, nbytes) + body


def table_bytes(entries, world, bad=-1, spoiled=b""):
    return b"".join(spoiled if q == bad else hello_bytes(q, world, 30000 + q) for q in range(entries))


def wire_header(kind, count=0, nbytes=0, src=1):
    """WireHeader: magic, kind, op, algo, reduce, dtype, proto, pad, root, tag, step, src, pad, seq, count, bytes, model_t."""
    return struct.pack("<IBBBBBB2xiiiiIQqQd", WIRE_MAGIC, kind, 0, 1, 0, 0, 0, -1, 0, 0, src, 0, 0, count, nbytes, 0.0)


def recv_exact(conn, n, deadline):
    buf = b""
    while len(buf) < n and time.monotonic() < deadline:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = conn.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf if len(buf) == n else None


def hold(conn, stop):
    """Keeps the connection open (reading what comes) until the rank closes it or the case ended."""
    conn.settimeout(0.1)
    while not stop.is_set():
        try:
            if not conn.recv(65536):
                return
        except socket.timeout:
            continue
        except OSError:
            return


def fake_peer_runner(role, send):
    """role "master": listens on MASTER_PORT, answers the rank's Hello with `send` (None: silence).
    role "hello": joins the case's rank 0 with `send` as its Hello. role "rank1": joins rank 0 as a
    proper rank 1, then sends `send` as its first message."""
    def runner(r, case):
        stop = threading.Event()
        ls = None
        if role == "master":
            ls = socket.socket()
            ls.bind(("127.0.0.1", 0))
            ls.listen(4)
            port = ls.getsockname()[1]
        else:
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()
        case.env["MASTER_PORT"] = str(port)

        def fake():
            conn, deadline = None, time.monotonic() + 10
            try:
                while conn is None and time.monotonic() < deadline and not stop.is_set():
                    if ls:
                        ls.settimeout(0.1)
                        try:
                            conn, _ = ls.accept()
                        except socket.timeout:
                            continue
                    else:
                        try:
                            conn = socket.create_connection(("127.0.0.1", port), timeout=1)
                        except OSError:
                            time.sleep(0.05)
                if conn is None:
                    return
                if role == "master":
                    if recv_exact(conn, 64, deadline) is not None and send is not None:
                        conn.sendall(send)
                elif role == "hello":
                    conn.sendall(send)
                else:
                    conn.sendall(hello_bytes(1, 2, 40000))  # in a world of 2 nobody connects to rank 1
                    if recv_exact(conn, 8 + 2 * 64, deadline) is not None:
                        conn.sendall(send)
                hold(conn, stop)
            except OSError:
                pass
            finally:
                for s in (conn, ls):
                    if s:
                        s.close()

        t = threading.Thread(target=fake, daemon=True)
        t.start()
        res = r.execute(case)
        stop.set()
        t.join(timeout=5)
        return res
    return runner


def gen_multiprocess_fake_master(c):
    """A rank (1 of 4) whose MASTER_PORT answers with bytes no rank 0 sends."""
    cat = "multiprocess"
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}
    stranger = "is another program listening on MASTER_PORT?"
    rows = [
        ("a short address table", reply_bytes(0, 3 * 64, table_bytes(3, 4)), "an address table of 3 entries for a world of 4"),
        ("a table of 100 bytes", reply_bytes(0, 100, b"x" * 100), "an address table of 100 bytes"),
        ("a 4 GiB table", reply_bytes(0, 0xFFFFFFFF), "an address table of 4294967295 bytes"),
        ("a 2 GiB refusal", reply_bytes(1, 0x7FFFFFFF), "a refusal of 2147483647 bytes"),
        ("status 9", reply_bytes(9, 0), "a rendezvous answer of status 9"),
        ("an unterminated address", reply_bytes(0, 256, table_bytes(4, 4, 1, hello_bytes(1, 4, 30001, raw_ip=b"A" * 48))),
         "entry for rank 1 has an address field of 48 bytes with no terminating NUL"),
        ("port 70000", reply_bytes(0, 256, table_bytes(4, 4, 2, hello_bytes(2, 4, 70000))), "entry for rank 2 has port 70000"),
        ("port -1", reply_bytes(0, 256, table_bytes(4, 4, 3, hello_bytes(3, 4, -1))), "entry for rank 3 has port -1"),
        ("a binary address", reply_bytes(0, 256, table_bytes(4, 4, 2, hello_bytes(2, 4, 5000, raw_ip=b"\x1b[2J\n" + b"\0" * 43))),
         "which is not a dotted IPv4 address"),
        ("rank 7 in entry 3", reply_bytes(0, 256, table_bytes(4, 4, 3, hello_bytes(7, 4, 5000))), "entry for rank 3 has rank 7"),
        ("a table for 3 ranks", reply_bytes(0, 256, table_bytes(4, 3)), "WORLD_SIZE=3"),
        ("random bytes", bytes(random.Random(7).randrange(256) for _ in range(300)), stranger),
    ]
    for name, reply, phrase in rows:
        c.add(Case(cat, "fake MASTER_PORT sends %s" % name, SOCKET_TRAIN, "error", codes=(3,), env=env,
                   err_check=says("rank 1: the process at 127.0.0.1:", phrase, absent=("AAAA",)),
                   runner=fake_peer_runner("master", reply)))
    refusal = b"rank 0: no\nsuch\x1bthing"
    c.add(Case(cat, "fake MASTER_PORT refuses with control bytes", SOCKET_TRAIN, "error", codes=(2,), env=env,
               err_check=says("rank 0: no such thing"), runner=fake_peer_runner("master", reply_bytes(1, len(refusal), refusal))))
    c.add(Case(cat, "fake MASTER_PORT accepts and stays silent", SOCKET_TRAIN, "error", codes=(3,), env=env,
               err_check=says("did not send the address table within 2 s"), runner=fake_peer_runner("master", None)))


def gen_multiprocess_fake_rank(c):
    """Rank 0 of 2 joined by a fake rank 1 that sends what no rank sends."""
    cat = "multiprocess"
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    hellos = [
        ("port 0", hello_bytes(1, 2, 0), (2,), "joined as rank 1 with port 0, outside 1..65535"),
        ("an unterminated address", hello_bytes(1, 2, 5000, raw_ip=b"A" * 48), (2,), "no terminating NUL"),
        ("rank 5", hello_bytes(5, 2, 5000), (2,), "a process joined as rank 5, outside 1..1"),
        ("random bytes", bytes(random.Random(8).randrange(256) for _ in range(64)), (3,), "rank 1 never connected"),
    ]
    for name, hello, codes, phrase in hellos:
        c.add(Case(cat, "fake rank 1 joins with %s" % name, SOCKET_TRAIN, "error", codes=codes, env=env,
                   err_check=says(phrase, absent=("AAAA",)), runner=fake_peer_runner("hello", hello)))
    same = "which no dtlab rank sends; every rank must run the same dtlab build"
    messages = [
        ("a message of kind 9", wire_header(9), "sent a message of kind 9, " + same),
        ("a 512 GiB chunk of one float", wire_header(0, 1, 1 << 39), "sent 549755813888 bytes for a call of 1 float32"),
        ("a call of -5 elements", wire_header(0, -5, 0), "a call of -5 elements"),
        ("a 1 GiB abort reason", wire_header(2, 0, 1 << 30), "an abort reason of 1073741824 bytes"),
        ("a message signed by rank 5", wire_header(1, src=5), "a message signed by rank 5"),
        ("a header cut short", wire_header(0)[:20], "waiting for data from rank 1"),
    ]
    for name, data, phrase in messages:
        c.add(Case(cat, "fake rank 1 sends %s" % name, SOCKET_TRAIN, "error", codes=(3,), env=env,
                   err_check=says(phrase), runner=fake_peer_runner("rank1", data)))
    reason = b"rank 1: it\nbroke\x1b[2J"
    c.add(Case(cat, "fake rank 1 aborts with control bytes", SOCKET_TRAIN, "error", codes=(3,), env=env,
               err_check=says("rank 1: it broke [2J"), runner=fake_peer_runner("rank1", wire_header(2, 0, len(reason)) + reason)))


# ---- 8. imported profiler traces (dtlab-cli trace summarize, dtlab --open) ---------------------

def trace_event(name, cat, ts, dur, tid, args=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def kineto_trace(rank, world=2, kernel="void gemm_kernel<float>(...)", coll="allreduce", kts=10, kdur=390, nelems=1000):
    """One rank of a Kineto job with one all-reduce, as JSON text; the fields under test are parameters
    (numbers may be given as raw JSON text, e.g. '1e300', through a str)."""
    comms = {"Collective name": coll, "In msg nelems": "@N", "Out msg nelems": "@N", "Group size": world, "dtype": "Float"}
    ev = [trace_event("ProfilerStep#7", "user_annotation", 0, 1000, 1), trace_event(kernel, "kernel", "@TS", "@DUR", 7),
          trace_event("record_param_comms", "cpu_op", 300, 5, 1, comms),
          trace_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 310, 290, 20)]
    text = json.dumps({"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": ev})
    for key, val in (("@N", nelems), ("@TS", kts), ("@DUR", kdur)):
        text = text.replace('"%s"' % key, str(val))
    return text


LEGACY_TRACE = '[{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 1, "pid": 0, "tid": 1}]'


def says(*phrases, absent=()):
    """err_check: the refusal must say each phrase (and none of `absent`), else it misleads."""
    def check(case, res):
        missing = [p for p in phrases if p not in res.stderr] + ["not '%s'" % a for a in absent if a in res.stderr]
        return ("the sentence misses %s: %s" % (", ".join(missing), res.stderr.strip()[:300])) if missing else None
    return check


def lines_under(n):
    def check(case, res):
        longest = max((len(l) for l in res.stdout.splitlines()), default=0)
        return "a line of %d characters printed (names must be bounded)" % longest if longest >= n else None
    return check


def gz_bytes(chunks):
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(z.compress(ch) for ch in chunks) + z.flush()


def gen_traces(c):
    gen_traces_files(c)
    gen_traces_json(c)
    gen_traces_values(c)


def trace_case(c, name, files, exp, extra=(), path="job", err_check=None, check=None, gui=False):
    """trace summarize PATH, or with gui the lab's --open PATH that waits for the load and quits."""
    argv = (["--open", path, "--run", "wait trace; quit"] if gui else ["trace", "summarize", path]) + list(extra)
    return c.add(Case("traces", ("dtlab --open: " if gui else "") + name, argv, exp, prog="gui" if gui else "cli",
                      err_check=err_check, check=check), files=files)


def two_ranks(both=False, **kw):
    """Rank 0 with the fields under test; rank 1 too with both, else a plain trace."""
    return {"job/rank0.json": kineto_trace(0, **kw), "job/rank1.json": kineto_trace(1, **(kw if both else {}))}


def gen_traces_files(c):
    """Paths: names, links, FIFOs, devices, missing ranks, gzip bombs."""
    ok = {"job/rank0.json": kineto_trace(0), "job/rank1.json": kineto_trace(1)}
    for gui in (False, True):
        trace_case(c, "valid two ranks", ok, "ok", gui=gui)
        trace_case(c, "rank99999999999 in a file name", {"job/rank0.json": LEGACY_TRACE, "job/rank99999999999.json": LEGACY_TRACE},
                   "error", err_check=says("rank 1 is missing", "99999999999"), gui=gui)
        case = trace_case(c, "symlink loop in the folder", ok, "error", err_check=says("loop.json is a symbolic link loop"), gui=gui)
        os.symlink("loop.json", os.path.join(case.dir, "job", "loop.json"))
        case = trace_case(c, "symlink loop as the path", {}, "error", path="loop.json", err_check=says("is a symbolic link loop"), gui=gui)
        os.symlink("loop.json", os.path.join(case.dir, "loop.json"))
        case = trace_case(c, "dangling link named rank1.json", {"job/rank0.json": kineto_trace(0)}, "error",
                          err_check=says("rank1.json is a symbolic link to nothing"), gui=gui)
        os.symlink("gone.json", os.path.join(case.dir, "job", "rank1.json"))
        case = trace_case(c, "dtlab.json a symlink loop", ok, "error", err_check=says("dtlab.json is a symbolic link loop"), gui=gui)
        os.symlink("dtlab.json", os.path.join(case.dir, "job", "dtlab.json"))
        case = trace_case(c, "FIFO as the path", {}, "error", path="rank0.json", err_check=says("is a FIFO", absent=("does not exist",)), gui=gui)
        os.mkfifo(os.path.join(case.dir, "rank0.json"))
        case = trace_case(c, "FIFO named rank1.json in the folder", {"job/rank0.json": kineto_trace(0)}, "error",
                          err_check=says("rank1.json is a FIFO", absent=("does not exist",)), gui=gui)
        os.mkfifo(os.path.join(case.dir, "job", "rank1.json"))
        trace_case(c, "/dev/zero", {}, "error", path="/dev/zero", err_check=says("is a device", absent=("does not exist",)), gui=gui)
        trace_case(c, "missing path", {}, "error", path="none", err_check=says("does not exist"), gui=gui)
    many = {"job/rank%d.json" % r: LEGACY_TRACE for r in range(3001) if r != 1234}
    trace_case(c, "3000 files, rank 1234 missing", many, "error", err_check=says("rank 1234 is missing"))
    many = {"job/rank%d.json" % (2 * r): LEGACY_TRACE for r in range(3000)}
    trace_case(c, "3000 files, every odd rank missing", many, "error", err_check=says("ranks 1, 3, 5, 7 and 1,496 more are missing"))
    spaces = b" " * (1 << 20)
    bombs = {"spaces": [b"["] + [spaces] * 256, "one string": [b'["'] + [b"a" * (1 << 20)] * 256,
             "events": [b'{"traceEvents": ['] + [(json.dumps(trace_event("k", "kernel", 1, 1, 7)) + ",").encode() * 20000] * 200}
    for what, chunks in bombs.items():
        files = {"job/rank0.json.gz": gz_bytes(chunks), "job/rank1.json": kineto_trace(1)}
        for gui in (False, True):
            trace_case(c, "gzip bomb of %s" % what, files, "error", err_check=says("rank0.json.gz", "gzip bomb", absent=("out of memory",)), gui=gui)


def gen_traces_json(c):
    """JSON's shape: nesting, bad bytes, cut files, names of 100 KB."""
    deep = "[" * 200000 + "]" * 200000
    good = kineto_trace(0)
    for gui in (False, True):
        trace_case(c, "trace nested 200,000 deep", {"job/rank0.json": deep, "job/rank1.json": kineto_trace(1)}, "error",
                   err_check=says("nests its JSON deeper than 256 levels"), gui=gui)
        nested = {"job/rank0.json": good.replace('"dtype": "Float"', '"x": ' + "[" * 300 + "]" * 300), "job/rank1.json": kineto_trace(1)}
        trace_case(c, "args nested 300 deep", nested, "error", err_check=says("nests its JSON deeper than 256 levels"), gui=gui)
        files = dict(two_ranks(), **{"job/dtlab.json": '{"model": ' + deep + "}"})
        trace_case(c, "dtlab.json model nested 200,000 deep", files, "error", err_check=says("dtlab.json nests its JSON deeper"), gui=gui)
        files = dict(two_ranks(), **{"job/dtlab.json": '{"a": ' * 50000 + "1" + "}" * 50000})
        trace_case(c, "dtlab.json objects nested 50,000 deep", files, "error", err_check=says("dtlab.json nests its JSON deeper"), gui=gui)
        files = dict(two_ranks(), **{"job/dtlab.json": " " * (8 << 20)})
        trace_case(c, "dtlab.json of 8 MiB", files, "error", err_check=says("dtlab.json is 8.0 MiB"), gui=gui)
        at = good.index("record_param_comms") - 5
        bad = good[:at] + "\x01" + good[at + 1:]
        trace_case(c, "a bad byte mid-file", {"job/rank0.json": bad, "job/rank1.json": kineto_trace(1)}, "error",
                   err_check=says("breaks its JSON at byte %d" % at, absent=("truncated",)), gui=gui)
        trace_case(c, "a file cut short", {"job/rank0.json": good[:300], "job/rank1.json": kineto_trace(1)}, "error",
                   err_check=says("ends at byte 300", "truncated"), gui=gui)
        huge = "k\u00e9rnel_" * 13000
        trace_case(c, "100 KB kernel and collective names", two_ranks(both=True, kernel=huge, coll=huge), "ok",
                   check=None if gui else lines_under(2000), gui=gui)
    twenty = {"job/rank%d.json" % r: json.dumps({"distributedInfo": {"rank": r, "world_size": 2}, "traceEvents":
              [trace_event("k\u00e9rnel_" * 13000 + str(i), "kernel", i * 15, 14, 7) for i in range(20)]}) for r in range(2)}
    trace_case(c, "20 kernels of 100 KB names each", twenty, "ok", gui=True)


def gen_traces_values(c):
    """Numbers no profiler records: refused, never printed as a result."""
    bad = [("kernel at ts 4e15", dict(kts="4e15"), "\"ts\" 4e+15 us"), ("kernel at ts 2e15 in a file of small ts", dict(kts="2e15"), "away from the file's other events"),
           ("ts \"nan\"", dict(kts='"nan"'), "\"ts\" nan"), ("ts -1e300", dict(kts="-1e300"), "\"ts\" -1e+300"),
           ("dur 1e300", dict(kdur="1e300"), "\"dur\" 1e+300"), ("dur -5", dict(kdur="-5"), "a negative duration"),
           ("dur \"inf\"", dict(kdur='"inf"'), "\"dur\" inf"), ("In msg nelems 2^62", dict(nelems=str(1 << 62)), "\"In msg nelems\" 4611686018427387904"),
           ("In msg nelems 2^63", dict(nelems=str(1 << 63)), "\"In msg nelems\""), ("In msg nelems 1e300", dict(nelems="1e300"), "\"In msg nelems\""),
           ("In msg nelems -3", dict(nelems="-3"), "a negative element count")]
    for name, kw, phrase in bad:
        for gui in (False, True):
            trace_case(c, name, two_ranks(**kw), "error", err_check=says("rank0.json: event", phrase), gui=gui)
    trace_case(c, "In msg nelems 2^34 (64 GiB, a job's)", two_ranks(both=True, nelems=str(1 << 34)), "ok",
               check=lambda case, res: None if "68,719,476,736" in res.stdout else "64 GiB not printed as its bytes")
    steps = {"job/rank%d.json" % r: kineto_trace(r).replace("ProfilerStep#7", "ProfilerStep#99999999999999999999") for r in range(2)}
    trace_case(c, "ProfilerStep#99999999999999999999", steps, "ok")
    for rank in ("99999999999999999999999", "-7", "2147483648"):
        trace_case(c, "distributedInfo rank %s" % rank, {"job/rank0.json": kineto_trace(0).replace('"rank": 0', '"rank": ' + rank),
                                                           "job/rank1.json": kineto_trace(1)}, "error")


# ----------------------------------------------------------------------------------------------
# main

def start_xvfb():
    if not shutil.which("Xvfb"):
        return None, None
    r, w = os.pipe()
    p = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", "1920x1080x24", "-nolisten", "tcp"],
                         pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(w)
    num = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        chunk = os.read(r, 16)
        if not chunk:
            break
        num += chunk
        if num.endswith(b"\n"):
            break
    os.close(r)
    if not num.strip():
        p.kill()
        return None, None
    return p, ":" + num.decode().strip()


def run_all(cases, runner, jobs):
    results = {}
    lock = threading.Lock()
    done = [0]
    total = len(cases)

    def one(case):
        res = runner.run(case)
        outcome, reason = classify(case, res)
        with lock:
            results[case.id] = (res, outcome, reason)
            done[0] += 1
            if outcome in FAILING or outcome in ("untidy error", "refused valid"):
                print("  [%d/%d] %s: %s: %s" % (done[0], total, case.id, outcome, reason[:200]), file=sys.stderr)
            elif done[0] % 50 == 0:
                print("  [%d/%d] ..." % (done[0], total), file=sys.stderr)
        return outcome

    normal = [k for k in cases if k.cat != "multiprocess"]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, normal))
    # multi-process faults are timing-sensitive: one at a time, except the repeated skip case,
    # which runs two at once to put it under load
    mp = [k for k in cases if k.cat == "multiprocess"]
    pairs = [k for k in mp if k.name.startswith("skip rank 1")]
    rest = [k for k in mp if k not in pairs]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, pairs))
    for k in rest:
        one(k)
    return results


def report(cases, results, bins, wall, keep):
    cats = [c for c in CATEGORIES if any(k.cat == c for k in cases)]
    counts = {c: {o: 0 for o in OUTCOMES} for c in cats}
    for k in cases:
        counts[k.cat][results[k.id][1]] += 1
    print("| category | " + " | ".join(OUTCOMES) + " | total |")
    print("|---|" + "---:|" * (len(OUTCOMES) + 1))
    tot = {o: 0 for o in OUTCOMES}
    for c in cats:
        row = counts[c]
        for o in OUTCOMES:
            tot[o] += row[o]
        print("| %s | %s | %d |" % (c, " | ".join(str(row[o]) for o in OUTCOMES), sum(row.values())))
    print("| **total** | %s | **%d** |" % (" | ".join("**%d**" % tot[o] for o in OUTCOMES), sum(tot.values())))
    print()
    print("%d cases in %.0f s (wall)." % (len(cases), wall))
    odd = [k for k in cases if results[k.id][1] not in ("clean error", "ran")]
    if odd:
        print()
        print("## Cases that are not a clean error or an expected run")
        for o in OUTCOMES[2:]:
            for k in (k for k in odd if results[k.id][1] == o):
                res, outcome, reason = results[k.id]
                print()
                print("- **%s** `%s` (%s; %.1f s)" % (outcome, k.id, k.name, res.wall))
                print("  - what happened: %s" % reason)
                if res.note:
                    print("  - runner: %s" % res.note)
                print("  - reproduce: `python3 tools/hostile_corpus.py --bin-dir %s --case %s --keep /tmp/hc`" % (bins, k.id))
                print("  - command: `%s`" % k.repro(bins))
    if not keep:
        print()
        print("(inputs were generated into a temporary directory and removed; --keep DIR keeps them)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True, help="folder with dtlab-cli and dtlab (copies, not build/bin)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20, help="seconds before a case counts as a hang")
    ap.add_argument("--only", choices=CATEGORIES, action="append", help="run only this category (repeatable)")
    ap.add_argument("--case", action="append", help="run only this case id (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    args = ap.parse_args()
    bins = os.path.abspath(args.bin_dir)
    for exe in ("dtlab-cli", "dtlab"):
        if not os.access(os.path.join(bins, exe), os.X_OK):
            sys.exit("hostile_corpus: %s/%s is missing or not executable" % (bins, exe))
    if args.keep:
        root = os.path.abspath(args.keep)
        if os.path.exists(root) and os.listdir(root):
            sys.exit("hostile_corpus: --keep %s is not empty" % root)
        os.makedirs(root, exist_ok=True)
    else:
        root = tempfile.mkdtemp(prefix="dtlab-hostile-")
    xvfb = None
    try:
        corpus = Corpus(root, bins)
        corpus.build()
        cases = corpus.cases
        if args.only:
            cases = [k for k in cases if k.cat in args.only]
        if args.case:
            cases = [k for k in cases if k.id in args.case]
            if not cases:
                sys.exit("hostile_corpus: no case named %s (see --list)" % ", ".join(args.case))
        if args.list:
            for k in cases:
                print("%-60s %-6s %s" % (k.id, k.expect, k.repro(bins)))
            print("%d cases" % len(cases), file=sys.stderr)
            return 0
        display = os.environ.get("DISPLAY", "")
        if any(k.prog == "gui" for k in cases):
            xvfb, disp = start_xvfb()
            if disp:
                display = disp
            elif not display:
                sys.exit("hostile_corpus: the dtlab cases need Xvfb (apt-get install xvfb) or a DISPLAY")
        print("hostile corpus: %d cases, %d jobs, timeout %g s, binaries in %s" % (len(cases), args.jobs, args.timeout, bins),
              file=sys.stderr)
        t0 = time.monotonic()
        results = run_all(cases, Runner(bins, args.timeout, display), args.jobs)
        wall = time.monotonic() - t0
        report(cases, results, bins, wall, args.keep)
        bad = sum(1 for k in cases if results[k.id][1] in FAILING)
        return 1 if bad else 0
    finally:
        if xvfb:
            xvfb.terminate()
            try:
                xvfb.wait(timeout=5)
            except subprocess.TimeoutExpired:
                xvfb.kill()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
