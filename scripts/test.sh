#!/usr/bin/env bash
# test.sh - everything CI checks, the same way on a laptop: setup.sh, the
# local services, a Release build (build/) and an ASan+UBSan build
# (build-asan/), both with -Werror, lint (clang-format and banned
# functions), then every CTest suite under both builds. The last line is
# "N passed, N failed" over both builds; the exit status is non-zero on any
# failure. A second run is incremental: setup and services are no-ops and
# the builds only recompile what changed.
#
# Options:
#   --unit     only the unit suites (no services are started)
#   --no-asan  skip the ASan+UBSan build and its test run
#   --stop     stop the services at the end (default: leave them running)
#   --no-cache rerun every suite even when nothing changed (see below)
#   -h|--help  this text
#
# Result cache: when a build's suites all passed and nothing that could
# change their outcome has changed since (every file of the source tree,
# the build's executables, the CODERQ_*/CQ_*/sanitizer environment, the
# identity of the running PostgreSQL and Kafka), that build's results are
# reused and said so. Any change reruns the whole build's suites; CI starts
# from a clean clone and so always runs everything.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

unit_only=0
asan=1
stop=0
use_cache=1
for arg in "$@"; do
        case $arg in
        --unit) unit_only=1 ;;
        --no-asan) asan=0 ;;
        --stop) stop=1 ;;
        --no-cache) use_cache=0 ;;
        -h | --help)
                sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
                exit 0
                ;;
        *)
                echo "usage: $0 [--unit] [--no-asan] [--stop] [--no-cache]" >&2
                exit 2
                ;;
        esac
done

started=$(date +%s)
# Seconds per phase, printed before the summary.
times=()
phase_start=$SECONDS
phase_end() {
        times+=("$1 $((SECONDS - phase_start)) s")
        phase_start=$SECONDS
}
if [ "$stop" -eq 1 ] && [ "$unit_only" -eq 0 ]; then
        trap 'cq_services stop' EXIT
fi

"$CQ_ROOT/scripts/setup.sh"
phase_end setup

if [ "$unit_only" -eq 0 ]; then
        cq_services start
        eval "$("$CQ_ROOT/scripts/services.sh" env)"
fi
phase_end services

builds=("$CQ_ROOT/build:Release")
[ "$asan" -eq 1 ] && builds+=("$CQ_ROOT/build-asan:Asan")
for b in "${builds[@]}"; do
        cq_say "building ${b#*:} in ${b%:*}"
        cq_build "${b%:*}" "${b#*:}"
done
phase_end builds

# Lint: formatting and banned functions, over our own C sources.
lint_failed=0
list_sources() {
        if git -C "$CQ_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
                git -C "$CQ_ROOT" ls-files -co --exclude-standard -- '*.c' '*.h'
        else
                (cd "$CQ_ROOT" && find . \( -path ./build -o -path './build-*' \
                        -o -path ./.cache -o -path ./.run -o -path ./.git \) \
                        -prune -o \( -name '*.c' -o -name '*.h' \) -print)
        fi | while read -r f; do [ -f "$CQ_ROOT/$f" ] && echo "$f"; done
}
mapfile -t sources < <(list_sources)
cq_say "lint: clang-format and banned functions on ${#sources[@]} files"
if ! (cd "$CQ_ROOT" && clang-format --dry-run --Werror "${sources[@]}"); then
        echo "lint: files are not formatted; run clang-format -i on them" >&2
        lint_failed=1
fi
if (cd "$CQ_ROOT" && grep -nE \
        '\b(sprintf|strcpy|strcat|strtok|atoi|gets)[[:space:]]*\(' \
        "${sources[@]}"); then
        echo "lint: banned functions above (use snprintf, memcpy with" \
                "lengths, strtok_r, strtol, fgets)" >&2
        lint_failed=1
fi

phase_end lint

# Tests.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
ctest_args=(-j2 --output-on-failure)
[ "$unit_only" -eq 1 ] && ctest_args+=(-L unit)
# What the outcome of a build's suites depends on (see "Result cache").
services_identity() {
        [ "$unit_only" -eq 1 ] && return 0
        # which cluster (data dir and port), not which process: suites
        # restart the services themselves (outage tests)
        sed -n '2p;4p' "$CQ_RUN_DIR/pg/data/postmaster.pid" 2>/dev/null || true
        grep '^cluster.id' "$CQ_RUN_DIR/kafka/data/meta.properties" 2>/dev/null || true
}
cache_key() {
        local dir=$1
        {
                echo "args: ${ctest_args[*]}"
                (cd "$CQ_ROOT" && list_all_files | xargs -0 -r sha256sum)
                find "$dir" -maxdepth 1 -type f -name coderq -print0 |
                        xargs -0 -r sha256sum
                find "$dir/tests" -maxdepth 1 -type f -name 'check_*' -perm -u+x \
                        -print0 | sort -z | xargs -0 -r sha256sum
                env | grep -E '^(CODERQ_|CQ_|ASAN_|UBSAN_|LSAN_|CK_)' | sort
                services_identity
        } | sha256sum | cut -d' ' -f1
}
list_all_files() {
        if git rev-parse --git-dir >/dev/null 2>&1; then
                git ls-files -co --exclude-standard -z |
                        while IFS= read -r -d '' f; do
                                [ -f "$f" ] && printf '%s\0' "$f"
                        done
        else
                find . \( -path ./build -o -path './build-*' -o -path ./.cache \
                        -o -path ./.run \) -prune -o -type f -print0
        fi
}

passed=0
failed=0
for b in "${builds[@]}"; do
        dir=${b%:*}
        key=$(cache_key "$dir")
        if [ "$use_cache" -eq 1 ] && [ -f "$dir/test-cache" ] &&
                [ "$(head -n 1 "$dir/test-cache")" = "$key" ]; then
                n=$(sed -n 2p "$dir/test-cache")
                cq_say "ctest in $dir (${b#*:}): nothing changed since all" \
                        "$n suites passed at $(sed -n 3p "$dir/test-cache");" \
                        "results reused (--no-cache reruns them)"
                passed=$((passed + n))
                continue
        fi
        rm -f "$dir/test-cache"
        cq_say "ctest in $dir (${b#*:})"
        set +e
        (cd "$dir" && ctest "${ctest_args[@]}") 2>&1 | tee "$dir/ctest.log"
        set -e
        # "100% tests passed, 0 tests failed out of 5"
        line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' \
                "$dir/ctest.log" | tail -n 1 || true)
        if [ -z "$line" ]; then
                echo "ctest in $dir gave no result line" >&2
                failed=$((failed + 1))
                continue
        fi
        f=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
        t=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
        passed=$((passed + t - f))
        failed=$((failed + f))
        if [ "$f" -eq 0 ]; then
                printf '%s\n%s\n%s\n' "$key" "$t" \
                        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$dir/test-cache"
        fi
done

phase_end tests
[ "$lint_failed" -eq 0 ] || echo "lint: FAILED (see above)"
echo "test.sh: $(($(date +%s) - started)) s ($(IFS=,; echo "${times[*]}" | sed 's/,/, /g'))"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$lint_failed" -eq 0 ]
