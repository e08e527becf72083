#!/usr/bin/env bash
# test_names: the pages and the comments name only what exists. Every path
# of a source file (server/..., worker/..., proto/..., common/...,
# kernels/..., deploy/..., tests/...) named in README.md, ARCHITECTURE.md,
# BENCHMARKS.md's Now, docs/ or a comment of a C file is a file of the
# checkout, and every function named in ARCHITECTURE.md as `dp_...` or
# `s_...` is defined in one. A move that leaves a name behind fails here,
# with the file and line that still say it. Reads the sources only.
source "$(dirname "$0")/lib.sh"

ROOMS='(server|worker|proto|common|kernels|deploy|tests|python|examples)'

# paths FILE...: "FILE:LINE: PATH" for each source path those files name.
paths() {
    grep -HnoE "\\b$ROOMS/[a-z0-9_./-]*[a-z0-9_]\\.(c|h|cu|cuh|sh|py|proto)\\b" "$@" 2>/dev/null
}

# missing LISTING: the entries whose path is not a file here (a file the
# build generates, *.pb-c.h, lives under build/gen).
missing() {
    while IFS=: read -r f l p; do
        [ -e "$p" ] || [[ "$p" == *.pb-c.h ]] || echo "$f:$l: $p"
    done
}

pages=(README.md ARCHITECTURE.md docs/*.md)
# BENCHMARKS.md's History is a journal: it keeps the names of its day
now=$TMP/benchmarks-now.md
sed '/^## History/,$d' BENCHMARKS.md >"$now"
bad=$( { paths "${pages[@]}"; paths "$now" | sed "s|^$now|BENCHMARKS.md|"; } | missing)
check "the pages name only files that exist${bad:+: $(echo "$bad" | head -5 | tr '\n' ' ')}" test -z "$bad"

sources=$(find server worker proto common kernels deploy -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort)
bad=$(paths $sources | missing)
check "the C sources' comments name only files that exist${bad:+: $(echo "$bad" | head -5 | tr '\n' ' ')}" test -z "$bad"

# names ARCHITECTURE.md gives as `dp_...` or `s_...` (functions, types,
# macros): each a word of some source file
n=0 bad=
for fn in $(grep -oE '`(dp|s)_[a-z0-9_]+`' ARCHITECTURE.md | tr -d '`' | sort -u); do
    n=$((n + 1))
    grep -qw -- "$fn" $sources || bad="$bad $fn"
done
check "ARCHITECTURE.md's $n function names exist in the sources${bad:+:$bad}" test -z "$bad"
check "the scan found names to check ($n)" test "$n" -gt 20

finish
