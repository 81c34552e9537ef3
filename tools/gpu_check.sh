#!/usr/bin/env bash
# tools/gpu_check.sh: the one-command GPU verification of dtlab on a bare CUDA machine (x86-64, root, no
# internet and no package registry; the CUDA toolkit in /usr/local/cuda, CMake, g++ and python3 with
# PyTorch are there, none of the Debian -dev packages dtlab builds against).
#
# Two halves:
#   bash tools/gpu_check.sh --fetch-deps [--with-mesa]
#       On an ordinary Debian 12 amd64 machine with apt (run 'apt-get update' once first): downloads with
#       'apt-get download' the .deb files of the packages tools/dtlab.sh installs (zlib1g-dev, libopenblas-dev,
#       nlohmann-json3-dev, libcli11-dev, doctest-dev, libglfw3-dev, libimgui-dev, libstb-dev, libmd4c-dev,
#       libgl-dev, xvfb, xauth) and the closure of their dependencies that a bare machine lacks, into .deps/
#       (git-ignored), and prints what it fetched and the total size. The closure is apt's own resolution
#       on an empty machine (an empty dpkg status), walked from the packages above through Depends and
#       Pre-Depends without entering what any Debian/Ubuntu base with g++ and python3 already has (libc,
#       libstdc++, zlib, systemd's libraries...: ASSUMED below) or docs-only packages (DOCS_ONLY).
#       Mesa's software renderer (swrast_dri.so, which Xvfb's GLX needs) is NOT fetched by default: it pulls
#       libLLVM-15, libz3 and libicu, 47 MiB of .debs (30 packages), and .deps (25 MiB, 60 packages) plus
#       Mesa plus the working tree (7 MiB) would not fit the 64 MiB that travels to the device machine.
#       --with-mesa fetches it into .deps-gl/ for a machine where it fits (or one that has its own Mesa).
#       fonts-dejavu-core is not fetched either: the lab looks for DejaVu under /usr/share/fonts only, and
#       falls back to ImGui's built-in font.
#   bash tools/gpu_check.sh
#       On the GPU machine, from the repository root with .deps carried: unpacks every .deb of .deps/ (and
#       .deps-gl/) with dpkg-deb -x into build-gpu/deps-prefix (never into /; not inside .deps, which is what
#       travels), rewrites the unpacked pkg-config and CMake files' /usr to the prefix and absolute library
#       links into it, configures dtlab into build-gpu/ with -DDTLAB_DEPS_PREFIX=build-gpu/deps-prefix
#       (CMakeLists.txt then searches the prefix first,
#       reads only its .pc files and gives the binaries an RPATH into it), builds (cmake --build -j), and
#       runs, each step timed, under `timeout`, logged to build-gpu/gpu_check/*.log, going on after a failure:
#         verify-prefix  every dependency CMake found lies in the prefix, no header of those packages came
#                        from /usr/include (the compiler's depfiles), no link line names a system copy, and
#                        ldd finds every library of the built binaries;
#         a. gpu-info    nvidia-smi, and the CUDA runtime summary dtlab prints (train --device cuda, 1 step);
#         b. tests       build-gpu/bin/dtlab_tests -ts=cuda,nccl (doctest's summary line; cases that print
#                        "skipped: ..." are counted);
#         c. train-*     dtlab-cli train --device cuda against the same run with --device cpu, 20 steps, for
#                        single, DDP, every FSDP sharding and every pipeline schedule, DataParallel, TP (with DDP,
#                        and with SP under FSDP), and the GPT (gpt-*: single, DDP, FSDP, ZB-H1, LoRA under DDP, DP,
#                        TP + SP, the dp x pp x tp mesh; autocast, --amp bf16, under DDP and TP + SP; --cp in its three layouts,
#                        --moe with --ep 2, and MoE x CP x TP + SP), and bf16/fp16 under DDP, TP, FSDP, DP and pipelines (rtol 1.6e-2 / 1e-3); a row passes when the GPU's final training-set loss (--json summary's
#                        train_loss) equals the CPU's within |gpu - cpu| <= 1e-5 * max(1, |cpu|) (the GPT's 1e-4);
#         d. bench       build-gpu/bin/dtlab-bench-cuda (GPU step vs CPU step vs PyTorch on the same GPU, ring
#                        all-reduce busbw), then dtlab-bench-cuda --gemm (mlp:4096,16384,16384,4096 at batch
#                        8192, TFLOP/s against torch's; bench-gemm, run last), and dtlab-bench-cuda --gpt (GPT-2
#                        small, batch 8 x 1024, fp32, against PyTorch eager; bench-gpt), and the bench model in bf16
#                        (dtlab-bench-cuda --precision bf16: dtlab's 16-bit layout against torch.autocast(bf16);
#                        bench-bf16);
#                        when the bench's /usr/bin/python3 has no torch, bench/torch_step.py runs with the
#                        python3 on PATH instead;
#         ring-fused     dtlab-bench-cuda --ring --world 4: the fused reduce-copy ring, 1 KiB to 1 GiB; passes at
#                        #wrong 0 and, at 256 MiB, the 4 ranks' busbw summed >= 0.8 x the device copy bandwidth;
#         mfu            dtlab-cli train --device cuda (DDP 4): the roof it names (the peak table's row for this
#                        GPU) and step 20's MFU from GPU-timed spans;
#         e. screens     lab screenshots of a GPU run, its Roofline view and its timeline coloured by % of peak
#                        (dtlab --device cuda --strategy ddp --world 4 --run
#                        "...; screenshot ...") under the unpacked Xvfb, with Mesa's software GL when there
#                        is one (the prefix's from .deps-gl, or the machine's), else skipped with the reason;
#       and ends with ONE summary table (step | result | figure | seconds | log) on stdout and in
#       build-gpu/gpu_check/summary.md; on a GPU it also writes that table, dated and with the GPU's name,
#       into docs/gpu.md between its gpu_check markers (and $OUT/gpu.md). When $OUT is set (the device tool), summary.md, up to 5 screenshots
#       and gpu_check_logs.tgz (every log) are copied there. Exit code 0 only when every step passed (steps
#       turned off by a flag do not count); 1 otherwise; 2 for a bad flag.
#       Without a GPU (no nvidia-smi, or it lists no device) it says so in one sentence, builds and runs what
#       can run (the CPU side of every train row, the lab under Xvfb with --device cpu), and marks the GPU
#       steps "skipped: no CUDA device".
#
# Flags:
#   --fetch-deps        the first half (see above); --with-mesa adds Mesa's software GL into .deps-gl/
#   --build-only        unpack, configure, build and verify-prefix only
#   --skip-screens      no screenshots (the step is shown "off" and does not count)
#   --quick             fewer train rows, a smaller GEMM bench, one screenshot, a shorter time budget
#   --only STEPS        after the (incremental) build, run only these of gpu-info,tests,train,bench,ring,mfu,bench-bf16,bench-gpt,screens,
#                       bench-gemm
#   --verify-prefix     only the verify-prefix check of an existing build dir (exit 1 if anything resolved
#                       outside the prefix)
#   --build-dir DIR     build there instead of build-gpu/ (also DTLAB_GPU_BUILD_DIR)
#   --cmake-args "ARGS" more CMake arguments, last on the line (e.g. "-DDTLAB_CUDA=OFF -DDTLAB_GUI=OFF")
#   --isolate           hide the system's /usr, / and /usr/local from CMake's searches (CMAKE_IGNORE_PREFIX_PATH,
#                       CMAKE_SYSTEM_IGNORE_PREFIX_PATH): proves on a machine that has the -dev packages that
#                       the build needs nothing but the prefix (NCCL in /usr is then hidden too)
#   --help              this text
# Environment: DTLAB_GPU_CHECK_BUDGET (seconds for the whole run, default 570, --quick 420: each step's timeout
# is cut to what is left, and a step that would start with too little left is skipped), OUT (see above).
#
# On the GPU machine through the device tool (this workplace's `run`), from the repository root:
#   run(command="bash tools/gpu_check.sh", carry=[".deps"], timeout_s=600)
#   run(command="bash tools/gpu_check.sh --quick --skip-screens", carry=[".deps"], timeout_s=600)
# The reply's output_tail ends with the summary table; $OUT brings back summary.md, the logs and screenshots.
# Only the working tree (tracked and untracked-not-ignored files) and .deps travel: keep .deps + tree under
# 64 MiB (--fetch-deps prints the size). A lab screenshot needs .deps-gl as well, which does not fit beside
# .deps (see above): on such a machine the screens step is skipped with that reason, or pass --skip-screens.
# The screenshots then come from a second call made at once (the machine stays warm 30 s and keeps
# build-gpu/ and .deps/, which are ignored paths, between calls), carrying .deps-gl only:
#   run(command="bash tools/gpu_check.sh --only screens", carry=[".deps-gl"], timeout_s=600)
#
# The proof on a machine that has the -dev packages installed (what was run when this script was written):
#   bash tools/gpu_check.sh --fetch-deps
#   bash tools/gpu_check.sh --build-only --isolate --build-dir /tmp/dtlab-prefix-proof \
#        --cmake-args "-DDTLAB_CUDA=OFF"
#   bash tools/gpu_check.sh --verify-prefix --build-dir /tmp/dtlab-prefix-proof
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$root/.deps
gldeps=$root/.deps-gl
build=${DTLAB_GPU_BUILD_DIR:-$root/build-gpu}
me="tools/gpu_check.sh"
flags_text="--fetch-deps [--with-mesa], --build-only, --skip-screens, --quick, --only STEPS, --verify-prefix, --build-dir DIR, --cmake-args \"ARGS\", --isolate, --help"

