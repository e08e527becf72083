#!/usr/bin/env bash
# test_embed_replay: the record of a model with an embedding (embed:D),
# its rows on the servers (issue 35, item 5; server/core/record.h):
#  - a recorded async run of 2 workers over 2 shards: the header holds the
#    row table's conf ("rows"), each shard wrote a row push ("rows") for
#    every step of every worker, applied, with its rows' norm, and before
#    it that worker's row pull ("rpull") at the version the push names
#    with the same keys: what a replay needs to give each gradient the
#    rows its worker read
#  - hybrid (--mode sync --rows-mode async) and sync rows: the header's
#    rows mode, the row events of every step
#  - a record whose row event was broken (its footer hashed again): one
#    line naming the line
#  - downpour replay of the async, the hybrid and the sync-rows record:
#    every recorded norm (dense and rows) matched, and the chief's
#    test_loss, test_auc and test_accuracy bit for bit those of the run's
#    summary.json, and its model.safetensors byte for byte the run's
#  - a record with one row push's "gn" edited (footer hashed again): the
#    replay reports the mismatch, naming the event
#  - downpour sim of such a model (2 workers over 2 shards, async, 151
#    updates, worker 1's step in flight at the end): its test AUC within 0.03 of the planted model's own
#    (gen-libsvm --truth); the same flags twice: the same summary.json
#    but for the wall times, the same record and model file, byte for
#    byte; its record: the rows conf and a row push after each row pull,
#    replayed with every norm matched and the sim's test figures and
#    model file; hybrid (--mode sync --rows-mode async) and sync rows:
#    their header's rows mode, replayed likewise; --churn: refused, one
#    line
source "$(dirname "$0")/lib.sh"

L=$BIN/downpour
cd "$TMP"
"$L" gen-libsvm --out-train train.svm --out-test test.svm --samples 20000 --test-samples 2000 \
    --keys 1000 --nnz 16 --seed 3 --truth truth.json >gen.out 2>&1
check "gen-libsvm writes the data" test $? = 0
common=(--model 'embed:4 fc:2 softmax' --data libsvm:train.svm:test.svm --lr 0.05 --epochs 1
        --batch 128 --seed 5 --threads 1)

# rows_ok(RECORD MODE ROWS_MODE): the header and the row events as above
rows_ok() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
path, mode, rows_mode = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
h, ev = lines[0], lines[1:-1]
assert h["mode"] == mode and h["rows"]["mode"] == rows_mode and h["rows"]["width"] == 4, h
assert h["rows"]["optim"] == "adagrad" and h["rows"]["init_scale"] > 0, h["rows"]
steps = {}
for e in ev:
    if e["e"] == "push" and e["s"] == 0:
        steps.setdefault(e["w"], set()).add(e["step"])
assert sorted(steps) == [0, 1] and sum(len(s) for s in steps.values()) == 157, steps
last_pull = {}
n = 0
for e in ev:
    if e["e"] == "rpull":
        last_pull[(e["s"], e["w"])] = e
    elif e["e"] == "rows":
        p = last_pull.pop((e["s"], e["w"]), None)
        assert p and p["v"] == e["v"] and p["n"] == e["n"], (e, p)
        assert e["st"] == "applied" and e["gn"] >= 0 and e["step"] in steps[e["w"]], e
        n += 1
assert n == 2 * 157, n  # each step's row push on both shards
EOF
}

"$L" local --workers 2 --ps-shards 2 --mode async "${common[@]}" --record async.rec --out a >a.log 2>&1
rc=$?  # before the message's $(...) resets it
check "a recorded async run of 2 workers over 2 shards exits 0 ($(tail -1 a.log))" test "$rc" = 0
check "... its record: the row table's conf, each row push after its worker's row pull" rows_ok async.rec async async
for rm in async sync; do # hybrid.rec, sync.rec
    name=sync; [ $rm = async ] && name=hybrid
    "$L" local --workers 2 --ps-shards 2 --mode sync --rows-mode $rm "${common[@]}" --record $name.rec \
        --out $name >$name.log 2>&1
    rc=$?  # before the message's $(...) resets it
    check "--mode sync --rows-mode $rm, recorded: exits 0 ($(tail -1 $name.log))" test "$rc" = 0
    check "... its record's rows mode and row events" rows_ok $name.rec sync $rm
