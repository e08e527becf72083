#!/usr/bin/env bash
# test_flags: every binary reads its command line the same way (common/opts.h):
#  - a malformed number, an out-of-range one and an unknown flag are each
#    refused with exit status 2 and ONE line on stderr naming the flag and
#    what it accepts — downpour-ps, downpour-worker, downpour local, downpour
#    eval; `downpour local --workers 2abc` no longer runs with 2 workers;
#    a flag's prefix (--epoch for --epochs) is an unknown flag
#  - downpour local refuses a bad daemon flag itself, before starting anything,
#    and a malformed --model (exit 2, no shard started, no DIR made)
#  - an environment variable's bad value is refused the same way (one line
#    naming the variable, exit status 2), before anything starts
#  - downpour --summary (downpour(1)'s NAME line) names every command of
#    downpour --help: both come from the launcher's one table
#  - --help of every binary exits 0 and lists its flags; downpour-worker,
#    downpour local and downpour sim end with the same paragraph on the
#    model grammar (common/model.h), whose example is a spec they run
#  - seeds above 2^53 are taken whole by the worker and the servers alike
#  - the TensorFlow-style cluster flags still place a ps task (its resolved
#    cluster is logged), and SIGTERM stops it cleanly
source "$(dirname "$0")/lib.sh"

PS=$BIN/downpour-ps WK=$BIN/downpour-worker L=$BIN/downpour

# refused NAME WANT COMMAND...: exit status 2, nothing on stdout, exactly one
# line on stderr, containing WANT.
refused() {
    local name=$1 want=$2; shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? lines
    lines=$(wc -l <"$TMP/err")
    if [ $rc = 2 ] && [ "$lines" = 1 ] && [ ! -s "$TMP/out" ] && grep -qF -- "$want" "$TMP/err"; then
        pass "$name"
    else
        fail "$name" "exit $rc, $lines line(s) on stderr: $(head -c 400 "$TMP/err")"
    fi
}

refused "downpour-ps: malformed number" "--workers '2abc': expected an integer in [1, 100000]" \
    "$PS" --workers 2abc
refused "downpour-ps: out of range" "--momentum '1.5': expected a number in [0, 1]" \
    "$PS" --momentum 1.5
refused "downpour-ps: unknown flag" "unknown flag '--bogus'" "$PS" --bogus 3
refused "downpour-ps: seed past 2^64" "--seed '18446744073709551616'" "$PS" --seed 18446744073709551616

refused "downpour-worker: malformed number" "--batch '6x4': expected an integer in [1, 65536]" \
    "$WK" --standalone --batch 6x4
refused "downpour-worker: out of range" "--threads '0': expected an integer in [1, 1024]" \
    "$WK" --standalone --threads 0
refused "downpour-worker: unknown flag" "unknown flag '--bogus'" "$WK" --standalone --bogus
refused "downpour-worker: malformed seed" "--seed '1e3'" "$WK" --standalone --seed 1e3

refused "downpour local: --workers 2abc" "--workers '2abc': expected an integer in [1, 64]" \
    "$L" local --workers 2abc --out "$TMP/never"
refused "downpour local: out of range" "--ps-shards '0': expected an integer in [1, 64]" \
    "$L" local --ps-shards 0 --out "$TMP/never"
refused "downpour local: unknown flag" "unknown flag '--bogus'" "$L" local --bogus --out "$TMP/never"
# A flag is its whole name in every binary (getopt_long's unique prefixes
# are refused in common/opts.c): "--epoch" is not --epochs.
refused "downpour local: a flag's prefix" "unknown flag '--epoch' (did you mean --epochs?" \
    "$L" local --epoch 1 --out "$TMP/never"
refused "downpour-worker: a flag's prefix" "unknown flag '--epoch' (did you mean --epochs?" \
    "$WK" --standalone --epoch 1
refused "downpour-ps: a flag's prefix" "unknown flag '--momentu' (did you mean --momentum?" \
    "$PS" --momentu 0.5
refused "downpour local: a worker's flag checked by the worker's table" \
    "--batch '6x4': expected an integer in [1, 65536]" "$L" local --batch 6x4 --out "$TMP/never"
refused "downpour local: a server's flag checked by the server's table" \
    "--lr '-1': expected a number in" "$L" local --lr -1 --out "$TMP/never"