mode=run with_mesa=0 quick=0 skip_screens=0 isolate=0 extra_cmake="" only=""
while (($#)); do
  case "$1" in
    --fetch-deps) mode=fetch ;;
    --with-mesa) with_mesa=1 ;;
    --build-only) mode=build ;;
    --verify-prefix) mode=verify ;;
    --skip-screens) skip_screens=1 ;;
    --quick) quick=1 ;;
    --isolate) isolate=1 ;;
    --build-dir)
      (($# >= 2)) || { echo "$me: --build-dir needs a directory; use --build-dir DIR" >&2; exit 2; }
      build=$2; shift ;;
    --build-dir=*) build=${1#*=} ;;
    --cmake-args)
      (($# >= 2)) || { echo "$me: --cmake-args needs its arguments in one word; use --cmake-args \"-DX=Y ...\"" >&2; exit 2; }
      extra_cmake=$2; shift ;;
    --cmake-args=*) extra_cmake=${1#*=} ;;
    --only)
      (($# >= 2)) || { echo "$me: --only needs a list of steps; use --only tests,train (steps: gpu-info tests train bench ring mfu bench-bf16 bench-gpt screens bench-gemm)" >&2; exit 2; }
      only=$2; shift ;;
    --only=*) only=${1#*=} ;;
    -h|--help) sed -n '2,/^set -uo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$me: unknown flag '$1'; the flags are $flags_text (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for o in ${only//,/ }; do
  case $o in gpu-info|tests|train|bench|ring|mfu|bench-bf16|bench-gpt|screens|bench-gemm) ;;
    *) echo "$me: --only: unknown step '$o'; the steps are gpu-info, tests, train, bench, ring, mfu, bench-bf16, bench-gpt, screens, bench-gemm" >&2; exit 2 ;;
  esac
done
if ((with_mesa)) && [[ $mode != fetch ]]; then
  echo "$me: --with-mesa only goes with --fetch-deps; use: bash $me --fetch-deps --with-mesa" >&2
  exit 2
fi
[[ $build = /* ]] || build=$PWD/$build
logs=$build/gpu_check
# The unpacked packages live beside the build that points into them (RPATH, CMake cache), not in .deps:
# .deps is what travels to the device machine, and unpacked it is 150 MB (350 MB with .deps-gl).
prefix=$build/deps-prefix
jobs=$(nproc 2>/dev/null || echo 2)

# ---------------------------------------------------------------------------------------------------
# --fetch-deps: apt-get download the closure into .deps/ (and .deps-gl/ with --with-mesa)
# ---------------------------------------------------------------------------------------------------
# What dtlab builds and runs against (tools/dtlab.sh's list, less the toolchain and fonts-dejavu-core),
# plus libopengl-dev (FindOpenGL's GLVND libOpenGL.so) and the packages Xvfb needs to start from a prefix.
SEEDS=(zlib1g-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread nlohmann-json3-dev libcli11-dev
       doctest-dev libglfw3-dev libimgui-dev libstb-dev libmd4c-dev libgl-dev libopengl-dev xvfb xauth
       x11-xkb-utils xkb-data)
# On any Debian/Ubuntu base with g++, python3 and apt (the CUDA machine): never fetched, never shadowed.
ASSUMED=(libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt-dev libcrypt1 libnsl-dev libnsl2 rpcsvc-proto
         libtirpc-dev libtirpc3 libtirpc-common libkrb5-3 libkrb5support0 libk5crypto3 libgssapi-krb5-2
         libkeyutils1 libcom-err2 libssl3 gcc-12-base libgcc-s1 libstdc++6 libgomp1 libtinfo6 libselinux1
         libpcre2-8-0 libaudit1 libaudit-common libcap-ng0 libcap2 libsystemd0 libgcrypt20 libgpg-error0
         liblz4-1 liblzma5 libzstd1 libbz2-1.0 libuuid1 lsb-base sysvinit-utils libexpat1 libffi8 zlib1g
         debconf dpkg perl-base)
# Changelogs, man pages and rgb.txt: Xvfb starts without them (xserver-common alone is 2.3 MB of changelog).
DOCS_ONLY=(xserver-common x11-common xorg-sgml-doctools fonts-dejavu-core)
# Mesa's GLX vendor library and software renderer (and through them libLLVM-15, libz3, libicu): --with-mesa.
MESA=(libglx-mesa0 libgl1-mesa-dri)

# apt's own plan for PKG... on a machine with nothing installed (an empty dpkg status): the universe, with
# apt's choice among alternatives; one package a line.
resolve() {
  local status=$1; shift
  : >"$status"
  apt-get install -s -qq --no-install-recommends -o Dir::State::status="$status" "$@" 2>"$status.err" |
    awk '/^Inst / {sub(/:.*/, "", $2); print $2}' | sort -u
  if grep -q '^E:' "$status.err"; then cat "$status.err" >&2; return 1; fi
}

# closure UNIVERSE-FILE STOP-LIST ROOT...: the packages of the universe reachable from ROOT... through
# Depends and Pre-Depends, not entering the packages named in STOP-LIST (a space-separated string).
closure() {
  local ufile=$1 stop=" $2 "; shift 2
  # shellcheck disable=SC2046
  apt-cache depends --important $(cat "$ufile") 2>/dev/null | awk -v stop="$stop" -v roots="$*" -v ufile="$ufile" '
    BEGIN { while ((getline p < ufile) > 0) in_u[p] = 1 }
    /^[^ ]/ { pkg = $1; next }
    { dep = $NF; gsub(/[<>]/, "", dep); sub(/:.*/, "", dep); if (dep in in_u) edges[pkg] = edges[pkg] " " dep }
    END {
      n = split(roots, q, " "); head = 1
      for (i = 1; i <= n; i++) seen[q[i]] = 1
      while (head <= n) {
        p = q[head++]
        if (index(stop, " " p " ")) continue
        print p
        m = split(edges[p], d, " ")
        for (j = 1; j <= m; j++) if (!(d[j] in seen)) { seen[d[j]] = 1; q[++n] = d[j] }
      }
    }' | sort -u
}

