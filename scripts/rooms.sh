#!/usr/bin/env bash
# rooms.sh - check the room map (cmake/rooms.txt) against the sources:
#   - a source of a room includes coderq headers only of its own room and
#     of the rooms the table says it may call (a header belongs to the
#     room whose include/coderq/ holds it), never another folder's
#     private header by path ("../x/y_int.h"), and libpq only in storage/
#     (every SQL statement is storage's);
#   - every .c of a room includes its own header first, proving that the
#     header stands alone: the room's public header of the same name when
#     there is one (x.c: coderq/x.h), else another public header of its
#     room (storage/queue.c: coderq/store.h).
# Prints one line per violation; exit status 1 when there is any. Run by
# scripts/test.sh's lint; needs only bash, awk and grep.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

declare -A calls=() # folder -> " self callee... "
folders=()
while read -r folder _lib rest; do
        case $folder in '' | '#'*) continue ;; esac
        folders+=("$folder")
        calls[$folder]=" $folder ${rest//-/} "
done <cmake/rooms.txt

# The room of each public header, by where it lives.
declare -A owner=()
for folder in "${folders[@]}"; do
        for h in "$folder"/include/coderq/*.h; do
                [ -e "$h" ] || continue
                name=${h##*/}
                if [ -n "${owner[$name]:-}" ]; then
                        echo "rooms: coderq/$name is in both ${owner[$name]} and $folder"
                        bad=1
                fi
                owner[$name]=$folder
        done
done

bad=${bad:-0}
for folder in "${folders[@]}"; do
        for f in "$folder"/*.c "$folder"/*.h "$folder"/include/coderq/*.h; do
                [ -e "$f" ] || continue
                first=1
                while IFS=: read -r line inc; do
                        target=$(sed -E 's/^#include[[:space:]]*[<"]([^">]*)[">].*/\1/' <<<"$inc")
                        case $target in
                        coderq/*)
                                name=${target#coderq/}
                                room=${owner[$name]:-}
                                if [ -z "$room" ]; then
                                        echo "$f:$line: includes $target, which no room has"
                                        bad=1
                                elif [[ ${calls[$folder]} != *" $room "* ]]; then
                                        echo "$f:$line: includes $target of $room/, which $folder/ may not call (cmake/rooms.txt)"
                                        bad=1
                                fi
                                ;;
                        */*.h | *.h)
                                if [[ $inc == *'"'* ]]; then
                                        if [[ $target == */* ]] || [ ! -e "$folder/$target" ]; then
                                                echo "$f:$line: includes $target, not a private header of $folder/"
                                                bad=1
                                        fi
                                elif [ "$target" = libpq-fe.h ] && [ "$folder" != storage ]; then
                                        echo "$f:$line: includes <libpq-fe.h>: SQL belongs in storage/"
                                        bad=1
                                fi
                                ;;
                        esac
                        if [ "$first" = 1 ] && [[ $f == *.c ]]; then
                                first=0
                                base=${f##*/}
                                base=${base%.c}
                                if [ -e "$folder/include/coderq/$base.h" ]; then
                                        want="coderq/$base.h"
                                        [ "$target" = "$want" ] ||
                                                { echo "$f:$line: includes $target first, not its own header $want"; bad=1; }
                                elif [[ $target != coderq/* ]] || [ "${owner[${target#coderq/}]:-}" != "$folder" ]; then
                                        echo "$f:$line: includes $target first, not a public header of $folder/"
                                        bad=1
                                fi
                        fi
                done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" | sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*/\1:#/')
        done
done
exit "$bad"