refused "downpour local: a daemon-only flag is not passed on" "unknown flag '--bind'" \
    "$L" local --bind tcp://*:1 --out "$TMP/never"
# A malformed --model is a bad command line too: the launcher parses it on
# the data's (or the environment's) input before any shard starts.
refused "downpour local: a malformed --model" "model spec: unknown layer 'blah'" \
    "$L" local --model "fc:12 blah" --steps 5 --out "$TMP/never"
refused "downpour local --env: a model without an actor-critic head" "has no actor-critic head" \
    "$L" local --env cartpole-v1 --model "fc:12 softmax" --out "$TMP/never"
check "downpour local: nothing started or created on a bad flag" test ! -e "$TMP/never"
# The optimizers, rmsprop among them, with its flags: every command that
# takes --optimizer names them all, and range-checks --rms-alpha and --eps.
refused "downpour-ps: unknown optimizer" "unknown optimizer 'lamb' (use sgd, momentum, nesterov, adam, adagrad or rmsprop)" \
    "$PS" --optimizer lamb
refused "downpour local: unknown optimizer" "or rmsprop)" "$L" local --optimizer lamb --out "$TMP/never"
refused "downpour sim: --rms-alpha out of range" "--rms-alpha '1.5': expected a number in [0, 1]" \
    "$L" sim --optimizer rmsprop --rms-alpha 1.5 --out "$TMP/never"
refused "downpour-worker: --eps out of range" "--eps '0': expected a number in [1e-30, 1000]" \
    "$WK" --standalone --optimizer rmsprop --eps 0
refused "downpour local: --rms-alpha checked by the server's table" "--rms-alpha 'x'" \
    "$L" local --rms-alpha x --out "$TMP/never"
check "a bad optimizer flag: nothing started or created" test ! -e "$TMP/never"
# The delay rules and compensation: one parser for every command.
refused "downpour-ps: unknown delay rule" "bad delay rule 'fast' (use none, inverse, adaptive, threshold or threshold:K" \
    "$PS" --delay-lr fast
refused "downpour sim: threshold K below 1" "bad delay rule 'threshold:0.5'" \
    "$L" sim --delay-lr threshold:0.5 --updates 1 --out "$TMP/never"
refused "downpour local: a bad compensation, checked by the server's table" \
    "bad delay compensation 'const:x' (use off, const:LAMBDA" "$L" local --delay-compensation const:x --out "$TMP/never"
refused "downpour-ps: --lr-staleness against another rule" "--lr-staleness is --delay-lr inverse" \
    "$PS" --lr-staleness --delay-lr adaptive
refused "downpour sim: --lr-staleness against another rule" "--lr-staleness is --delay-lr inverse" \
    "$L" sim --lr-staleness --delay-lr none --updates 1 --out "$TMP/never"
check "a bad delay flag: nothing started or created" test ! -e "$TMP/never"

refused "downpour eval: malformed number" "--batch '12abc': expected an integer in [1, 65536]" \
    "$L" eval --checkpoint x.safetensors --batch 12abc
refused "downpour eval: out of range" "--limit '-1': expected an integer in [0, 1000000000]" \
    "$L" eval --checkpoint x.safetensors --limit -1
refused "downpour eval: unknown flag" "unknown flag '--bogus'" "$L" eval --bogus
refused "downpour: unknown command" "unknown command 'bogus'" "$L" bogus

# Environment variables (ARCHITECTURE.md's "Environment" table) go through
# the same parsers, read at the start of main: a bad value is one line
# naming the variable and exit status 2, in every binary, before anything
# (the flags too: each command's --bogus is never reached).
refused "DP_CONV_SPARSE_MAX=2: worker" "DP_CONV_SPARSE_MAX '2': expected a number in [0, 1]" \
    env DP_CONV_SPARSE_MAX=2 "$WK" --standalone --bogus
refused "DP_CONV_SPARSE_MAX=0.5x: downpour local" "DP_CONV_SPARSE_MAX '0.5x'" \
    env DP_CONV_SPARSE_MAX=0.5x "$L" local --bogus --out "$TMP/never"
refused "DP_CONV_DIRECT=3: worker" "DP_CONV_DIRECT '3': expected an integer in [0, 2]" \
    env DP_CONV_DIRECT=3 "$WK" --standalone --bogus