download_into() {  # download_into DIR PKG...: exactly these packages end up in DIR
  local dir=$1; shift
  mkdir -p "$dir"
  local p f keep=" $* " stale=0
  for f in "$dir"/*.deb; do
    [[ -e $f ]] || continue
    p=$(basename "$f"); p=${p%%_*}
    if [[ $keep != *" $p "* ]]; then rm -f "$f"; stale=$((stale + 1)); fi
  done
  ((stale)) && echo "   removed $stale .deb file(s) no longer in the set"
  (cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$@" >"$dir/download.log" 2>&1) || {
    cat "$dir/download.log" >&2; return 1; }
  # An older version of a package left beside the new one: keep the one apt just fetched.
  for p in "$@"; do
    local files=("$dir/${p}_"*.deb)
    ((${#files[@]} > 1)) && ls -t "${files[@]}" | tail -n +2 | xargs rm -f
  done
  return 0
}

list_sizes() {  # list_sizes DIR: the packages, their sizes, the total; sets $total_bytes
  local dir=$1 f s
  total_bytes=0
  : >"$dir/MANIFEST.txt"
  for f in "$dir"/*.deb; do
    s=$(stat -c %s "$f")
    total_bytes=$((total_bytes + s))
    printf '%9s  %s\n' "$(numfmt --to=iec --suffix=B "$s" 2>/dev/null || echo "$s")" "$(basename "$f")" >>"$dir/MANIFEST.txt"
  done
  sort -k2 "$dir/MANIFEST.txt" | column -c 160 2>/dev/null || sort -k2 "$dir/MANIFEST.txt"
}

fetch_deps() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || {
    echo "$me: --fetch-deps needs apt-get and dpkg (a Debian 12 machine); run it there and carry .deps" >&2; return 1; }
  local arch; arch=$(dpkg --print-architecture)
  [[ $arch == amd64 ]] || { echo "$me: --fetch-deps runs on an amd64 Debian machine (the GPU machine is x86-64); this one is $arch" >&2; return 1; }
  if [[ $(apt-cache policy xvfb 2>/dev/null) != *"Candidate: "[0-9]* ]]; then
    echo "$me: apt knows no candidate for xvfb; run 'apt-get update' first" >&2; return 1
  fi
  local tmp; tmp=$(mktemp -d)
  echo "== resolving the dependency closure (apt's plan on an empty machine, less ${#ASSUMED[@]} base packages a CUDA machine has)"
  resolve "$tmp/status" "${SEEDS[@]}" "${MESA[@]}" >"$tmp/universe" || { rm -rf "$tmp"; return 1; }
  local base; base=$(closure "$tmp/universe" "${ASSUMED[*]} ${DOCS_ONLY[*]} ${MESA[*]}" "${SEEDS[@]}")
  echo "== downloading $(wc -w <<<"$base") packages into .deps/"
  # shellcheck disable=SC2086
  download_into "$deps" $base || { rm -rf "$tmp"; return 1; }
  list_sizes "$deps"
  local base_bytes=$total_bytes
  echo "== .deps/: $(ls "$deps"/*.deb | wc -l) packages, $(numfmt --to=iec --suffix=B $base_bytes) ($base_bytes bytes); list in .deps/MANIFEST.txt"
  if ((with_mesa)); then
    local gl; gl=$(closure "$tmp/universe" "${ASSUMED[*]} ${DOCS_ONLY[*]} $(echo $base)" "${MESA[@]}")
    echo "== downloading $(wc -w <<<"$gl") packages of Mesa's software GL into .deps-gl/"
    # shellcheck disable=SC2086
    download_into "$gldeps" $gl || { rm -rf "$tmp"; return 1; }
    list_sizes "$gldeps"
    echo "== .deps-gl/: $(ls "$gldeps"/*.deb | wc -l) packages, $(numfmt --to=iec --suffix=B $total_bytes) ($total_bytes bytes)"
    echo "   note: .deps + .deps-gl + the working tree exceed the device tool's 64 MiB: carry .deps-gl only where it fits"
  elif [[ -d $gldeps ]]; then
    echo "   (.deps-gl/ from an earlier --with-mesa is still there and will be unpacked too)"
  fi
  rm -rf "$tmp"
  local tree; tree=$(cd "$root" && git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  if [[ -n $tree ]]; then
    echo "== what travels with carry=[\".deps\"]: working tree $(numfmt --to=iec --suffix=B "$tree") + .deps $(numfmt --to=iec --suffix=B $base_bytes) = $(numfmt --to=iec --suffix=B $((tree + base_bytes))) (limit 64MiB)"
    ((tree + base_bytes > 64 * 1048576)) && echo "   WARNING: over the device tool's 64 MiB limit"
  fi
  ((base_bytes > 50 * 1048576)) && echo "   WARNING: .deps is over 50 MiB"
  echo "== done; on the GPU machine: bash $me   (with .deps carried)"
}

if [[ $mode == fetch ]]; then
  fetch_deps
  exit $?
fi

# ---------------------------------------------------------------------------------------------------
# The step runner: every step timed, logged, recorded; the summary rewritten after each step
# ---------------------------------------------------------------------------------------------------
mkdir -p "$logs"
budget=${DTLAB_GPU_CHECK_BUDGET:-$((quick ? 420 : 570))}
t_start=$SECONDS
declare -a S_NAME=() S_RESULT=() S_FIGURE=() S_SECS=() S_LOG=()

record() {  # record NAME RESULT FIGURE SECONDS LOG
  S_NAME+=("$1"); S_RESULT+=("$2"); S_FIGURE+=("$3"); S_SECS+=("$4"); S_LOG+=("$5")
  printf '   %-22s %-8s %s\n' "$1" "$2" "$3"
  write_summary >/dev/null
}

# What is left of the budget for a step that wants WANT seconds (0: too little left to start it).
limit_for() {
  local want=$1 left=$((budget - (SECONDS - t_start) - 10))
  ((left < want)) && want=$left
  ((want < 5)) && want=0
  echo "$want"
}

# run_logged LOG LIMIT CMD...: the command under timeout, its output in LOG; sets $secs; returns its status.
run_logged() {
  local log=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  { printf '$'; printf ' %q' "$@"; printf '\n(timeout %ss)\n\n' "$limit"; } >>"$log"
  if ((limit <= 0)); then  # timeout 0 would mean no limit at all
    echo "[gpu_check] not run: the time budget is spent" >>"$log"; secs=0; return 124
  fi
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  if ((rc == 124 || rc == 137)); then echo "[gpu_check] timed out after ${limit}s" >>"$log"; fi
  printf '\n[gpu_check] exit %s after %ss\n\n' "$rc" "$secs" >>"$log"
  return $rc
}

# The command's own output in LOG, without the lines run_logged adds.
output_of() { grep -v -e '^\$ ' -e '^(timeout ' -e '^\[gpu_check\]' "$1" 2>/dev/null; }

rel() { local p=$1; [[ $p == "$root"/* ]] && p=${p#"$root"/}; echo "$p"; }

write_summary() {
  local f=$logs/summary.md i pass=0 fail=0 skip=0 off=0
  {
    echo "# dtlab gpu_check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
    echo
    echo "$machine_line"
    echo
    echo "| step | result | figure | s | log |"
    echo "|---|---|---|---|---|"
    for i in "${!S_NAME[@]}"; do
      echo "| ${S_NAME[$i]} | ${S_RESULT[$i]} | ${S_FIGURE[$i]//|//} | ${S_SECS[$i]} | $(rel "${S_LOG[$i]}") |"
      case ${S_RESULT[$i]} in pass) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; off) off=$((off + 1)) ;; *) skip=$((skip + 1)) ;; esac
    done
    echo
    echo "$pass passed, $fail failed, $skip skipped, $off off by flag; $((SECONDS - t_start)) s in all"
  } >"$f"
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then cp "$f" "$OUT/summary.md" 2>/dev/null; fi
  echo "$f"
}

# ---------------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------------
gpu=0
gpu_reason=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_reason="nvidia-smi not found"
elif [[ $(timeout 30 nvidia-smi -L 2>/dev/null) != *"GPU "[0-9]* ]]; then
  gpu_reason="nvidia-smi lists no device"
else
  gpu=1
fi
if ((gpu)); then
  machine_line="GPU: $(timeout 30 nvidia-smi -L 2>/dev/null | head -4 | sed 's/ (UUID.*//' | paste -sd ';' -); $jobs CPU cores"
else
  machine_line="no CUDA device ($gpu_reason); $jobs CPU cores"
  if [[ $mode == run ]]; then
    echo "$me: no CUDA device on this machine ($gpu_reason): building and running the CPU side only, the GPU steps are marked 'skipped: no CUDA device'."
  fi
fi

libdir=$prefix/usr/lib/x86_64-linux-gnu
# For the prefix's own programs (Xvfb, xkbcomp) and the GL stack they dlopen; dtlab's binaries carry an RPATH.
prefix_ld_path=$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---------------------------------------------------------------------------------------------------
# deps: unpack .deps/*.deb (and .deps-gl/*.deb) into $build/deps-prefix
# ---------------------------------------------------------------------------------------------------
fix_prefix() {
  # pkg-config and CMake files say /usr: make them say the prefix (once, on a fresh unpack).
  local f
  while IFS= read -r -d '' f; do
    sed -E -i "s#(^|[=[:space:]]|-I|-L)/usr(/|\$|[[:space:]])#\\1$prefix/usr\\2#g" "$f"
  done < <(find "$prefix" -name '*.pc' -print0)
  while IFS= read -r -d '' f; do
    sed -E -i "s#\"/usr([/\"])#\"$prefix/usr\\1#g" "$f"
  done < <(find "$prefix" \( -path '*/cmake/*' -name '*.cmake' \) -print0)
  # Absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13): into the prefix where the target was
  # unpacked, else to this machine's copy of the same library (zlib's runtime is on every machine).
  local l t base host
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    if [[ -e $prefix$t ]]; then
      ln -sfn "$prefix$t" "$l"
    elif [[ ! -e $t && $(basename "$l") == lib*.so ]]; then
      base=$(basename "$l")
      host=$(ldconfig -p 2>/dev/null | awk -v n="$base." '/x86-64/ && index($1, n) == 1 {print $NF; exit}')
      [[ -n $host ]] && ln -sfn "$host" "$l" && echo "relinked $l -> $host (this machine's runtime library)"
    fi
  done < <(find "$prefix" -type l -lname '/*' -print0)
}

unpack_deps() {
  local log=$logs/deps.log
  : >"$log"
  local debs=("$deps"/*.deb)
  [[ -d $gldeps ]] && debs+=("$gldeps"/*.deb)
  local real=() f
  for f in "${debs[@]}"; do [[ -e $f ]] && real+=("$f"); done
  if ((${#real[@]} == 0)); then
    echo "no .deb files in .deps/: run 'bash $me --fetch-deps' on a Debian 12 machine with apt, then carry .deps" >>"$log"
    record deps FAIL "no .deb in .deps/ (run --fetch-deps on a Debian 12 machine, then carry .deps)" 0 "$log"
    return 1
  fi
  local stamp; stamp=$( (echo "$prefix"; ls -l "${real[@]}") | md5sum | cut -c1-32)
  local t0=$SECONDS bytes; bytes=$(stat -c %s "${real[@]}" | awk '{s += $1} END {print s}')
  if [[ -f $prefix/.stamp && $(cat "$prefix/.stamp") == "$stamp" ]]; then
    echo "prefix $prefix is up to date with ${#real[@]} .deb files" >>"$log"
  else
    rm -rf "$prefix"
    mkdir -p "$prefix"
    local bad=0
    for f in "${real[@]}"; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$f" "$prefix" >>"$log" 2>&1 || { echo "failed: $f" >>"$log"; bad=$((bad + 1)); }
      else  # no dpkg: a .deb is an ar archive with data.tar.*
        (cd "$prefix" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null ||
          ar p "$f" "$(ar t "$f" | grep '^data.tar')" | xz -dc | tar -x) >>"$log" 2>&1 || { echo "failed: $f" >>"$log"; bad=$((bad + 1)); }
      fi
    done
    fix_prefix >>"$log" 2>&1
    if ((bad)); then
      record deps FAIL "$bad of ${#real[@]} .deb files did not unpack" $((SECONDS - t0)) "$log"
      return 1
    fi
    echo "$stamp" >"$prefix/.stamp"
    echo "unpacked ${#real[@]} .deb files into $prefix" >>"$log"
  fi
  local mesa="no Mesa software GL"
  [[ -e $libdir/dri/swrast_dri.so ]] && mesa="with Mesa software GL"
  record deps pass "${#real[@]} .debs ($(numfmt --to=iec --suffix=B "$bytes")) in $(rel "$prefix"), $mesa" $((SECONDS - t0)) "$log"
}

# ---------------------------------------------------------------------------------------------------
# configure, build, verify-prefix
# ---------------------------------------------------------------------------------------------------
nccl_home=""
find_nccl() {  # NCCL in the toolkit or /usr, else the nvidia-nccl wheel of python3's site-packages
  [[ -n ${NCCL_HOME:-} ]] && return 0
  local c
  for c in /usr/local/cuda/include /usr/include "${CUDA_HOME:-/usr/local/cuda}/include"; do
    [[ -e $c/nccl.h ]] && return 0
  done
  local wheel; wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) || return 0
  [[ -e $wheel/include/nccl.h ]] || return 0
  local so; so=$(ls "$wheel"/lib/libnccl.so* 2>/dev/null | head -1)
  [[ -n $so ]] || return 0
  nccl_home=$build/nccl-home
  mkdir -p "$nccl_home/lib"
  ln -sfn "$wheel/include" "$nccl_home/include"
  ln -sfn "$so" "$nccl_home/lib/$(basename "$so")"
  ln -sfn "$so" "$nccl_home/lib/libnccl.so"
  export NCCL_HOME=$nccl_home
}

configure() {
  local log=$logs/configure.log
  : >"$log"
  # A cache made against another unpacking of the prefix (or none) holds its find results: start afresh.
  local marker=$build/gpu_check_prefix.stamp
  if [[ -f $build/CMakeCache.txt && $(cat "$marker" 2>/dev/null) != "$(cat "$prefix/.stamp")" ]]; then
    echo "CMakeCache.txt was made against another prefix: removing it" >>"$log"
    rm -f "$build/CMakeCache.txt"
  fi
  local args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "-DDTLAB_DEPS_PREFIX=$prefix" -DDTLAB_GUI=ON)
  if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
  if ((gpu)); then
    args+=(-DDTLAB_CUDA=ON)
    [[ -d /usr/local/cuda ]] && args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
    find_nccl
    [[ -n $nccl_home ]] && echo "NCCL from python3's nvidia-nccl wheel: NCCL_HOME=$nccl_home" >>"$log"
  fi
  if ((isolate)); then
    args+=("-DCMAKE_IGNORE_PREFIX_PATH=/usr;/;/usr/local" "-DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr;/;/usr/local")
  fi
  # shellcheck disable=SC2206
  [[ -n $extra_cmake ]] && args+=($extra_cmake)
  local lim; lim=$(limit_for 180)
  if run_logged "$log" "$lim" cmake "${args[@]}"; then
    cp "$prefix/.stamp" "$marker"
    local what; what=$(grep -E -- '^-- dtlab: (CUDA|desktop)' "$log" | sed 's/^-- dtlab: //' | paste -sd ';' - | cut -c1-160)
    record configure pass "$what" "$secs" "$log"
  else
    record configure FAIL "$(grep -m1 -E 'CMake Error|dtlab:.*(not found|missing)' "$log" | cut -c1-160)" "$secs" "$log"
    return 1
  fi
}

build_all() {
  local log=$logs/build.log
  : >"$log"
  local lim; lim=$(limit_for $((budget * 3 / 4)))  # 427 s of the default 570
  if ((lim == 0)); then record build "skipped: time budget" "" 0 "$log"; return 1; fi
  if run_logged "$log" "$lim" cmake --build "$build" -j "$jobs"; then
    record build pass "$(ls "$build/bin" 2>/dev/null | paste -sd ' ' - | cut -c1-150); $(grep -c 'warning:' "$log") warnings" "$secs" "$log"
  else
    record build FAIL "$(grep -m1 -E 'error:|Error [0-9]|FAILED:' "$log" | cut -c1-160)" "$secs" "$log"
    return 1
  fi
}

# Everything CMake found, every header the compiler read, every library on the link lines and every library
# the built binaries load: inside the prefix, or (for libraries the prefix does not carry) the machine's own.
verify_prefix() {
  local log=$logs/verify_prefix.log t0=$SECONDS
  : >"$log"
  local cache=$build/CMakeCache.txt
  if [[ ! -f $cache ]]; then
    echo "no $cache: configure first (bash $me --build-only)" >>"$log"
    record verify-prefix FAIL "no CMakeCache.txt in $(rel "$build")" 0 "$log"
    return 1
  fi
  local pfx; pfx=$(sed -n 's/^DTLAB_DEPS_PREFIX:[A-Z]*=//p' "$cache")
  if [[ -z $pfx ]]; then
    echo "$(rel "$build") was configured without DTLAB_DEPS_PREFIX" >>"$log"
    record verify-prefix FAIL "$(rel "$build") not configured with DTLAB_DEPS_PREFIX" 0 "$log"
    return 1
  fi
  local inside=0 outside=0 v val
  echo "== CMake cache entries (must lie in $pfx)" >>"$log"
  for v in DTLAB_CBLAS_INCLUDE DTLAB_OPENBLAS nlohmann_json_DIR CLI11_DIR doctest_DIR ZLIB_INCLUDE_DIR ZLIB_LIBRARY \
           ZLIB_LIBRARY_RELEASE OPENGL_INCLUDE_DIR OPENGL_opengl_LIBRARY OPENGL_glx_LIBRARY OPENGL_gl_LIBRARY \
           GLFW3_INCLUDEDIR GLFW3_LIBDIR IMGUI_INCLUDEDIR IMGUI_LIBDIR STB_INCLUDEDIR STB_LIBDIR MD4C_INCLUDEDIR MD4C_LIBDIR \
           pkgcfg_lib_GLFW3_glfw pkgcfg_lib_IMGUI_imgui pkgcfg_lib_STB_stb pkgcfg_lib_MD4C_md4c; do
    val=$(sed -n "s/^$v:[A-Z]*=//p" "$cache" | head -1)
    [[ -z $val ]] && continue
    if [[ $val == "$pfx"/* ]]; then
      inside=$((inside + 1)); printf '  ok       %-24s %s\n' "$v" "$val" >>"$log"
    elif [[ $val == *-NOTFOUND ]]; then
      printf '  notfound %-24s %s\n' "$v" "$val" >>"$log"
    else
      outside=$((outside + 1)); printf '  OUTSIDE  %-24s %s\n' "$v" "$val" >>"$log"
    fi
  done
  # Headers of the fetched packages the compiler read from /usr/include instead of the prefix.
  local sys_re='^/usr/include/(nlohmann/|CLI/|doctest/|GLFW/|imgui/|stb/|md4c[^/]*\.h|zlib\.h|zconf\.h|cblas\.h|openblas_config\.h|GL/|KHR/|x86_64-linux-gnu/(openblas[^/]*/|cblas\.h|openblas_config\.h|zconf\.h))'
  local deplist=$logs/verify_headers.txt
  if [[ -f $build/build.ninja ]] && command -v ninja >/dev/null; then
    ninja -C "$build" -t deps 2>/dev/null | awk 'NF == 1 && $1 ~ /^\// {print $1}' | sort -u >"$deplist"
  else
    find "$build" \( -name '*.d' -o -name 'compiler_depend.make' \) -type f -print0 2>/dev/null |
      xargs -0 -r cat | tr ' \\:' '\n\n\n' | grep '^/' | sort -u >"$deplist"
  fi
  local nheaders npfx nsys
  nheaders=$(wc -l <"$deplist")
  npfx=$(grep -c "^$pfx/" "$deplist")
  nsys=$(grep -Ec "$sys_re" "$deplist")
  echo "== headers the compiler read: $nheaders, $npfx of them in the prefix, $nsys of the fetched packages from /usr/include" >>"$log"
  grep -E "$sys_re" "$deplist" | sed 's/^/  SYSTEM   /' >>"$log"
  grep "^$pfx/" "$deplist" | sed "s#^$pfx/##" | awk -F/ '{print $1"/"$2"/"$3}' | sort | uniq -c | sed 's/^/  prefix  /' >>"$log"
  # Link lines naming a system copy of a fetched library.
  local lib_re='(^|[[:space:]"=:,])/usr/lib/x86_64-linux-gnu/(openblas[^/]*/)?lib(openblas|blas|glfw|imgui|stb|md4c|z|GL|GLX|OpenGL)\.(so|a)\b'
  local nlink=0
  if [[ -f $build/build.ninja ]]; then
    nlink=$(grep -E "LINK_LIBRARIES|LINK_PATH" "$build/build.ninja" | grep -Ec "$lib_re")
    grep -E "LINK_LIBRARIES|LINK_PATH" "$build/build.ninja" | grep -Eo "$lib_re" | sort -u | sed 's/^/  SYSTEM link /' >>"$log"
  else
    nlink=$(find "$build" -name link.txt -print0 | xargs -0 -r cat | grep -Ec "$lib_re")
    find "$build" -name link.txt -print0 | xargs -0 -r cat | grep -Eo "$lib_re" | sort -u | sed 's/^/  SYSTEM link /' >>"$log"
  fi
  echo "== link lines naming a system copy of a fetched library: $nlink" >>"$log"
  # The built binaries' libraries, as the loader finds them without LD_LIBRARY_PATH.
  local b missing=0 from_pfx=0 nbin=0
  echo "== ldd (no LD_LIBRARY_PATH)" >>"$log"
  for b in "$build"/bin/*; do
    [[ -x $b && -f $b ]] || continue
    nbin=$((nbin + 1))
    local out; out=$(env -u LD_LIBRARY_PATH ldd "$b" 2>&1)
    echo "-- $(basename "$b")" >>"$log"
    echo "$out" | sed 's/^/  /' >>"$log"
    missing=$((missing + $(grep -c 'not found' <<<"$out")))
    from_pfx=$((from_pfx + $(grep -c "=> $pfx/" <<<"$out")))
  done
  local fig="cache: $inside in prefix, $outside outside; headers: $npfx from prefix, $nsys from /usr/include; links: $nlink system; ldd: $nbin binaries, $missing missing, $from_pfx from prefix"
  echo "== $fig" >>"$log"
  if ((outside == 0 && nsys == 0 && nlink == 0 && missing == 0 && inside > 0)); then
    record verify-prefix pass "$fig" $((SECONDS - t0)) "$log"
  else
    record verify-prefix FAIL "$fig" $((SECONDS - t0)) "$log"
    return 1
  fi
}

# ---------------------------------------------------------------------------------------------------
# a-e: the GPU steps
# ---------------------------------------------------------------------------------------------------
bin=$build/bin
gpu_skip="skipped: no CUDA device"

step_gpu_info() {
  local log=$logs/gpu_info.log
  : >"$log"
  local t0=$SECONDS
  if command -v nvidia-smi >/dev/null; then
    run_logged "$log" 30 nvidia-smi
    run_logged "$log" 30 nvidia-smi -L
  else
    echo "nvidia-smi not found" >>"$log"
  fi
  if [[ -x $bin/dtlab-cli ]]; then
    run_logged "$log" "$(limit_for 60)" "$bin/dtlab-cli" train --strategy single --steps 1 --device cuda
  fi
  local summary; summary=$(output_of "$log" | grep -m1 -E 'CUDA runtime|no CUDA device|without CUDA|CUDA engine' | sed 's/^ *//' | cut -c1-160)
  if ((gpu)); then
    if grep -q 'CUDA runtime' "$log"; then
      record gpu-info pass "$summary" $((SECONDS - t0)) "$log"
    else
      record gpu-info FAIL "nvidia-smi sees a GPU but dtlab-cli printed no CUDA runtime summary: ${summary:-see log}" $((SECONDS - t0)) "$log"
    fi
  else
    record gpu-info "$gpu_skip" "$gpu_reason${summary:+; $summary}" $((SECONDS - t0)) "$log"
  fi
}

