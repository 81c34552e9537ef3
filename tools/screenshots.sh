#!/usr/bin/env bash
# Regenerates the pictures in assets/ (README's and docs/'s) from scripted runs of the lab under Xvfb, so every
# picture shows a real run at a known state. Needs a built build/bin/dtlab and xvfb-run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
app=${DTLAB_APP:-$root/build/bin/dtlab}
out=$root/assets
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
shot() {  # shot ARGS... ; the last argument is the script
  local script=${*: -1}
  xvfb-run -a -s "-screen 0 1600x900x24 -noreset" "$app" --width 1600 --height 900 --config-dir "$cfg" "${@:1:$#-1}" --run "$script"
}
mkdir -p "$out"
# Mid reduce-scatter of bucket 0's all-reduce (collective #2), 4 ranks.
shot --world 4 "step collective 2; step ring 2; screenshot $out/lab.png; view ring; screenshot $out/ring.png; view inspector; screenshot $out/inspector.png; quit"
# Iteration 1 (rebuilt buckets): bucket 0 reduced under backward, bucket 1 on the wire, 2 queued.
shot --world 4 "step iteration 2; step collective 3; view buckets; screenshot $out/buckets.png; view timeline; screenshot $out/timeline.png; view memory; screenshot $out/memory.png; quit"
# Data after a few epochs, and the lab in presentation mode at 8 ranks.
shot --world 4 --batch 256 "step iteration 30; view data; screenshot $out/data.png; quit"
shot --world 8 --presentation "step collective 2; step ring 3; view ring; screenshot $out/presentation.png; quit"
# FSDP FULL_SHARD on 4 ranks: the shard map one step into unit 2's gradient reduce-scatter
# (collective #6), and the memory view comparing strategies for this model and at 7.5B.
shot --strategy fsdp --world 4 "step collective 6; step ring 1; view shards; screenshot $out/fsdp_shards.png; view memory; screenshot $out/fsdp_memory.png; quit"
# Lessons: a question, then the same step after the learner checked and the engine revealed.
shot --lesson why_allreduce "lesson goto 4; screenshot $out/lesson_allreduce_question.png; lesson answer 4; lesson check; screenshot $out/lesson_allreduce_revealed.png; quit"
shot --lesson pitfall_hangs "lesson goto 2; screenshot $out/lesson_hang_question.png; lesson answer 1; lesson check; screenshot $out/lesson_hang_revealed.png; quit"
shot --lesson fsdp_zero "lesson goto 5; screenshot $out/lesson_fsdp_question.png; lesson answer 2; lesson check; screenshot $out/lesson_fsdp_revealed.png; quit"
# An imported 4-rank DDP trace (recorded with torch's profiler over gloo): the timeline with the
# second iteration's last bucket selected, and the per-rank breakdown.
shot --open "$root/tests/data/traces/gloo_ddp_w4" "wait trace; select collective 3; screenshot $out/trace_lab.png; view timeline; screenshot $out/trace_timeline.png; view breakdown; screenshot $out/trace_breakdown.png; quit"
# A/B comparisons: a 1 MiB bucket cap pinned as A against 25 MiB (the wide model, this machine's
# clock), and the ring against the double binary tree on ib2x4 (2 nodes of 4 ranks).
ab="--model mlp:2,1024,1024,1024,3"
shot --world 4 $ab --bucket-cap-mb 1 "step iteration 4; pin; compare --bucket-cap-mb 25; step iteration 4; screenshot $out/ab_buckets.png; quit"
shot --world 8 $ab --profile ib2x4 --algo ring "step iteration 4; pin; compare --algo dbtree; step iteration 4; screenshot $out/ab_algorithms.png; quit"
# Pipelines, p = 4, m = 8, every action 1 ms and free links (the schedules' shapes, not this
# machine's speeds): GPipe as it ran over 1F1B simulated with the same costs (one bubble, 8 against
# 4-3-2-1 micro-batches in flight), the reverse, then 1F1B stepped to time step 8 and its memory.
pipe="--strategy pipeline --stages 4 --microbatches 8 --unit-costs --profile ideal"
shot $pipe --schedule gpipe --compare 1f1b "step iteration 2; view pipeline; screenshot $out/pipeline_gpipe.png; quit"
shot $pipe --schedule 1f1b --compare gpipe "step iteration 2; view pipeline; screenshot $out/pipeline_1f1b.png; step action 9; screenshot $out/pipeline_stepping.png; view memory; screenshot $out/pipeline_memory.png; quit"
# A launched world of 4 processes (dtlab-cli launch ... --monitor), attached and stepped into the
# reduce-scatter of bucket 0's all-reduce, as the first picture shows the in-process world.
cli=${DTLAB_CLI:-$root/build/bin/dtlab-cli}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 120 "$cli" launch --nproc-per-node 4 -- train --strategy ddp --model mlp:2,32,32,3 --steps 20 --batch 16 \
  --monitor "$port" >/dev/null &
shot --attach "127.0.0.1:$port" "step collective 2; step ring 2; screenshot $out/attached.png; quit"
wait
echo "pictures in $out"