refused "DP_LOG=verbose: downpour-ps" "DP_LOG 'verbose': expected one of info|debug" \
    env DP_LOG=verbose "$PS" --bogus --ready-file "$TMP/never"
refused "DP_LOG=verbose: downpour sim" "DP_LOG 'verbose'" env DP_LOG=verbose "$L" sim --bogus --out "$TMP/never"
refused "DP_LOG=verbose: downpour gen-libsvm" "DP_LOG 'verbose'" \
    env DP_LOG=verbose "$L" gen-libsvm --bogus --out-train "$TMP/never" --out-test "$TMP/never.test"
refused "DP_CPU_ISA=bogus: downpour eval" "DP_CPU_ISA=bogus: unknown path" \
    env DP_CPU_ISA=bogus "$L" eval --bogus --checkpoint "$TMP/never"
# The CUDA backend's knobs are checked in every build (a CPU-only one too).
refused "DP_CUDA_WORKSPACE_MB=lots: worker" "DP_CUDA_WORKSPACE_MB 'lots': expected an integer in [0, 1048576]" \
    env DP_CUDA_WORKSPACE_MB=lots "$WK" --standalone --bogus
refused "DP_CUDA_ALGOS=best: downpour local" "DP_CUDA_ALGOS 'best': expected one of exact|fastest" \
    env DP_CUDA_ALGOS=best "$L" local --bogus --out "$TMP/never"
refused "DP_CUDA_TF32=yes: worker (atoi read it as 0)" "DP_CUDA_TF32 'yes': expected an integer in [0, 1]" \
    env DP_CUDA_TF32=yes "$WK" --standalone --bogus
refused "DP_CUDA_BN=fast: worker" "DP_CUDA_BN 'fast': expected one of cudnn|own" \
    env DP_CUDA_BN=fast "$WK" --standalone --bogus
check "a bad environment variable: nothing started or created" test ! -e "$TMP/never"

# --help: exit 0, on stdout, every binary.
helps() { # NAME MUST_CONTAIN COMMAND...
    local name=$1 want=$2; shift 2
    "$@" >"$TMP/help" 2>"$TMP/err"
    local rc=$?
    if [ $rc = 0 ] && grep -qF -- "$want" "$TMP/help"; then pass "$name"; else fail "$name" "exit $rc"; fi
}
helps "downpour-ps --help" "--heartbeat-timeout SECONDS" "$PS" --help
helps "downpour-worker --help" "--eval-limit K" "$WK" --help
helps "downpour-worker -h" "--standalone" "$WK" -h
helps "downpour local --help lists what it passes on" "passed on to downpour-worker:" "$L" local --help
helps "downpour eval --help" "--checkpoint FILE" "$L" eval --help
helps "downpour launch --help" "-- COMMAND [ARGS...]" "$L" launch --help
helps "downpour --help" "downpour local" "$L" --help
helps "downpour-ps --help lists rmsprop" "adagrad|rmsprop" "$PS" --help
helps "downpour-worker --help lists rmsprop" "adagrad, rmsprop" "$WK" --help
helps "downpour local --help passes --rms-alpha on" "--rms-alpha X" "$L" local --help
helps "downpour sim --help lists rmsprop" "adagrad|rmsprop" "$L" sim --help
helps "downpour-ps --help has --delay-lr" "threshold[:K] (skip it when tau > K x the mean delay" "$PS" --help
helps "downpour local --help passes --delay-compensation on" "--delay-compensation DC" "$L" local --help
helps "downpour sim --help has both" "const:LAMBDA or adaptive:LAMBDA0 (DC-ASGD)" "$L" sim --help
helps "downpour sweep --help has the delay axes" "--delay-compensation LIST" "$L" sweep --help
helps "downpour gen-libsvm --help" "--out-train FILE" "$L" gen-libsvm --help
# The grammar's paragraph (DP_MODEL_SPEC_HELP): the same text in the three
# programs that take --model, and its example runs.
grammar() { "$@" --help 2>&1 | sed -n '/^--model SPEC: /,$p'; }
grammar "$WK" >"$TMP/g-worker"; grammar "$L" local >"$TMP/g-local"; grammar "$L" sim >"$TMP/g-sim"
check "downpour-worker --help ends with the model grammar (res( LAYERS ), the presets)" \
    bash -c "grep -qF 'res( LAYERS )' '$TMP/g-worker' && grep -qF resnet110 '$TMP/g-worker'"