step_tests() {
  local log=$logs/tests_cuda_nccl.log
  : >"$log"
  if [[ ! -x $bin/dtlab_tests ]]; then record tests FAIL "no $(rel "$bin")/dtlab_tests" 0 "$log"; return; fi
  local lim; lim=$(limit_for $((quick ? 120 : 240)))
  if ((lim == 0)); then record tests "skipped: time budget" "" 0 "$log"; return; fi
  local env_args=()
  ((quick)) && env_args=(env DTLAB_TEST_QUICK=1)
  run_logged "$log" "$lim" "${env_args[@]}" "$bin/dtlab_tests" -ts=cuda,nccl
  local rc=$?
  local line; line=$(grep -m1 '^\[doctest\] test cases:' "$log" | sed 's/\[doctest\] //; s/  */ /g')
  local self_nodev self_need self_built
  self_nodev=$(grep -c 'skipped: no CUDA device' "$log")
  self_need=$(grep -c 'skipped: needs [0-9]* CUDA devices' "$log")
  self_built=$(grep -c 'skipped: built without CUDA' "$log")
  local fig="${line:-no doctest summary (exit $rc)}; printed skipped: $self_nodev no device, $self_need need more GPUs, $self_built built without CUDA"
  if ((!gpu)); then
    record tests "$gpu_skip" "$fig" "$secs" "$log"
  elif ((rc == 0 && self_nodev == 0 && self_built == 0)) && [[ -n $line ]]; then
    record tests pass "$fig" "$secs" "$log"
  else
    record tests FAIL "$fig" "$secs" "$log"
  fi
}

