#!/usr/bin/env bash
# run_main.sh LLMD MODEL PROMPT N - the main job behind `make run`: greedy
# generation with `llmd generate`. MODEL defaults to the stories260K GGUF in
# ../shared/models when it is there, else a built-in dummy model.
set -euo pipefail
llmd=$1; model=${2:-}; prompt=${3:-Once upon a time}; n=${4:-64}
if [ -z "$model" ]; then
    if [ -f ../shared/models/stories260K-f32.gguf ]; then
        model=../shared/models/stories260K-f32.gguf
    else
        model=dummy:tiny
        echo "llmd: ../shared/models not found; running the built-in dummy model (random weights)" >&2
    fi
fi
extra=()
case "$model" in *stories260K*) extra=(--ctx 512) ;; esac
exec "$llmd" generate -m "$model" -p "$prompt" -n "$n" --temp "${TEMP:-0}" "${extra[@]}"