done

# edit(IN OUT KIND N FIELD VALUE): the Nth event of KIND (a Python index:
# -1 the last) its FIELD set to VALUE (JSON), the footer's hash made right
# again; prints the event's number
edit() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
src, dst, kind, n, field, value = sys.argv[1:]
lines = open(src, "rb").read().split(b"\n")[:-2]
def fnv(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
i = [k for k, l in enumerate(lines) if b'"e":"%s"' % kind.encode() in l][int(n)]
o = json.loads(lines[i]); o[field] = json.loads(value); lines[i] = json.dumps(o, separators=(",", ":")).encode()
body = b"".join(l + b"\n" for l in lines)
foot = json.dumps({"end": "downpour_record", "events": len(lines) - 1, "fnv1a": "%016x" % fnv(body)}, separators=(",", ":"))
open(dst, "wb").write(body + foot.encode() + b"\n")
print(i)  # the event's number (line i + 1: the header is line 1)
EOF
}

# A row event edited, the footer's hash made right again: the loader's line.
edit async.rec edited.rec rows 5 st '"kept"' >/dev/null
"$L" replay edited.rec --out r-edited >r-edited.log 2>&1
rc=$?
check "a record with a broken row event: refused (status $rc), one line naming the line" \
    bash -c "[ $rc = 1 ] && [ \$(grep -c . r-edited.log) = 1 ] && grep -q 'edited.rec: line [0-9]* is not a record event' r-edited.log"

# same_figures(RUN_DIR REPLAY_DIR): the chief's test figures, bit for bit
same_figures() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
a, b = (json.load(open(d + "/summary.json")) for d in sys.argv[1:])
for k in ("test_loss", "test_auc", "test_accuracy", "steps", "rows"):
    assert a[k] == b[k], (k, a[k], b[k])