json_field() {  # json_field FILE KEY: KEY's number in the last {"summary":true,...} line
  grep '"summary":true' "$1" 2>/dev/null | tail -1 | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p"
}

train_row() {  # train_row NAME "COMMON ARGS" ["GPU-ONLY ARGS" [RELATIVE TOLERANCE]]
  local name=$1 common=$2 gpu_extra=${3:-} tol=${4:-1e-5}
  local log=$logs/train_$name.log
  : >"$log"
  local lim; lim=$(limit_for 90)
  if ((lim == 0)); then record "train-$name" "skipped: time budget" "" 0 "$log"; return; fi
  local base=(train --steps 20 --batch 32 --seed 0 --json)
  [[ $common == *--model* ]] || base+=(--model "mlp:2,64,64,64,64,3" --data spiral)
  local t0=$SECONDS
  # shellcheck disable=SC2206
  local c=($common) g=($gpu_extra)
  echo "== cpu" >>"$log"
  run_logged "$log.cpu" "$lim" "$bin/dtlab-cli" "${base[@]}" "${c[@]}" --device cpu
  local crc=$?
  cat "$log.cpu" >>"$log"
  echo "== cuda" >>"$log"
  run_logged "$log.cuda" "$(limit_for 90)" "$bin/dtlab-cli" "${base[@]}" "${c[@]}" --device cuda "${g[@]}"
  local grc=$?
  cat "$log.cuda" >>"$log"
  local cl gl ca ga
  cl=$(json_field "$log.cpu" train_loss); ca=$(json_field "$log.cpu" train_accuracy)
  gl=$(json_field "$log.cuda" train_loss); ga=$(json_field "$log.cuda" train_accuracy)
  [[ -n $ca ]] && ca=$(awk -v a="$ca" 'BEGIN {printf "%.4f", a}')
  [[ -n $ga ]] && ga=$(awk -v a="$ga" 'BEGIN {printf "%.4f", a}')
  local gerr; gerr=$(output_of "$log.cuda" | grep -v '^{' | grep -m1 . | cut -c1-110 | sed 's/[; ]*$//')
  rm -f "$log.cpu" "$log.cuda"
  local secs_all=$((SECONDS - t0))
  if [[ -z $cl ]]; then
    record "train-$name" FAIL "cpu run failed (exit $crc): $(output_of "$log" | grep -m1 -iE 'error|dtlab-cli' | cut -c1-110)" "$secs_all" "$log"
    return
  fi
  if ((!gpu)); then
    record "train-$name" "$gpu_skip" "cpu loss $cl acc $ca; cuda: ${gerr:-exit $grc}" "$secs_all" "$log"
    return
  fi
  if [[ -z $gl ]]; then
    record "train-$name" FAIL "cpu loss $cl; cuda run failed (exit $grc): $gerr" "$secs_all" "$log"
    return
  fi
  local verdict
  verdict=$(awk -v g="$gl" -v c="$cl" -v t="$tol" 'BEGIN { d = g - c; if (d < 0) d = -d; m = c < 0 ? -c : c; if (m < 1) m = 1;
                                                printf "%s |diff| %.2g", (d <= t * m ? "pass" : "FAIL"), d }')
  record "train-$name" "${verdict%% *}" "loss cuda $gl cpu $cl (${verdict#* }); acc cuda $ga cpu $ca" "$secs_all" "$log"
}

