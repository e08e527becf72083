#!/usr/bin/env bash
# test_py_client: the Python package (python/downpour, from the build's
# build/python with nothing else set) against live servers; the checks
# themselves are tests/integration/py_client.py's:
#  (a) exactness: one downpour.torch.Worker pushing real gradients of a
#      module with batch norm to servers running SGD (2 shards, so tensors
#      straddle shards) and Adam (1 shard) ends every step on the weights
#      torch.optim.SGD / Adam reach on the same gradients, to float rounding;
#      the buffers (running statistics, num_batches_tracked) travel as
#      values; pulls are in place, .grad views into one flat buffer
#  (b) the three errors: a .grad of the wrong shape, a NaN gradient (the
#      servers refuse it) and a module that is not the servers' table each
#      raise one exception naming the tensor
#  (c) a --model SPEC server: Worker(spec=...), Client.from_spec, the NumPy
#      client's pulls and pushes
#  (d) the library lookup: DOWNPOUR_LIB overrides, a missing file is one line
source "$(dirname "$0")/lib.sh"

use_py_package 48 py_client
PY=tests/integration/py_client.py
SPEC="fc:32 relu fc:10 softmax"

# ps NAME FLAGS...: a shard on a free port (started here, not in a $(...)
# subshell, so that bg's cleanup knows it); its endpoint in $EP once it listens.
ps() {
    local name=$1; shift
    bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$TMP/$name.ready" --workers 1 \
        --mode async "$@" >"$TMP/$name.log" 2>&1
    local t=0
    until [ -s "$TMP/$name.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
    EP=$(cat "$TMP/$name.ready" 2>/dev/null)
}
# run NAME ARGS...: a py_client.py command, its lines counted into ours.
run() { local name=$1; shift; run_counted "$name" "$TORCH_PY" "$PY" "$@"; }

INIT=$TMP/bn.safetensors
check "save_init writes the --init file" "$TORCH_PY" "$PY" init --init "$INIT"

# (a) exactness
ps sgd0 --init "$INIT" --shard 0/2 --optimizer sgd --lr 0.05; a=$EP
ps sgd1 --init "$INIT" --shard 1/2 --optimizer sgd --lr 0.05; b=$EP
check "downpour-ps --init reads the file save_init wrote (2 shards)" test -n "$a" -a -n "$b"
run sgd exact --ps "$a,$b" --init "$INIT" --optimizer sgd --lr 0.05
ps adam --init "$INIT" --optimizer adam --lr 0.01; a=$EP
run adam exact --ps "$a" --init "$INIT" --optimizer adam --lr 0.01

# (b) the errors
ps errors --init "$INIT" --optimizer sgd; a=$EP
run errors errors --ps "$a" --init "$INIT"

# (c) a spec server
ps spec --model "$SPEC" --optimizer sgd; a=$EP
run spec spec --ps "$a" --spec "$SPEC"

# (d) which library
out=$("$TORCH_PY" -c 'import downpour; print(downpour.library_path())')
check "PYTHONPATH=$BUILD/python loads that build's library ($out)" \
    test "$out" = "$PWD/$BUILD/python/downpour/libdownpour.so.1"
out=$(DOWNPOUR_LIB=$BIN/lib/libdownpour.so.1.0.0 "$TORCH_PY" -c 'import downpour, downpour._lib as l; l.load(); print(downpour.library_path())')
check "DOWNPOUR_LIB=FILE overrides it" test "$out" = "$BIN/lib/libdownpour.so.1.0.0"
out=$(DOWNPOUR_LIB=$TMP/none.so "$TORCH_PY" -c 'import downpour; downpour.Client([("w", (2,), True)], ps="tcp://127.0.0.1:1")' 2>&1)
check "a missing DOWNPOUR_LIB is one line naming it" grep -q "cannot load the client library $TMP/none.so" <<<"$out"
finish
