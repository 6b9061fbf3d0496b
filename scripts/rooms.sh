#!/usr/bin/env bash
# rooms.sh - check the room map (cmake/rooms.txt) against the sources:
#   - a source of a room includes coderq headers only of its own room and
#     of the rooms the table says it may call (coderq/<name>/x.h is a
#     header of the room whose folder ends in <name>: include/coderq/
#     <name>/ holds it), never another folder's
#     private header by path ("../x/y_int.h"), and libpq only in storage/
#     (every SQL statement is storage's);
#   - every .c of a room includes its own header first, proving that the
#     header stands alone: the room's public header of the same name when
#     there is one (agent/llm.c: coderq/agent/llm.h), else another public
#     header of its room;
#   - every folder under include/coderq/ is a room's.
# Prints one line per violation; exit status 1 when there is any. Run by
# scripts/test.sh's lint; needs only bash, awk and grep.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

declare -A calls=() # folder -> " self callee... "
declare -A room=()  # header folder name -> room folder
folders=()
bad=0
while read -r folder _lib rest; do
        case $folder in '' | '#'*) continue ;; esac
        folders+=("$folder")
        calls[$folder]=" $folder ${rest//-/} "
        name=${folder##*/}
        if [ -n "${room[$name]:-}" ]; then
                echo "rooms: $folder/ and ${room[$name]}/ both end in $name"
                bad=1
        fi
        room[$name]=$folder
done <cmake/rooms.txt
for d in include/coderq/*/; do
        d=${d%/}
        [ -n "${room[${d##*/}]:-}" ] ||
                { echo "rooms: $d/ is no room's (cmake/rooms.txt)"; bad=1; }
done

for folder in "${folders[@]}"; do
        name=${folder##*/}
        for f in "$folder"/*.c "$folder"/*.h include/coderq/"$name"/*.h; do
                [ -e "$f" ] || continue
                first=1
                while IFS=: read -r line inc; do
                        target=$(sed -E 's/^#include[[:space:]]*[<"]([^">]*)[">].*/\1/' <<<"$inc")
                        case $target in
                        coderq/*)
                                hname=${target#coderq/}
                                hname=${hname%%/*}
                                owner=${room[$hname]:-}
                                if [ -z "$owner" ] || [ ! -e "include/$target" ]; then
                                        echo "$f:$line: includes $target, which no room has"
                                        bad=1
                                elif [[ ${calls[$folder]} != *" $owner "* ]]; then
                                        echo "$f:$line: includes $target of $owner/, which $folder/ may not call (cmake/rooms.txt)"
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
                                if [ -e "include/coderq/$name/$base.h" ]; then
                                        want="coderq/$name/$base.h"
                                        [ "$target" = "$want" ] ||
                                                { echo "$f:$line: includes $target first, not its own header $want"; bad=1; }
                                elif [[ $target != coderq/"$name"/* ]]; then
                                        echo "$f:$line: includes $target first, not a public header of $folder/"
                                        bad=1
                                fi
                        fi
                done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" | sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*/\1:#/')
        done
done
exit "$bad"