step_train() {
  if [[ ! -x $bin/dtlab-cli ]]; then record train FAIL "no $(rel "$bin")/dtlab-cli" 0 "$logs/build.log"; return; fi
  local pipe="--strategy pipeline --stages 2 --dp 2 --microbatches 4"
  train_row single "--strategy single"
  train_row ddp4 "--strategy ddp --world 4"
  ((quick)) || train_row ddp4-sgd-accum "--strategy ddp --world 4 --optimizer sgd --lr 0.1 --momentum 0.9 --accum 2"
  ((quick)) || train_row ddp1-nccl "--strategy ddp --world 1" "--backend nccl"
  train_row fsdp-full "--strategy fsdp --world 4 --sharding full"
  if ((!quick)); then
    train_row fsdp-grad-op "--strategy fsdp --world 4 --sharding grad-op"
    train_row fsdp-no-shard "--strategy fsdp --world 4 --sharding no-shard"
    train_row fsdp-hybrid "--strategy fsdp --world 4 --sharding hybrid --node-size 2"
    train_row fsdp-zero1 "--strategy fsdp --world 4 --sharding zero1"
    # FSDP2 (fully_shard): per-parameter dim-0 shards, reshard to groups of 2, HSDP; not yet run on a GPU.
    train_row fsdp2-full "--strategy fsdp --world 4 --fsdp-api 2"
    train_row fsdp2-reshard2 "--strategy fsdp --world 4 --fsdp-api 2 --reshard-after-forward 2 --forward-prefetch --prefetch 2"
    train_row fsdp2-hsdp "--strategy fsdp --world 4 --fsdp-api 2 --sharding hybrid --node-size 2"
    train_row pipe-gpipe "$pipe --schedule gpipe"
  fi
  train_row pipe-1f1b "$pipe --schedule 1f1b"
  if ((!quick)); then
    train_row pipe-interleaved "$pipe --schedule interleaved --chunks 2"
    train_row pipe-zb-h1 "$pipe --schedule zb-h1"
  fi
  # DataParallel (one process, replicas sharing the GPU) and Megatron TP on the GPU.
  train_row dp4 "--strategy dp --world 4"
  train_row tp2-ddp2 "--strategy ddp --world 4 --tp 2"
  ((quick)) || train_row tp2-sp-fsdp2 "--strategy fsdp --world 4 --tp 2 --sequence-parallel"
  # Mixed precision on the GPU (engine/cuda/half_kernels.cu: the CPU's roundings, bit for bit, around the
  # float32 kernels): the GEMMs sum in another order, and a rounding to 16 bits can then land one unit
  # apart, so these rows allow torch.testing's bf16/fp16 rtol (1.6e-2, 1e-3) of the loss; plain SGD.
  train_row bf16-ddp4 "--strategy ddp --world 4 --precision bf16 --optimizer sgd --lr 0.1" "" 1.6e-2
  ((quick)) || train_row fp16-ddp4 "--strategy ddp --world 4 --precision fp16 --optimizer sgd --lr 0.1" "" 1e-3
  train_row bf16-tp2-ddp2 "--strategy ddp --world 4 --tp 2 --precision bf16 --optimizer sgd --lr 0.1" "" 1.6e-2
  train_row bf16-fsdp4 "--strategy fsdp --world 4 --sharding full --precision bf16 --optimizer sgd --lr 0.1" "" 1.6e-2
  ((quick)) || train_row bf16-dp4 "--strategy dp --world 4 --precision bf16 --optimizer sgd --lr 0.1" "" 1.6e-2
  ((quick)) || train_row bf16-pipe-1f1b "$pipe --schedule 1f1b --precision bf16 --optimizer sgd --lr 0.1" "" 1.6e-2
  # The GPT (engine/cuda/gpt_kernels.cu): its softmaxes, LayerNorms and GELU (erff against the CPU's
  # vectorised erf) round differently from the CPU's loops, so its rows allow 1e-4 of the loss.
  local gpt="--model gpt:layers=2,heads=4,embd=64,ctx=32 --data text"
  train_row gpt-single "$gpt --strategy single" "" 1e-4
  train_row gpt-ddp2 "$gpt --strategy ddp --world 2" "" 1e-4
  ((quick)) || train_row gpt-fsdp2 "$gpt --strategy fsdp --world 2 --sharding full" "" 1e-4
  ((quick)) || train_row gpt-pipe-zb-h1 "$gpt --strategy pipeline --stages 2 --microbatches 4 --schedule zb-h1" "" 1e-4
  ((quick)) || train_row gpt-lora-ddp2 "$gpt --strategy ddp --world 2 --lora-rank 4" "" 1e-4
  # Plain SGD for the layouts below: under AdamW a near-zero gradient's rounding becomes a whole lr step, so
  # even two CPU runs that are equal in exact arithmetic (ddp 2 against ddp 2 x tp 2, or DataParallel)
  # end 20 steps up to 1.5e-3 apart; SGD's update is linear in the gradient, and they agree to every digit.
  local sgd="--optimizer sgd --lr 0.1"
  ((quick)) || train_row gpt-dp2 "$gpt $sgd --strategy dp --world 2" "" 1e-4
  train_row gpt-tp2-sp "$gpt $sgd --strategy ddp --world 4 --tp 2 --sequence-parallel" "" 1e-4
  train_row gpt-bf16-ddp2 "$gpt $sgd --strategy ddp --world 2 --precision bf16" "" 1.6e-2
  ((quick)) || train_row gpt-bf16-fsdp2 "$gpt $sgd --strategy fsdp --world 2 --sharding full --precision bf16" "" 1.6e-2
  ((quick)) || train_row gpt-bf16-pipe-zb-h1 "$gpt $sgd --strategy pipeline --stages 2 --microbatches 4 --schedule zb-h1 --precision bf16" "" 1.6e-2
  ((quick)) || train_row gpt-bf16-tp2-sp "$gpt $sgd --strategy ddp --world 4 --tp 2 --sequence-parallel --precision bf16" "" 1.6e-2
  # Autocast (GptCore::set_amp): float32 parameters, 16-bit matmul outputs, bf16 TP sums.
  train_row gpt-amp-ddp2 "$gpt $sgd --strategy ddp --world 2 --amp bf16" "" 1.6e-2
  ((quick)) || train_row gpt-amp-tp2-sp "$gpt $sgd --strategy ddp --world 4 --tp 2 --sequence-parallel --amp bf16" "" 1.6e-2
  ((quick)) || train_row gpt-mesh-2x2x2 "$gpt $sgd --strategy pipeline --dp 2 --stages 2 --tp 2 --microbatches 4 --schedule 1f1b" "" 1e-4
  # Context parallelism and the experts (ring attention's online softmax, the router and the combine
  # run as host loops over copies of device memory, GptCore::Host; Ulysses and the dispatch on the device).
  train_row gpt-cp2-ring "$gpt $sgd --strategy ddp --world 2 --cp 2" "" 1e-4
  ((quick)) || train_row gpt-cp2-zigzag "$gpt $sgd --strategy ddp --world 2 --cp 2 --cp-layout zigzag" "" 1e-4
  ((quick)) || train_row gpt-cp2-ulysses "$gpt $sgd --strategy ddp --world 2 --cp 2 --cp-layout ulysses" "" 1e-4
  train_row gpt-moe-ep2 "$gpt $sgd --strategy ddp --world 2 --moe experts=4,top_k=2 --ep 2" "" 1e-4
  ((quick)) || train_row gpt-moe-cp2-tp2 "$gpt $sgd --strategy ddp --world 4 --cp 2 --tp 2 --sequence-parallel --moe experts=4,top_k=2" "" 1e-4
}

