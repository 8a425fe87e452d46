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
# stories260K's GGUF says context_length 128 (a converter default; the model
# was trained with 512): raise it only when the run needs it, so that the
# default `make run` does not open with generate's warning about a --ctx
# the user never typed
extra=()
case "$model" in *stories260K*) if [ "$n" -gt 100 ]; then extra=(--ctx 512); fi ;; esac
exec "$llmd" generate -m "$model" -p "$prompt" -n "$n" --temp "${TEMP:-0}" "${extra[@]}"
