#!/usr/bin/env bash
# Fuzzes every parser (issue 22): builds the libFuzzer harnesses (fuzz/*.cpp) with clang, ASan and
# UBSan, then runs each for a bounded time on a copy of its committed corpus (fuzz/corpus/NAME), so
# the repository is never modified. Any crash, leak, timeout, out-of-memory or UBSan report fails
# the run (exit 1) and names the reproducer; add it to fuzz/corpus/NAME once the parser is fixed.
#
#   bash tools/fuzz.sh [--build-only | --run-only] [NAME...]     (default: every harness)
#
# Environment: DTLAB_FUZZ_BUILD   build directory (default build-asan; configured here if needed)
#              DTLAB_FUZZ_SECONDS seconds per harness (default 20)
#              DTLAB_FUZZ_JOBS    harnesses run side by side (default 1; each is one process on one core)
# Reproduce a finding: BUILD/bin/dtlab-fuzz-NAME PATH (with the ASAN_OPTIONS/UBSAN_OPTIONS below).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTLAB_FUZZ_BUILD:-build-asan}
[[ $build = /* ]] || build=$root/$build
seconds=${DTLAB_FUZZ_SECONDS:-20}
fuzz_jobs=${DTLAB_FUZZ_JOBS:-1}
mode=all
names=()
for arg in "$@"; do
  case $arg in
    --build-only) mode=build ;;
    --run-only) mode=run ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $arg; use --build-only, --run-only or harness names" >&2; exit 2 ;;
    *) names+=("$arg") ;;
  esac
done
if [[ ! $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: DTLAB_FUZZ_SECONDS must be a whole number of seconds, not '$seconds'" >&2
  exit 2
fi
if [[ ! $fuzz_jobs =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: DTLAB_FUZZ_JOBS must be a whole number of harnesses to run at once, not '$fuzz_jobs'" >&2
  exit 2
fi
if ((${#names[@]} == 0)); then
  for src in "$root"/fuzz/*.cpp; do names+=("$(basename "$src" .cpp)"); done
fi

# The longest input each harness tries: room for its largest seed and the parser's own limits
# (a figure's 2000 characters, a lesson of a few KB), small enough to stay fast.
max_len_of() {
  case $1 in
    specs) echo 256 ;;
    figure) echo 2100 ;;
    script|schedule) echo 4096 ;;
    safetensors|checkpoint|sharded) echo 8192 ;;
    npz|lesson|monitor) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

# Flags of one harness: the monitor's decoders may allocate no more than their input justifies
# (a frame header claiming a gigabyte must not get one).
extra_flags_of() {
  case $1 in
    monitor) echo -malloc_limit_mb=128 ;;
  esac
}

# ---- build ----
if [[ $mode != run ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DDTLAB_SANITIZE=address -DDTLAB_CUDA=OFF -DDTLAB_FUZZ=ON
  else
    cmake -S "$root" -B "$build" -DDTLAB_FUZZ=ON >/dev/null  # an existing build directory gains the harnesses
  fi
  # dtlab-fuzz-NAME exists only when CMake could build it (the app's harnesses need its packages).
  available=$(cmake --build "$build" --target help)
  targets=()
  for n in "${names[@]}"; do
    if grep -qE "(^|[. ])dtlab-fuzz-$n(:| |\$)" <<<"$available"; then targets+=("dtlab-fuzz-$n"); fi
  done
  ((${#targets[@]})) || { echo "fuzz.sh: no harness to build in $build" >&2; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
fi
[[ $mode = build ]] && exit 0

# ---- run ----
# Every sanitizer report is fatal and comes with a stack; leaks are findings too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:symbolize=1:print_stacktrace=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:report_error_type=1}
out=$build/fuzz-runs
mkdir -p "$out"

count_files() { find "$1" -type f | wc -l; }
count_bytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
stat_of() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

failed=()
skipped=()
total_execs=0
start_all=$(date +%s)

# One harness on a copy of its corpus; its row of the table goes to $out/NAME/row, "failed" to
# $out/NAME/failed, its execution count to $out/NAME/execs.
fuzz_one() {
  local n=$1 bin=$build/bin/dtlab-fuzz-$1 run=$out/$1
  rm -rf "$run"
  mkdir -p "$run/corpus"
  cp -r "$root/fuzz/corpus/$n/." "$run/corpus/" 2>/dev/null || true
  local before after dict=() t0 rc=0 secs execs artifact result
  before="$(count_files "$run/corpus") files/$(count_bytes "$run/corpus") B"
  [[ -f $root/fuzz/dict/$n.dict ]] && dict=(-dict="$root/fuzz/dict/$n.dict")
  t0=$(date +%s)
  (cd "$run" && "$bin" "$run/corpus" -max_total_time="$seconds" -max_len="$(max_len_of "$n")" -timeout=10 \
      -rss_limit_mb=2048 $(extra_flags_of "$n") -artifact_prefix="$run/" -print_final_stats=1 "${dict[@]}" \
      </dev/null >"$run/log" 2>&1) || rc=$?
  secs=$(($(date +%s) - t0))
  execs=$(stat_of number_of_executed_units "$run/log")
  echo "${execs:-0}" >"$run/execs"
  after="$(count_files "$run/corpus") files/$(count_bytes "$run/corpus") B"
  artifact=$(find "$run" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | head -1)
  if ((rc != 0)) || [[ -n $artifact ]]; then
    touch "$run/failed"
    result="FAILED (exit $rc)${artifact:+: reproducer $artifact}; log $run/log"
  else
    result=ok
  fi
  printf '%-12s %10s %6s %18s %18s  %s\n' "$n" "${execs:-?}" "$secs" "$before" "$after" "$result" >"$run/row"
  if ((rc != 0)); then
    grep -m1 -E 'ERROR: |runtime error|invariant broken|uncaught|Test unit written' "$run/log" | sed 's/^/    /' >>"$run/row" || true
  fi
}

printf '%-12s %10s %6s %18s %18s  %s\n' harness execs secs "corpus before" "corpus after" result
runnable=()
for n in "${names[@]}"; do
  if [[ -x $build/bin/dtlab-fuzz-$n ]]; then runnable+=("$n"); else skipped+=("$n"); fi
done
# Up to $fuzz_jobs harnesses at once; rows are printed in the harnesses' order once all have run.
running=0
for n in "${runnable[@]}"; do
  if ((running >= fuzz_jobs)); then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$n" &
  running=$((running + 1))
done
wait || true
for n in "${names[@]}"; do
  if [[ ! -x $build/bin/dtlab-fuzz-$n ]]; then
    printf '%-12s %10s %6s %18s %18s  %s\n' "$n" - - - - "skipped (not built: $build/bin/dtlab-fuzz-$n)"
    continue
  fi
  cat "$out/$n/row" 2>/dev/null || { echo "$n: the harness's run left no result in $out/$n"; failed+=("$n"); continue; }
  [[ -f $out/$n/failed ]] && failed+=("$n")
  total_execs=$((total_execs + $(cat "$out/$n/execs" 2>/dev/null || echo 0)))
done

ran=$((${#names[@]} - ${#skipped[@]}))
summary="fuzz: $ran harnesses, $(($(date +%s) - start_all)) s, $total_execs executions, ${#failed[@]} failed"
((${#skipped[@]})) && summary+=", skipped: ${skipped[*]}"
if ((${#failed[@]})); then
  echo "$summary: ${failed[*]}"
  exit 1
fi
echo "$summary"
