#!/usr/bin/env bash
# gen-docs.sh - write docs/CONFIGURATION.md from the settings table in
# common/config.c (what `coderq config --markdown` prints), the way
# librdkafka generates its CONFIGURATION.md: edit the table, then run this.
# check_cli fails while the committed file differs from the table.
#
# Options:
#   --check      write nothing; exit 1 when docs/CONFIGURATION.md is stale
#   --build DIR  the build to take coderq from (default: build/, a Release
#                build made or brought up to date first)
#   -h|--help    this text
set -euo pipefail
. "$(dirname "$0")/lib.sh"

check=0
build=
while [ $# -gt 0 ]; do
        case $1 in
        --check) check=1 ;;
        --build)
                [ $# -ge 2 ] || cq_die "--build needs a folder"
                build=$2
                shift
                ;;
        -h | --help)
                sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
                exit 0
                ;;
        *)
                echo "usage: $0 [--check] [--build DIR]" >&2
                exit 2
                ;;
        esac
        shift
done

if [ -z "$build" ]; then
        build=$CQ_ROOT/build
        cq_build "$build" Release coderq
fi
[ -x "$build/coderq" ] || cq_die "no coderq in $build"

doc=$CQ_ROOT/docs/CONFIGURATION.md
new=$(mktemp)
trap 'rm -f "$new"' EXIT
# A clean environment: the table does not depend on the settings, and an
# invalid CODERQ_* value of the caller's would stop coderq.
env -i PATH="$PATH" "$build/coderq" config --markdown >"$new"
if [ "$check" -eq 1 ]; then
        if ! cmp -s "$new" "$doc"; then
                diff -u "$doc" "$new" >&2 || true
                cq_die "docs/CONFIGURATION.md is not what common/config.c generates: run scripts/gen-docs.sh"
        fi
        echo "docs/CONFIGURATION.md is up to date"
else
        cp "$new" "$doc"
        echo "wrote docs/CONFIGURATION.md"
fi
