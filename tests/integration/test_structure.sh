#!/usr/bin/env bash
# test_structure: worker/'s three rooms keep their direction
# (ARCHITECTURE.md, "Processes"): train/ uses client/ and exec/; exec/ is
# one worker's compute and opens no socket, so nothing under it includes
# zmq.h or a header of client/ or train/; nothing under client/ includes a
# header of train/. Reads the sources only: no build needed.
#
# One exception, named here so that any other fails: exec/net.h includes
# client/pull.h for dp_pull_status_t, the status its on_params hook returns
# (an enum, no socket).
source "$(dirname "$0")/lib.sh"

ALLOWED="worker/exec/net.h:worker/client/pull.h"

# includes ROOM: every "FILE:PATH" a C file under ROOM includes.
includes() {
    find "$1" -name '*.[ch]' -o -name '*.cu' | sort | while read -r f; do
        sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*/\1/p' "$f" |
            sed "s|^|$f:|"
    done
}

# breaks ROOM REGEX: the includes under ROOM whose path matches REGEX, less
# the allowed one.
breaks() {
    includes "$1" | grep -E ":$2" | grep -vxF "$ALLOWED"
}

for room in worker/client worker/exec worker/train worker/exec/env; do
    n=$(find "$room" -name '*.c' 2>/dev/null | wc -l)
    check "$room holds C files ($n)" test "$n" -gt 0
done

# files left in worker/ itself: the binary's own (main, args) only
loose=$(find worker -maxdepth 1 -name '*.[ch]' | sort | grep -vxE 'worker/(main\.c|args\.[ch])')
check "worker/ itself holds only main.c and args.{c,h}${loose:+: $(echo $loose)}" test -z "$loose"

bad=$(breaks worker/exec '(.*/)?zmq\.h$')
check "worker/exec includes no zmq.h${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks worker/exec '(.*/)?(client|train)/')
check "worker/exec includes no header of worker/client or worker/train${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks worker/client '(.*/)?train/')
check "worker/client includes no header of worker/train${bad:+: $(echo $bad)}" test -z "$bad"
# the exception is still there (else drop it from ALLOWED, so it cannot hide a new one)
check "the one allowed exception ($ALLOWED) is still needed" \
    grep -qx "$ALLOWED" <(includes worker/exec)

finish
