#!/usr/bin/env bash
# test_commands: every command the project's shell scripts run (tests/,
# deploy/, .ci/run) comes from a Debian package that a fresh machine has
# once the project's own files ran: a minbase Debian, the make, gcc,
# libc6-dev and git README asks for, and the Makefile's package lists
# (`make deps-list`), with what those depend on. A tool installed by hand
# once (bc was) passes every other test on that machine and fails on the
# next; tests/integration/scan_commands.py says how a command is found.
source "$(dirname "$0")/lib.sh"

if ! command -v dpkg-query >/dev/null || [ ! -d /var/lib/dpkg/info ]; then
    skip_checks 2 commands "no dpkg database: not a Debian machine"
    finish; exit
fi
pkgs=$(make -s --no-print-directory deps-list)
mapfile -t scripts < <(find tests deploy -name '*.sh' -o -name '*.sbatch' | sort)
scripts+=(.ci/run)
"$TORCH_PY" tests/integration/scan_commands.py $pkgs -- "${scripts[@]}" >"$TMP/scan.log" 2>&1
rc=$?
cat "$TMP/scan.log"
check "the scripts' commands all come from what the project installs" test $rc = 0

# The scan itself: a script that pipes into a tool no package installed
# (one the test makes) is caught at its line, as bc was; one that sums
# with awk passes.
mkdir -p "$TMP/bin" && printf '#!/bin/sh\ncat\n' >"$TMP/bin/sum-by-hand" && chmod +x "$TMP/bin/sum-by-hand"
printf '#!/bin/bash\nx=$(seq 3 | paste -sd+ | sum-by-hand)\n' >"$TMP/bad.sh"
printf '#!/bin/bash\nx=$(seq 3 | awk "{ s += \\$1 } END { print s }")\n' >"$TMP/good.sh"
DP_SCAN_PATH=$TMP/bin:/usr/bin:/bin "$TORCH_PY" tests/integration/scan_commands.py $pkgs -- "$TMP/bad.sh" >"$TMP/bad.log" 2>&1
rc=$?
check "a script piping into a hand-installed tool is caught at its line (exit $rc)" \
    bash -c "[ $rc = 1 ] && grep -q 'bad.sh:2: sum-by-hand .*package none' '$TMP/bad.log'"
DP_SCAN_PATH=$TMP/bin:/usr/bin:/bin "$TORCH_PY" tests/integration/scan_commands.py $pkgs -- "$TMP/good.sh" >"$TMP/good.log" 2>&1
check "a script summing with awk passes" test $? = 0
finish