# bench NAME WANT_SECONDS [bench flags...]
step_bench() {
  local name=$1 want=$2; shift 2
  local log=$logs/$name.log
  : >"$log"
  if [[ ! -x $bin/dtlab-bench-cuda ]]; then record "$name" FAIL "no $(rel "$bin")/dtlab-bench-cuda" 0 "$log"; return; fi
  local lim; lim=$(limit_for "$want")
  if ((lim < want / 2)); then record "$name" "skipped: time budget" "needs ~${want}s, ${lim}s left" 0 "$log"; return; fi
  local t0=$SECONDS
  run_logged "$log" "$lim" "$bin/dtlab-bench-cuda" "$@"
  local rc=$?
  local g c t r bw gtf ttf
  g=$(sed -n 's/^  gpu  *\([0-9.]*\) ms\/step.*/\1/p' "$log" | head -1)
  gtf=$(sed -n 's/^  gpu  .* \([0-9.]*\) TFLOP\/s.*/\1/p' "$log" | head -1)
  ttf=$(sed -n 's/^  pytorch (cuda)  .* \([0-9.]*\) TFLOP\/s.*/\1/p' "$log" | head -1)
  c=$(sed -n 's/^  cpu  *\([0-9.]*\) ms\/step.*/\1/p' "$log" | head -1)
  t=$(sed -n 's/^  pytorch (cuda) *\([0-9.]*\) ms\/step.*/\1/p' "$log" | head -1)
  r=$(sed -n 's/.*ratio dtlab\/torch on the GPU: \([0-9.]*\).*/\1/p' "$log" | head -1)
  # The ring table's per-rank busbw column (bench_cuda.cpp: size, count, time, algbw, busbw/rank, summed, ...).
  bw=$(awk '/^ring all-reduce/ {t = 1} t && $1 ~ /^[0-9]+$/ && NF == 9 {if ($5 + 0 > m) m = $5 + 0} END {if (m) printf "%.1f", m}' "$log")
  # The bench asks /usr/bin/python3 for torch; the GPU image's torch may be another python3's on PATH.
  if [[ -z $t ]] && grep -q 'pytorch (cuda) not measured' "$log" && ((gpu)) && python3 -c 'import torch' 2>/dev/null; then
    local spec=mlp:256,1024,1024,10 batch=256 steps=50 prec=fp32 a
    local args=("$@")
    # --gemm is dtlab-bench-cuda's preset (bench/bench_cuda.cpp); explicit flags after it win there too.
    for a in "${args[@]}"; do
      [[ $a == --gemm ]] && spec=mlp:4096,16384,16384,4096 batch=8192 steps=10
      [[ $a == --gpt ]] && spec=gpt:layers=12,heads=12,embd=768,ctx=1024,vocab=50257 batch=8 steps=10
    done
    for ((a = 0; a + 1 < ${#args[@]}; a++)); do
      case ${args[$a]} in
        --model) spec=${args[$((a + 1))]} ;; --batch) batch=${args[$((a + 1))]} ;; --steps) steps=${args[$((a + 1))]} ;;
        --precision) prec=${args[$((a + 1))]} ;;
      esac
    done
    echo "== PyTorch with the python3 on PATH ($(command -v python3)): bench/torch_step.py $spec $batch $steps 5 1 cuda $prec" >>"$log"
    local j="" tl; tl=$(limit_for 120)
    ((tl > 0)) && j=$(timeout -k 10 "$tl" python3 "$root/bench/torch_step.py" "$spec" "$batch" "$steps" 5 1 cuda "$prec" 2>>"$log")
    echo "$j" >>"$log"
    t=$(sed -n 's/.*"median_ms": *\([0-9.eE+-]*\).*/\1/p' <<<"$j")
    [[ -n $t && -n $g ]] && r=$(awk -v g="$g" -v t="$t" 'BEGIN {printf "%.3f", g / t}')
  fi
  local fig
  if [[ -n $g ]]; then
    fig="gpu $g ms/step${gtf:+ ($gtf TFLOP/s)}, cpu ${c:-not measured} ms${c:+ ($(awk -v g="$g" -v c="$c" 'BEGIN {printf "%.1fx", c / g}'))}, torch ${t:-not measured} ms${ttf:+ ($ttf TFLOP/s)} (dtlab/torch ${r:-?}); ring busbw max ${bw:-?} GB/s"
  else
    fig=$(output_of "$log" | grep -m1 -E 'skipped|error|dtlab-bench-cuda' | cut -c1-140)
  fi
  fig="${*:+$* }$fig"
  if ((!gpu)); then
    record "$name" "$gpu_skip" "$fig" $((SECONDS - t0)) "$log"
  elif ((rc == 0)) && [[ -n $g ]]; then
    record "$name" pass "$fig" $((SECONDS - t0)) "$log"
  else
    record "$name" FAIL "exit $rc; $fig" $((SECONDS - t0)) "$log"
  fi
}

# The fused ring (each step one reduce-copy kernel): dtlab-bench-cuda --ring, 4 ranks sharing the GPU,
# 1 KiB to 1 GiB. Passes when every size's #wrong is 0 and, at 256 MiB, the 4 ranks' busbw summed is
# at least 0.8 x the device copy measured in the same run (a reduce step moves 3 chunk-sizes of memory,
# a copy step 2: 0.8 is memcpy's own efficiency; docs/gpu.md).
step_ring() {
  local log=$logs/ring-fused.log
  : >"$log"
  if [[ ! -x $bin/dtlab-bench-cuda ]]; then record ring-fused FAIL "no $(rel "$bin")/dtlab-bench-cuda" 0 "$log"; return; fi
  local t0=$SECONDS
  run_logged "$log" "$(limit_for 120)" "$bin/dtlab-bench-cuda" --ring --world 4
  local rc=$?
  local line ratio
  line=$(grep -m1 '^fused ring at 256 MiB' "$log" | cut -c1-150)
  ratio=$(sed -n 's/^fused ring at 256 MiB: .* = \([0-9.]*\) x the device copy.*/\1/p' "$log" | head -1)
  if ((!gpu)); then
    record ring-fused "$gpu_skip" "$(output_of "$log" | grep -m1 -E 'skipped' | cut -c1-120)" $((SECONDS - t0)) "$log"
  elif ((rc == 0)) && [[ -n $ratio ]] && awk -v r="$ratio" 'BEGIN {exit !(r >= 0.8)}'; then
    record ring-fused pass "$line" $((SECONDS - t0)) "$log"
  else
    record ring-fused FAIL "exit $rc; ${line:-no 256 MiB line}; wants >= 0.8" $((SECONDS - t0)) "$log"
  fi
}

# The roofline on the GPU: dtlab-cli train --device cuda prints the roof it divides by (the peak table's
# row for this GPU, docs/course_sources.md §6j) and each step's MFU, from GPU-timed spans.
step_mfu() {
  local log=$logs/mfu.log
  : >"$log"
  local t0=$SECONDS
  run_logged "$log" "$(limit_for 60)" "$bin/dtlab-cli" train --device cuda --strategy ddp --world 4 --model mlp:256,1024,1024,10 \
    --data spiral --batch 256 --steps 20 --log-every 10
  local rc=$?
  local head mfu
  head=$(grep -m1 '^  MFU' "$log" | cut -c1-150)
  mfu=$(grep -m1 -o 'MFU [0-9.]*%' <(grep '^step 20/20' "$log"))
  if ((!gpu)); then
    record mfu "$gpu_skip" "" $((SECONDS - t0)) "$log"
  elif ((rc == 0)) && [[ $head == *"FLOP/s ("* && -n $mfu ]]; then
    record mfu pass "step 20: $mfu;${head#  MFU:}" $((SECONDS - t0)) "$log"
  else
    record mfu FAIL "exit $rc; ${head:-no MFU header} ${mfu:-no MFU on step 20}" $((SECONDS - t0)) "$log"
  fi
}

# The run's table into docs/gpu.md, between its two gpu_check markers, with the date and the GPU's name:
# the page always shows what the last GPU session measured (only a run on a GPU writes it).
write_gpu_doc() {
  local doc=$root/docs/gpu.md f=$logs/summary.md
  ((gpu)) && [[ -f $doc && -f $f ]] || return 0
  local name; name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  python3 - "$doc" "$f" "${name:-unknown GPU}" "$(date -u '+%Y-%m-%d')" <<'PYEOF' || echo "$me: could not write docs/gpu.md's table" >&2
import sys
doc, summary, gpu, day = sys.argv[1:5]
begin, end = "<!-- gpu_check:begin -->", "<!-- gpu_check:end -->"
lines = open(summary).read().splitlines()
table = [l for l in lines if l.startswith("|")]
tail = [l for l in lines if " passed, " in l]
block = [begin, "", f"**Last `tools/gpu_check.sh` run: {day} on {gpu}** (written by the script).", ""] + table + [""] + tail + ["", end]
text = open(doc).read()
if begin in text and end in text:
    text = text[:text.index(begin)] + "\n".join(block) + text[text.index(end) + len(end):]
else:
    text = text.rstrip("\n") + "\n\n## The last gpu_check run\n\n" + "\n".join(block) + "\n"
open(doc, "w").write(text)
PYEOF
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then cp "$doc" "$OUT/gpu.md"; fi  # the device tool brings back $OUT only
  echo "wrote the table to $(rel "$doc") (${name:-unknown GPU}, $(date -u '+%Y-%m-%d'))"
}

