#!/usr/bin/env bash
# test.sh - everything CI checks, the same way on a laptop: setup.sh, the
# local services, a Release build (build/), an ASan+UBSan build
# (build-asan/), a ThreadSanitizer build (build-tsan/) and a libFuzzer
# build (build-fuzz/, clang), all with -Werror, lint (clang-format, banned
# functions, the room map of scripts/rooms.sh), then every CTest entry
# once, under ASan+UBSan; the entries labelled "tsan" (the suites that run
# threads, tests/CMakeLists.txt) under TSan; and each fuzz target for
# CQ_FUZZ_SECONDS (default 10), two at a time, over its seed corpus. The
# Release build is built, warned and linted, but its suites run only with
# --release-tests: the sanitizer builds run the same code through the
# same suites, and the README's first command runs the Release binary end
# to end. CTest runs CQ_TEST_JOBS entries at a time (default 3: most wait
# on kernels, brokers and sockets more than on a core); entries that stop
# or restart the shared services run beside no other integration entry
# (the services locks of tests/CMakeLists.txt). The last line is
# "N passed, N failed" (", N skipped" when an entry skipped) over all of
# it; the exit status is non-zero on any failure. A second run is
# incremental: setup and services are no-ops and the builds only
# recompile what changed.
#
# Skips: a suite that cannot run a test here (node and npm absent,
# bubblewrap not working, no chromium, no prometheus, no oracles venv or
# no E2B SDK in it, no helm, not root) exits 77 and CTest shows it as
# skipped. This script first finds out what the machine has
# and exports it as CQ_REQUIRE (e.g. "node,bwrap,chromium,prometheus,root"; a
# CQ_REQUIRE already set is kept, "all" forbids every skip): a suite that
# would skip for a prerequisite named there fails instead, so a skip is
# only ever for something truly absent. Skips go through
# tests/check_support.h (CQ_CHECK_SKIP, cq_check_skip_suite); lint fails
# on a "SKIP " printed any other way.
#
# Options:
#   --unit     only the unit suites (no services are started)
#   --no-asan  skip the ASan+UBSan build and its test run
#   --no-tsan  skip the ThreadSanitizer build and its test run
#   --no-fuzz  skip the fuzz build and the fuzzing
#   --release-tests  run every suite under the Release build too
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
tsan=1
fuzz=1
stop=0
use_cache=1
release_tests=0
for arg in "$@"; do
        case $arg in
        --unit) unit_only=1 ;;
        --no-asan) asan=0 ;;
        --no-tsan) tsan=0 ;;
        --no-fuzz) fuzz=0 ;;
        --stop) stop=1 ;;
        --no-cache) use_cache=0 ;;
        --release-tests) release_tests=1 ;;
        -h | --help)
                sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
                exit 0
                ;;
        *)
                echo "usage: $0 [--unit] [--no-asan] [--no-tsan] [--no-fuzz]" \
                        "[--stop] [--no-cache] [--release-tests]" >&2
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

# What this machine can run (see "Skips" above).
bwrap_works() {
        command -v bwrap >/dev/null 2>&1 &&
                bwrap --unshare-all --die-with-parent --new-session \
                        --ro-bind /usr /usr --symlink usr/lib /lib \
                        --symlink usr/lib64 /lib64 --symlink usr/bin /bin \
                        --symlink usr/sbin /sbin --ro-bind /etc /etc \
                        --proc /proc --dev /dev --tmpfs /tmp \
                        /usr/bin/python3 -c pass >/dev/null 2>&1
}
if [ -z "${CQ_REQUIRE+set}" ]; then
        have=()
        command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
                have+=(node)
        bwrap_works && have+=(bwrap)
        command -v chromium >/dev/null 2>&1 && have+=(chromium)
        # promtool and the server: check_it_worker's metrics case
        [ -x /usr/bin/promtool ] && [ -x /usr/bin/prometheus ] &&
                have+=(prometheus)
        # the tests' oracles from PyPI (setup.sh's venv)
        [ -x "$CQ_CACHE_DIR/venv/bin/python" ] && have+=(oracles)
        # the official E2B Python SDK in that venv (check_e2b_sdk)
        "$CQ_CACHE_DIR/venv/bin/python" -c 'import e2b_code_interpreter' \
                >/dev/null 2>&1 && have+=(e2b-sdk)
        # helm, built by setup.sh: check_deploy's chart checks
        [ -x "$CQ_CACHE_DIR/go/bin/helm" ] && have+=(helm)
        # root: tests that switch kernel uids (a uid per kernel)
        [ "$(id -u)" -eq 0 ] && have+=(root)
        CQ_REQUIRE=$(IFS=,; echo "${have[*]}")
fi
export CQ_REQUIRE
export CQ_ORACLE_PYTHON=${CQ_ORACLE_PYTHON:-$CQ_CACHE_DIR/venv/bin/python}
cq_say "prerequisites this machine has (no suite may skip for them):" \
        "${CQ_REQUIRE:-none}"

