#!/usr/bin/env bash
# Plays one lesson headless under Xvfb, as CTest's lesson_<name> tests do: every action must
# succeed, every revealed answer must equal the engine's live figure, and no answer may be on screen
# before its check (dtlab --lesson --play --check-spoilers).
#   tools/play_lesson.sh build/bin/dtlab lessons/03_why_allreduce.md
# Exit 77 (CTest: skipped) when xvfb-run is not installed (apt-get install xvfb xauth).
set -euo pipefail
app=$1 lesson=$2
if ! command -v xvfb-run >/dev/null; then
  echo "skipped: xvfb-run is not installed (apt-get install xvfb xauth)"
  exit 77
fi
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
xvfb-run -a -s "-screen 0 1280x720x24 -noreset" "$app" --width 1280 --height 720 --config-dir "$cfg" --lesson "$lesson" --play --check-spoilers
