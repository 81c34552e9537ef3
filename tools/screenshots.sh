#!/usr/bin/env bash
# Regenerates the README's pictures in assets/ from scripted runs of the lab under Xvfb, so every
# picture shows a real run at a known state. Needs a built build/bin/dtlab and xvfb-run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
app=${DTLAB_APP:-$root/build/bin/dtlab}
out=$root/assets
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
shot() {  # shot ARGS... ; the last argument is the script
  local script=${*: -1}
  xvfb-run -a -s "-screen 0 1600x900x24" "$app" --width 1600 --height 900 --config-dir "$cfg" "${@:1:$#-1}" --run "$script"
}
mkdir -p "$out"
# Mid reduce-scatter of bucket 0's all-reduce (collective #2), 4 ranks.
shot --world 4 "step collective 2; step ring 2; screenshot $out/lab.png; view ring; screenshot $out/ring.png; view inspector; screenshot $out/inspector.png; quit"
# Iteration 1 (rebuilt buckets): bucket 0 reduced under backward, bucket 1 on the wire, 2 queued.
shot --world 4 "step iteration 2; step collective 3; view buckets; screenshot $out/buckets.png; view timeline; screenshot $out/timeline.png; view memory; screenshot $out/memory.png; quit"
# Data after a few epochs, and the lab in presentation mode at 8 ranks.
shot --world 4 --batch 256 "step iteration 30; view data; screenshot $out/data.png; quit"
shot --world 8 --presentation "step collective 2; step ring 3; view ring; screenshot $out/presentation.png; quit"
echo "pictures in $out"
