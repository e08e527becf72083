#!/usr/bin/env bash
# test_structure: worker/'s and server/'s rooms keep their direction
# (ARCHITECTURE.md, "Processes"). Reads the sources only: no build needed.
#
# worker/: train/ uses client/ and exec/; exec/ is one worker's compute and
# opens no socket, so nothing under it includes zmq.h or a header of
# client/ or train/; nothing under client/ includes a header of train/.
#
# server/: loop/ (the poll loop, admission, handlers, replies, shared
# memory, auth) is the only room that includes zmq.h; core/ (shard, policy,
# rows' rules, checkpoint, record) is wire-free, so nothing under it
# includes zmq.h or a header of loop/ — deploy/lab runs core/'s code with no
# socket; crew/ (members, the membership journal, the dealer) is the
# plainest: no zmq.h, no header of loop/ or core/ (core/ uses crew/: a
# policy counts the live members, a record and a checkpoint carry the
# dealer). deploy/lab (the simulator, the replay) runs core/'s code (one
# dp_push_apply for the daemon and the lab), so it includes no header of
# loop/ either.
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

# closure ROOM: every repository header the C files under ROOM reach through
# "..." includes, followed header by header (what the compiler would read of
# the project's own files), one path a line.
closure() {
    local todo seen f h
    todo=$(find "$1" -name '*.[ch]' | sort)
    seen=""
    while [ -n "$todo" ]; do
        set -- $todo
        f=$1; shift; todo="$*"
        case " $seen " in *" $f "*) continue ;; esac
        seen="$seen $f"
        for h in $(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$f"); do
            [ -f "$h" ] && todo="$todo $h"
        done
    done
    echo $seen | tr ' ' '\n'
}

# zmq_reached ROOM: the files in ROOM's closure that include zmq.h themselves.
zmq_reached() {
    closure "$1" | while read -r f; do
        grep -lE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<zmq\.h>' "$f"
    done
}

for room in worker/client worker/exec worker/train worker/exec/env server/loop server/core server/crew; do
    n=$(find "$room" -name '*.c' 2>/dev/null | wc -l)
    check "$room holds C files ($n)" test "$n" -gt 0
done

# files left in worker/ and server/ themselves: the binary's own (main, args) only
for top in worker server; do
    loose=$(find "$top" -maxdepth 1 -name '*.[ch]' | sort | grep -vxE "$top/(main\.c|args\.[ch])")
    check "$top/ itself holds only main.c and args.{c,h}${loose:+: $(echo $loose)}" test -z "$loose"
done

bad=$(breaks worker/exec '(.*/)?zmq\.h$')
check "worker/exec includes no zmq.h${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks worker/exec '(.*/)?(client|train)/')
check "worker/exec includes no header of worker/client or worker/train${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks worker/client '(.*/)?train/')
check "worker/client includes no header of worker/train${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks server/core '(.*/)?zmq\.h$')
check "server/core includes no zmq.h${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks server/core '(.*/)?loop/')
check "server/core includes no header of server/loop${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks server/crew '(.*/)?zmq\.h$')
check "server/crew includes no zmq.h${bad:+: $(echo $bad)}" test -z "$bad"
bad=$(breaks server/crew '(.*/)?(loop|core)/')
check "server/crew includes no header of server/loop or server/core${bad:+: $(echo $bad)}" test -z "$bad"
# ... nor through another header (proto/wire.h is the codec; ZeroMQ's half is
# proto/wire_zmq.h, which only loop/ and the client include)
for room in server/core server/crew worker/exec; do
    bad=$(zmq_reached "$room")
    check "nothing $room includes reaches zmq.h${bad:+: $(echo $bad)}" test -z "$bad"
done
# the lab (deploy/lab: sim, replay) runs server/core's code without the wire
bad=$(breaks deploy/lab '(.*/)?server/loop/')
check "deploy/lab includes no header of server/loop${bad:+: $(echo $bad)}" test -z "$bad"
# the exception is still there (else drop it from ALLOWED, so it cannot hide a new one)
check "the one allowed exception ($ALLOWED) is still needed" \
    grep -qx "$ALLOWED" <(includes worker/exec)

finish