builds=("$CQ_ROOT/build:Release")
[ "$asan" -eq 1 ] && builds+=("$CQ_ROOT/build-asan:Asan")
[ "$tsan" -eq 1 ] && builds+=("$CQ_ROOT/build-tsan:Tsan")
for b in "${builds[@]}"; do
        cq_say "building ${b#*:} in ${b%:*}"
        cq_build "${b%:*}" "${b#*:}"
        phase_end "build ${b#*:}"
done
if [ "$fuzz" -eq 1 ]; then
        cq_say "building the fuzz targets in $CQ_ROOT/build-fuzz"
        cq_build "$CQ_ROOT/build-fuzz" Fuzz cq_fuzz
        phase_end "build Fuzz"
fi

# Lint: formatting, banned functions and the room map, over our own C
# sources; pyflakes and node --check over our Python and JavaScript.
lint_failed=0
# Our files whose names match the patterns given ('*.c' '*.h').
list_sources() {
        local names=() p
        for p in "$@"; do
                names+=(${names[0]+-o} -name "$p")
        done
        if git -C "$CQ_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
                git -C "$CQ_ROOT" ls-files -co --exclude-standard -- "$@"
        else
                (cd "$CQ_ROOT" && find . \( -path ./build -o -path './build-*' \
                        -o -path ./.cache -o -path ./.run -o -path ./.git \) \
                        -prune -o \( "${names[@]}" \) -print)
        fi | while read -r f; do [ -f "$CQ_ROOT/$f" ] && echo "$f"; done
}
mapfile -t sources < <(list_sources '*.c' '*.h')
cq_say "lint: clang-format, banned functions and rooms on ${#sources[@]} files"
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
# The room map (cmake/rooms.txt, docs/internals/ARCHITECTURE.md): no source
# includes a header of a room it may not call, each .c its own header first.
if ! "$CQ_ROOT/scripts/rooms.sh"; then
        echo "lint: the includes above break the room map (cmake/rooms.txt;" \
                "see docs/internals/ARCHITECTURE.md#rooms)" >&2
        lint_failed=1