check "... downpour local --help and downpour sim --help with the same paragraph" \
    bash -c "cmp -s '$TMP/g-worker' '$TMP/g-local' && cmp -s '$TMP/g-worker' '$TMP/g-sim'"
example=$(sed -n "s/^  '\(.*\)'$/\1/p" "$TMP/g-worker")
if [ -d /usr/share/datasets/fashion-mnist ]; then
    "$L" sim --workers 1 --updates 1 --batch 2 --eval-limit 10 --model "$example" >/dev/null 2>"$TMP/g-run.err"
    check "... and its example ('$example') is a spec that trains" test $? = 0
else
    skip "the grammar's example" "Debian's dataset-fashion-mnist is not installed (make deps)"
fi
# The launcher's usage and its man page's NAME line (--summary, help2man -n)
# come from one table: every command --help shows, --summary names.
"$L" --help >"$TMP/usage" 2>&1
"$L" --summary >"$TMP/summary" 2>&1
check "downpour --summary names every command of downpour --help" bash -c '
    n=0
    while read -r name; do
        n=$((n + 1)); grep -qE "[:,] $name(,|\$)" "$1" || { echo "missing: $name"; exit 1; }
    done < <(awk "/^(usage:)? +downpour /{s=\"\"; for (i = 1; i <= NF; i++) if (\$i == \"downpour\") break;
                 for (i++; i <= NF && \$i ~ /^[a-z][a-z-]*\$/; i++) s = s (s == \"\" ? \"\" : \" \") \$i; print s}" "$2")
    [ $n = 12 ]' _ "$TMP/summary" "$TMP/usage"

# Seeds above 2^53 are taken whole, by the worker and by the servers: 2^53
# and 2^53 + 1 (one double apart from nothing) draw different weights, and a
# one-worker async cluster (in turn) at 2^53 + 1 equals the standalone trainer at
# 2^53 + 1 bit for bit (both start from the same seed).
if [ -d /usr/share/datasets/fashion-mnist ]; then
    big=9007199254740993
    sa() { "$WK" --standalone --steps 2 --batch 8 --no-progress --seed "$@" >>"$TMP/seed.log" 2>&1; }
    sa 9007199254740992 --save "$TMP/s0.safetensors"
    sa $big --save "$TMP/s1.safetensors"
    check "standalone: seeds 2^53 and 2^53+1 draw different weights" \
        bash -c '! cmp -s "$1" "$2"' _ "$TMP/s0.safetensors" "$TMP/s1.safetensors"
    "$L" local --workers 1 --mode async --overlap off --steps 2 --batch 8 --seed $big --no-progress \
        --out "$TMP/big" >"$TMP/big.log" 2>&1
    check "local async, 1 worker, seed 2^53+1" test $? = 0
    check "cluster == standalone at seed 2^53+1, bit for bit" \
        bash -c '"$0" tests/integration/compare_st.py "$1" "$2" --rtol 0 --atol 0 >"$3" 2>&1 || { cat "$3"; exit 1; }' \
        "$TORCH_PY" "$TMP/big/model.safetensors" "$TMP/s1.safetensors" "$TMP/compare.log"
else
    skip "seed above 2^53" "Debian's dataset-fashion-mnist is not installed (make deps)"
fi

# The TensorFlow-style cluster flags still place a ps task; its log says
# which task it resolved to, and SIGTERM stops it with status 143 (128 + 15).
port=$(( 20000 + RANDOM % 20000 ))
bg "$PS" --job-name ps --task-index 0 --ps-hosts "127.0.0.1:$port" --worker-hosts "127.0.0.1:$((port + 1))" \
    --ready-file "$TMP/ready" 2>"$TMP/ps.log"
ps_pid=$!
for _ in $(seq 100); do [ -s "$TMP/ready" ] && break; sleep 0.1; done
check "cluster flags: the ps task binds its port" grep -q ":$port" "$TMP/ready"
check "cluster flags: the resolved cluster is logged" \
    grep -qF "cluster: ps task 0 (127.0.0.1:$port); 1 ps, 1 worker" "$TMP/ps.log"
kill -TERM "$ps_pid"
wait_for "$ps_pid" 20
check "downpour-ps stops on SIGTERM with status 143" test $? = 143

finish
