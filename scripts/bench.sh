#!/usr/bin/env bash
# bench.sh NAME [args] - run one benchmark side by side with its anchor and
# print its figures; the last line is one JSON object with the ratios.
# Each benchmark is scripts/bench/NAME.sh; it gets CQ_BUILD (a Release
# build of coderq and the bench/ programs) in its environment.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

name=${1:-}
if [ -z "$name" ] || [ ! -f "$CQ_ROOT/scripts/bench/$name.sh" ]; then
        echo "usage: $0 NAME   (one of:" \
                "$(cd "$CQ_ROOT/scripts/bench" && ls ./*.sh 2>/dev/null | sed 's|^\./||; s|\.sh$||' | tr '\n' ' '))" >&2
        exit 2
fi
shift
export CQ_BUILD=${CQ_BUILD:-$CQ_ROOT/build}
cmake -S "$CQ_ROOT" -B "$CQ_BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$CQ_BUILD" -j"$(nproc)" >/dev/null
exec bash "$CQ_ROOT/scripts/bench/$name.sh" "$@"