EOF
}
for run in async:a hybrid:hybrid sync:sync; do
    rec=${run%%:*} dir=${run#*:}
    "$L" replay $rec.rec --out r-$rec >r-$rec.log 2>&1
    check "replay of the $rec record: every recorded norm matched ($(tail -1 r-$rec.log))" \
        grep -q 'every recorded norm matched' r-$rec.log
    check "... its test_loss, test_auc and test_accuracy: the run's summary.json's" same_figures $dir r-$rec
    check "... its model.safetensors: the run's, byte for byte" cmp $dir/model.safetensors r-$rec/model.safetensors
done

# One row push's norm edited: the replay says its rows differ, and where.
ev=$(edit async.rec gn.rec rows 5 gn 0.5)
"$L" replay gn.rec --out r-gn >r-gn.log 2>&1
check "a record with the row push of event $ev's gn edited: the replay reports it there" \
    bash -c "grep -q 'DIFFERS from the record' r-gn.log && grep -q '1 row push(es) differ from the record in their rows. norm, the first at event $ev:' r-gn.log"
# The last row pull (the chief's evaluation's) made worker 1's: a pull no
# push follows that is not the chief's final one is refused, one line.
ev=$(edit async.rec pull.rec rpull -1 w 1)
"$L" replay pull.rec --out r-pull >r-pull.log 2>&1
rc=$?
check "a row pull of worker 1 that no push follows: refused (status $rc), one line naming event $ev" \
    bash -c "[ $rc = 1 ] && [ \$(grep -c . r-pull.log) = 1 ] && grep -q 'event $ev: worker 1.s row pull on shard [01] is followed by no row push' r-pull.log"

# downpour sim of the planted model: the workers' row pulls and pushes on
# the simulated clock, its record replayable as a daemon's.
# 151 updates: the version is reached while worker 1's step is in flight
# (its row pull made; the sim pushes it, or the replay would refuse a pull
# no push follows), which 150 does not show (worker 0's is in flight)
simflags=(--workers 2 --ps-shards 2 --compute exp:100 --updates 151 --model 'embed:4 fc:2 softmax'
          --data libsvm:train.svm:test.svm --lr 0.05 --batch 128 --seed 5 --threads 1)
"$L" sim "${simflags[@]}" --record sim.rec --out sim >sim.log 2>&1
rc=$?  # before the message's $(...) resets it
check "sim of the sparse model, async, 2 workers over 2 shards: exits 0 ($(tail -1 sim.log))" test "$rc" = 0
check "... its test AUC within 0.03 of the planted model's own, rows on both shards" "$TORCH_PY" -c "
import json
s, planted = json.load(open('sim/summary.json')), json.load(open('truth.json'))['planted_test_auc']
assert s['test_auc'] > planted - 0.03, (s['test_auc'], planted)
assert len(s['rows']) == 2 and min(s['rows']) > 0, s['rows']"
"$L" sim "${simflags[@]}" --record sim2.rec --out sim2 >sim2.log 2>&1
# the summary but for its wall times
figures() { grep -v '"\(wall_s\|train_s\|images_per_s\|images_per_s_per_worker\)"' "$1"; }
check "... the same flags again: the same summary.json but for wall times, record and model file" \
    bash -c "$(declare -f figures); diff <(figures sim/summary.json) <(figures sim2/summary.json) &&
             cmp sim.rec sim2.rec && cmp sim/model.safetensors sim2/model.safetensors"
# sim_rows_ok(RECORD MODE ROWS_MODE): the header's rows conf, a row push
# with every dense push, each after its worker's row pull at the version
# it names; the only pulls left, the chief's evaluation's
sim_rows_ok() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
path, mode, rows_mode = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
h, ev = lines[0], lines[1:-1]
assert h["mode"] == mode and h["shards"] == 2 and h["rows"]["mode"] == rows_mode, h
assert h["rows"]["width"] == 4 and h["rows"]["optim"] == "adagrad", h["rows"]
last_pull, pushes, rows = {}, 0, 0
for e in ev:
    if e["e"] == "rpull":
        last_pull[(e["s"], e["w"])] = e
    elif e["e"] == "rows":
        p = last_pull.pop((e["s"], e["w"]), None)
        assert p and p["v"] == e["v"] and p["n"] == e["n"], (e, p)
        rows += 1
    elif e["e"] == "push":
        pushes += 1
assert rows == pushes > 0, (rows, pushes)
assert all(w == 0 for (s, w) in last_pull), last_pull
EOF
}
check "... its record: the rows conf, a row push after each row pull" sim_rows_ok sim.rec async async
"$L" replay sim.rec --out r-sim >r-sim.log 2>&1
check "... replayed: every recorded norm matched ($(tail -1 r-sim.log))" grep -q 'every recorded norm matched' r-sim.log
check "... the replay's test figures and rows: the sim's summary.json's" same_figures sim r-sim
check "... its model.safetensors: the sim's, byte for byte" cmp sim/model.safetensors r-sim/model.safetensors
for rm in async sync; do # sim-hybrid, sim-sync
    name=sim-sync; [ $rm = async ] && name=sim-hybrid
    "$L" sim "${simflags[@]}" --updates 40 --mode sync --rows-mode $rm --record $name.rec --out $name \
        >$name.log 2>&1
    rc=$?  # before the message's $(...) resets it
    check "sim --mode sync --rows-mode $rm: exits 0 ($(tail -1 $name.log))" test "$rc" = 0
    check "... its record's rows mode and row events" sim_rows_ok $name.rec sync $rm
    "$L" replay $name.rec --out r-$name >r-$name.log 2>&1
    check "... replayed: every recorded norm matched ($(tail -1 r-$name.log))" \
        grep -q 'every recorded norm matched' r-$name.log
    check "... the replay's test figures and rows: the sim's" same_figures $name r-$name
done

"$L" sim --workers 1:3 --churn leave:1 "${simflags[@]:2}" --out churn >churn.log 2>&1
rc=$?
check "sim of a sparse model with --churn: refused (status $rc), one line" \
    bash -c "[ $rc != 0 ] && [ \$(grep -c . churn.log) = 1 ] && grep -q 'embed:D trains a fixed crew .*--churn' churn.log"
finish