# Xvfb from the prefix. Its GLX needs Mesa's swrast_dri.so (LIBGL_DRIVERS_PATH: the prefix's, else the
# machine's), its keyboard needs xkbcomp: the server runs /usr/bin/xkbcomp, a path compiled in, so where
# that is missing a copy of the server with that string emptied runs the xkbcomp on PATH (the prefix's).
xvfb_pid="" xvfb_display="" dri_dir=""
start_xvfb() {  # start_xvfb LOG; sets xvfb_display; returns 1 with the reason in $why
  local log=$1 xvfb=$prefix/usr/bin/Xvfb d
  why=""
  [[ -x $xvfb ]] || { why="no Xvfb in the prefix"; return 1; }
  dri_dir=""
  for d in "$libdir/dri" /usr/lib/x86_64-linux-gnu/dri /usr/lib64/dri /usr/lib/dri; do
    [[ -e $d/swrast_dri.so ]] && { dri_dir=$d; break; }
  done
  [[ -n $dri_dir ]] || { why="no software GL for Xvfb's GLX (Mesa's swrast_dri.so: not in .deps, 47 MiB with libLLVM; fetch it with --fetch-deps --with-mesa and carry .deps-gl)"; return 1; }
  if [[ ! -x /usr/bin/xkbcomp ]]; then
    local patched=$prefix/usr/bin/Xvfb.gpu_check
    if [[ ! -x $patched ]]; then
      python3 - "$xvfb" "$patched" <<'EOF' >>"$log" 2>&1 || { why="could not make an Xvfb that finds xkbcomp on PATH (see log)"; return 1; }
import sys
data = bytearray(open(sys.argv[1], "rb").read())
needle = b"\0/usr/bin\0"   # XKB_BIN_DIRECTORY, the one "/usr/bin" string in Xvfb
if data.count(needle) != 1:
    sys.exit("expected one XKB_BIN_DIRECTORY string in Xvfb, found %d" % data.count(needle))
data[data.find(needle) + 1] = 0   # "" : the server then runs "xkbcomp" through the shell's PATH
open(sys.argv[2], "wb").write(data)
EOF
      chmod +x "$patched"
      echo "made $patched: /usr/bin/xkbcomp is missing, this copy runs the xkbcomp on PATH" >>"$log"
    fi
    xvfb=$patched
  fi
  local fdfile; fdfile=$(mktemp)
  echo "\$ Xvfb (LIBGL_DRIVERS_PATH=$dri_dir) -displayfd 9 -screen 0 1600x900x24 -nolisten tcp -xkbdir $prefix/usr/share/X11/xkb" >>"$log"
  env LD_LIBRARY_PATH="$prefix_ld_path" LIBGL_DRIVERS_PATH="$dri_dir" PATH="$prefix/usr/bin:$PATH" \
    "$xvfb" -displayfd 9 -screen 0 1600x900x24 -nolisten tcp -xkbdir "$prefix/usr/share/X11/xkb" \
    9>"$fdfile" >>"$log" 2>&1 &
  xvfb_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $fdfile ]] && break
    kill -0 "$xvfb_pid" 2>/dev/null || break
    sleep 0.1
  done
  xvfb_display=$(tr -dc '0-9' <"$fdfile")
  rm -f "$fdfile"
  if [[ -z $xvfb_display ]]; then
    why="Xvfb did not start: $(grep -m1 -E 'EE|error|Fatal' "$log" | cut -c1-100)"
    kill "$xvfb_pid" 2>/dev/null; xvfb_pid=""
    return 1
  fi
  echo "Xvfb ready on :$xvfb_display (pid $xvfb_pid)" >>"$log"
}

stop_xvfb() { [[ -n $xvfb_pid ]] && kill "$xvfb_pid" 2>/dev/null && wait "$xvfb_pid" 2>/dev/null; xvfb_pid=""; }

step_screens() {
  local log=$logs/screens.log
  : >"$log"
  if ((skip_screens)); then record screens off "--skip-screens" 0 "$log"; return; fi
  if [[ ! -x $bin/dtlab ]]; then record screens FAIL "no $(rel "$bin")/dtlab (GUI not built: see configure.log)" 0 "$log"; return; fi
  local t0=$SECONDS
  if ! start_xvfb "$log"; then
    record screens "skipped: $why" "" $((SECONDS - t0)) "$log"
    return
  fi
  local shots=$logs/screens device=cuda
  ((gpu)) || device=cpu
  mkdir -p "$shots"
  rm -f "$shots"/*.png
  local cfg; cfg=$(mktemp -d)
  local script="step collective 2; step ring 2; screenshot $shots/lab_${device}_ddp4.png"
  ((quick)) || script+="; view memory; screenshot $shots/memory_${device}_ddp4.png; view timeline; screenshot $shots/timeline_${device}_ddp4.png"
  ((quick)) || script+="; step iteration 1; view roofline; screenshot $shots/roofline_${device}_ddp4.png; colour peak; view timeline; screenshot $shots/timeline_peak_${device}_ddp4.png"
  script+="; quit"
  local vendor ok=0 lim
  for vendor in mesa nvidia; do
    [[ $vendor == nvidia ]] && ((!gpu)) && continue
    lim=$(limit_for 90)
    ((lim == 0)) && break
    echo "== __GLX_VENDOR_LIBRARY_NAME=$vendor" >>"$log"
    if run_logged "$log" "$lim" env DISPLAY=":$xvfb_display" __GLX_VENDOR_LIBRARY_NAME=$vendor LIBGL_DRIVERS_PATH="$dri_dir" \
        LD_LIBRARY_PATH="$prefix_ld_path" "$bin/dtlab" --device "$device" --strategy ddp --world 4 \
        --width 1600 --height 900 --config-dir "$cfg" --run "$script"; then
      ok=1; break
    fi
  done
  rm -rf "$cfg"
  stop_xvfb
  local n=0 small=0 f
  for f in "$shots"/*.png; do
    [[ -e $f ]] || continue
    n=$((n + 1))
    (($(stat -c %s "$f") < 20000)) && small=$((small + 1))
  done
  local fig
  fig="$n PNG in $(rel "$shots") (--device $device, GL $vendor${dri_dir:+, swrast from $dri_dir})"
  ((small)) && fig+="; $small under 20 kB (blank?)"
  if ((!gpu)); then
    record screens "$gpu_skip" "lab machinery with --device cpu: $( ((ok && n > 0 && small == 0)) && echo ok || echo failed); $fig" $((SECONDS - t0)) "$log"
  elif ((ok && n > 0 && small == 0)); then
    record screens pass "$fig" $((SECONDS - t0)) "$log"
  else
    record screens FAIL "$fig" $((SECONDS - t0)) "$log"
  fi
}

finish() {
  stop_xvfb
  local f; f=$(write_summary)
  [[ $mode == run ]] && write_gpu_doc
  echo
  echo "== summary ($(rel "$f"))"
  sed -n '5,$p' "$f"
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    local png n=0
    for png in "$logs"/screens/*.png; do
      [[ -e $png ]] || continue
      ((n < 5)) && cp "$png" "$OUT/" && n=$((n + 1))
    done
    tar -czf "$OUT/gpu_check_logs.tgz" --exclude='*.png' -C "$build" gpu_check 2>/dev/null
    echo "copied summary.md, gpu_check_logs.tgz and $n screenshot(s) to \$OUT"
  fi
  local i
  for i in "${!S_RESULT[@]}"; do
    [[ ${S_RESULT[$i]} == pass || ${S_RESULT[$i]} == off ]] || exit 1
  done
  exit 0
}
trap 'stop_xvfb' EXIT

# ---------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------
if [[ $mode == verify ]]; then
  verify_prefix
  finish
fi

echo "== $me: $machine_line; build dir $(rel "$build"); logs in $(rel "$logs"); budget ${budget}s"
rm -f "$logs"/*.log "$logs"/screens/*.png
unpack_deps || finish
configure || finish
build_all || { verify_prefix; finish; }
verify_prefix
if [[ $mode == build ]]; then finish; fi
wanted() { [[ -z $only || ",$only," == *",$1,"* ]]; }
wanted gpu-info && step_gpu_info
wanted tests && step_tests
wanted train && step_train
wanted bench && step_bench bench 150
wanted ring && step_ring
wanted mfu && step_mfu
# The bench model in bf16: dtlab's 16-bit layout (--precision) against torch.autocast(bf16) on the same GPU.
wanted bench-bf16 && step_bench bench-bf16 90 --precision bf16 --world 0
# dtlab-bench-cuda --gpt: GPT-2 small (gpt2-124m) at batch 8 x 1024, fp32, against PyTorch eager.
if wanted bench-gpt; then
  gptb=(--gpt)
  ((quick)) && gptb+=(--steps 4)
  step_bench bench-gpt $((quick ? 120 : 180)) "${gptb[@]}"
fi
wanted screens && step_screens
if wanted bench-gemm; then
  # dtlab-bench-cuda --gemm: mlp:4096,16384,16384,4096 at batch 8192, TFLOP/s beside torch's, no CPU step;
  # a bench without --gemm gets the same model by flags (and times 4 CPU steps of it: minutes).
  gemm=(--gemm)
  ((quick)) && gemm+=(--steps 5)
  [[ -x $bin/dtlab-bench-cuda ]] && ! grep -q -- '--gemm' "$bin/dtlab-bench-cuda" 2>/dev/null &&
    gemm=(--model "mlp:4096,16384,16384,4096" --batch 8192 --steps 3)
  step_bench bench-gemm $((quick ? 150 : 240)) "${gemm[@]}"
fi
finish