fi
# A skip printed by hand shows as passed and CQ_REQUIRE cannot catch it.
if (cd "$CQ_ROOT" && grep -n '"SKIP ' tests/*.c | grep -v '^tests/check_support\.c:'); then
        echo "lint: skips above bypass CQ_CHECK_SKIP (tests/check_support.h)" >&2
        lint_failed=1
fi
# The Python (the kernel server, the test harness, the environment
# probe, fakes, bench, examples) and the report's JavaScript. pyflakes
# cannot be told a finding is meant: one on a line marked "# noqa" (the
# mark flake8 reads) is.
mapfile -t py_sources < <(list_sources '*.py')
mapfile -t js_sources < <(list_sources '*.js')
cq_say "lint: pyflakes on ${#py_sources[@]} Python files," \
        "node --check on ${#js_sources[@]} JavaScript files"
py_findings() {
        local line f n text
        { /usr/bin/python3 -m pyflakes "$@" 2>&1 || true; } |
                while IFS= read -r line; do
                        f=${line%%:*}
                        n=${line#*:}
                        n=${n%%:*}
                        if [[ $n =~ ^[0-9]+$ ]] && [ -f "$f" ]; then
                                text=$(sed -n "${n}p" "$f")
                                [[ $text == *'# noqa'* ]] && continue
                        fi
                        echo "$line"
                done
}
if [ ${#py_sources[@]} -gt 0 ] &&
        (cd "$CQ_ROOT" && py_findings "${py_sources[@]}" | grep .); then
        echo "lint: pyflakes found the above in Python files" >&2
        lint_failed=1
fi
for f in "${js_sources[@]}"; do
        if ! node --check "$CQ_ROOT/$f"; then
                echo "lint: $f is not valid JavaScript (node --check)" >&2
                lint_failed=1
        fi
done

phase_end lint

# Tests.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# Only the Tsan build's executables see these. The suppressions cover
# third-party libraries only (each justified in the file).
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$CQ_ROOT/tests/tsan/suppressions.txt}
ctest_args=(-j"${CQ_TEST_JOBS:-3}" --output-on-failure)
[ "$unit_only" -eq 1 ] && ctest_args+=(-L unit)
# The Tsan build runs the entries labelled "tsan" (with --unit, those
# that are also "unit": CTest's -L options must all match).
build_args() {
        if [ "$1" = Tsan ]; then
                echo "-L tsan"
        fi
}
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
                echo "args: ${ctest_args[*]} $(build_args "$2")"
                (cd "$CQ_ROOT" && list_all_files | xargs -0 -r sha256sum)
                find "$dir" -maxdepth 1 -type f -name coderq -print0 |
                        xargs -0 -r sha256sum
                find "$dir/tests" -maxdepth 1 -type f -name 'check_*' -perm -u+x \
                        -print0 | sort -z | xargs -0 -r sha256sum
                env | grep -E '^(CODERQ_|CQ_|ASAN_|UBSAN_|LSAN_|TSAN_|CK_)' | sort
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
skipped=0
test_builds=()
for b in "${builds[@]}"; do
        # Release alone (--no-asan) still runs its suites
        if [ "${b#*:}" != Release ] || [ "$release_tests" -eq 1 ] ||
                [ "$asan" -eq 0 ]; then
                test_builds+=("$b")
        fi
done
for b in "${test_builds[@]}"; do
        dir=${b%:*}
        key=$(cache_key "$dir" "${b#*:}")
        if [ "$use_cache" -eq 1 ] && [ -f "$dir/test-cache" ] &&
                [ "$(head -n 1 "$dir/test-cache")" = "$key" ]; then
                n=$(sed -n 2p "$dir/test-cache")
                s=$(sed -n 4p "$dir/test-cache")
                cq_say "ctest in $dir (${b#*:}): nothing changed since" \
                        "$n suites passed and ${s:-0} skipped at" \
                        "$(sed -n 3p "$dir/test-cache"); results reused" \
                        "(--no-cache reruns them)"
                passed=$((passed + n))
                skipped=$((skipped + ${s:-0}))
                phase_end "ctest ${b#*:}"
                continue
        fi
        rm -f "$dir/test-cache"
        cq_say "ctest in $dir (${b#*:})"
        set +e
        # shellcheck disable=SC2046 # build_args is one or two words
        # TSan runs code several times slower: Check's per-test timeouts
        # grow with it (CTest's come from tests/CMakeLists.txt).
        mult=1
        [ "${b#*:}" = Tsan ] && mult=4
        (cd "$dir" && CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-$mult} \
                ctest "${ctest_args[@]}" $(build_args "${b#*:}")) 2>&1 |
                tee "$dir/ctest.log"
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
        # CTest counts a skipped suite (exit 77) among the passed ones and
        # lists it as "N - name (Skipped)"; say why each skipped.
        s=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$dir/ctest.log" ||
                true)
        if [ "$s" -gt 0 ]; then
                echo "skipped in $dir (a prerequisite is missing here):"
                grep -h '^SKIP ' "$dir/Testing/Temporary/LastTest.log" |
                        sort -u | sed 's/^/  /' || true
        fi
        passed=$((passed + t - f - s))
        failed=$((failed + f))
        skipped=$((skipped + s))
        if [ "$f" -eq 0 ]; then
                printf '%s\n%s\n%s\n%s\n' "$key" "$((t - s))" \
                        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$s" >"$dir/test-cache"
        fi
        phase_end "ctest ${b#*:}"
done

# Fuzzing: each target for CQ_FUZZ_SECONDS over its seed corpus
# (tests/fuzz/corpus/<name>/) and what earlier runs found (build-fuzz/
# corpus/<name>/, where new inputs go: the source tree is not written). A
# crash, leak, sanitizer report, timeout or memory blow-up fails the target
# and leaves the reproducer under build-fuzz/crash/.
if [ "$fuzz" -eq 1 ]; then
        fdir=$CQ_ROOT/build-fuzz
        secs=${CQ_FUZZ_SECONDS:-10}
        targets=("$fdir"/tests/fuzz/fuzz_*)
        # One target; its status, and its log says why when it failed.
        fuzz_one() {
                local exe=$1 name=${1##*/fuzz_}
                mkdir -p "$fdir/corpus/$name" "$fdir/crash"
                "$exe" -max_total_time="$secs" -rss_limit_mb=2048 \
                        -timeout=10 -max_len=65536 -print_final_stats=1 \
                        -artifact_prefix="$fdir/crash/$name-" \
                        "$fdir/corpus/$name" "$CQ_ROOT/tests/fuzz/corpus/$name" \
                        >"$fdir/fuzz-$name.log" 2>&1
        }
        cq_say "fuzzing ${#targets[@]} targets for $secs s each, two at a time"
        i=0
        while [ "$i" -lt "${#targets[@]}" ]; do
                pids=()
                for exe in "${targets[@]:$i:2}"; do
                        fuzz_one "$exe" &
                        pids+=("$!:$exe")
                done
                for p in "${pids[@]}"; do
                        exe=${p#*:}
                        name=${exe##*/fuzz_}
                        if wait "${p%%:*}"; then
                                grep -E '^stat::number_of_executed_units' \
                                        "$fdir/fuzz-$name.log" |
                                        sed "s/^/  $name: /" || true
                                passed=$((passed + 1))
                        else
                                tail -n 60 "$fdir/fuzz-$name.log"
                                art=$(grep -oE 'Test unit written to [^ ]+' \
                                        "$fdir/fuzz-$name.log" | tail -n 1 |
                                        sed 's/Test unit written to //')
                                echo "fuzz_$name FAILED; reproduce with:" \
                                        "$exe ${art:-<the input above>}" >&2
                                failed=$((failed + 1))
                        fi
                done
                i=$((i + 2))
        done
        phase_end fuzz
fi
[ "$lint_failed" -eq 0 ] || echo "lint: FAILED (see above)"
echo "test.sh: $(($(date +%s) - started)) s ($(IFS=,; echo "${times[*]}" | sed 's/,/, /g'))"
if [ "$skipped" -gt 0 ]; then
        echo "$passed passed, $failed failed, $skipped skipped"
else
        echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ] && [ "$lint_failed" -eq 0 ]
