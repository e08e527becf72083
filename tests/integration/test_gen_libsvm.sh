#!/usr/bin/env bash
# test_gen_libsvm: `downpour gen-libsvm` (sparse data of known truth) and the
# reader (common/libsvm.h) on what it writes:
#  - the files hold --samples and --test-samples lines, and the reader
#    (test_libsvm -t test_file_from_env) reads each back whole: that many
#    samples, --nnz ascending keys each, 0/1 labels; gzip and gauss values too
#  - the same flags write the same bytes; another seed other bytes; a .gz
#    name the same text gzipped; the test file does not depend on --samples
#  - keys are spread over the whole 64-bit range; memory does not grow
#    with --samples
#  - the planted test AUC (stdout and --truth's JSON agree) is well above 0.5
#  - each bad flag: exit 2, one line on stderr, no file written
source "$(dirname "$0")/lib.sh"

G="$BIN/downpour gen-libsvm"
cd "$TMP"
gen() { $G --samples 3000 --test-samples 2000 --keys 100000 --nnz 8 "$@"; }

gen --out-train a.svm --out-test a-test.svm --seed 5 --truth a.json >a.out 2>a.err
rc=$?  # before the message's $(...) resets it
check "gen-libsvm exits 0 ($(head -c 200 a.err))" test "$rc" = 0
check "the training file has --samples lines" test "$(wc -l <a.svm)" = 3000
check "the test file has --test-samples lines" test "$(wc -l <a-test.svm)" = 2000
# read_back FILE N: the reader takes FILE whole, N samples of 8 features.
read_back() {
    DP_TEST_LIBSVM=$1 DP_TEST_LIBSVM_SAMPLES=$2 DP_TEST_LIBSVM_NNZ=8 \
        "$BIN/tests/test_libsvm" -t test_file_from_env >rb.log 2>&1 && tail -1 rb.log | grep -qx '1 passed, 0 failed'
}
check "the reader reads the training file back: 3000 samples of 8 ascending keys" read_back a.svm 3000
check "... and the test file: 2000" read_back a-test.svm 2000

auc=$(json a.json planted_test_auc)
check "the planted test AUC is well above 0.5 (got $auc)" ge "$auc" 0.75
check "... and stdout says the same" grep -qF "planted test AUC $(printf '%.6f' "$auc")" a.out
check "the truth names the samples" test "$(json a.json samples)" = 3000

gen --out-train b.svm --out-test b-test.svm --seed 5 >/dev/null 2>&1
check "same flags, same bytes (train)" cmp -s a.svm b.svm
check "same flags, same bytes (test)" cmp -s a-test.svm b-test.svm
gen --out-train c.svm --out-test c-test.svm --seed 6 >/dev/null 2>&1
check "another seed, other bytes" bash -c '! cmp -s a.svm c.svm && ! cmp -s a-test.svm c-test.svm'
$G --samples 100 --test-samples 2000 --keys 100000 --nnz 8 --seed 5 \
    --out-train d.svm --out-test d-test.svm >/dev/null 2>&1
check "the train and test files are different draws" bash -c '! cmp -s <(head -100 a.svm) <(head -100 a-test.svm)'
check "the test file does not depend on --samples" cmp -s a-test.svm d-test.svm
check "... and 100 samples are the first 100 of 3000" cmp -s d.svm <(head -100 a.svm)

gen --out-train g.svm.gz --out-test g-test.svm.gz --seed 5 >/dev/null 2>&1
check "a .gz name writes the same text gzipped" bash -c 'gzip -t g.svm.gz && zcat g.svm.gz | cmp -s - a.svm'
check "the reader reads the gzip file back" read_back g.svm.gz 3000
gen --out-train g2.svm.gz --out-test g2-test.svm.gz --seed 5 >/dev/null 2>&1
check "gzip output is deterministic too" cmp -s g.svm.gz g2.svm.gz

gen --out-train v.svm --out-test v-test.svm --seed 5 --values gauss --truth v.json >/dev/null 2>&1
check "--values gauss: read back" read_back v.svm 3000
check "--values gauss: negative values (binary has none)" grep -qE ':-[0-9]' v.svm
check "--values gauss: the planted AUC well above 0.5 ($(json v.json planted_test_auc))" \
    ge "$(json v.json planted_test_auc)" 0.75

# Streaming: the peak memory of 300000 training samples is that of 1000
# (the same test file), within 2 MiB.
maxrss() { "$TORCH_PY" -c '
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' $G --test-samples 2000 --keys 100000 --nnz 8 \
    --out-train m.svm --out-test m-test.svm "$@"; }
small=$(maxrss --samples 1000) big=$(maxrss --samples 300000)
check "memory does not grow with --samples ($small KiB for 1000, $big KiB for 300000)" \
    test -n "$small" -a -n "$big" -a "$((big - small))" -lt 2048
check "... and the 300000 lines were written" test "$(wc -l <m.svm)" = 300000
rm -f m.svm m-test.svm

# Keys over the whole range: of the distinct keys, some above 2^63 and some
# below 2^62 (a bijection of 100000 ranks, not the ranks themselves).
check "keys spread over the 64-bit range" "$TORCH_PY" -c '
import sys
keys = {int(t.split(":")[0]) for line in open("a.svm") for t in line.split()[1:]}
assert max(keys) > 2**63 and min(keys) < 2**62 and max(keys) < 2**64, (min(keys), max(keys))
assert len(keys) > 1000, len(keys)'

# refused NAME WANT ARGS...: exit 2, one line on stderr containing WANT,
# nothing on stdout, no file written.
refused() {
    local name=$1 want=$2; shift 2
    rm -f x.svm x-test.svm
    $G "$@" >out 2>err
    local rc=$?
    if [ $rc = 2 ] && [ "$(wc -l <err)" = 1 ] && [ ! -s out ] && grep -qF -- "$want" err &&
        [ ! -e x.svm ] && [ ! -e x-test.svm ]; then
        pass "$name"
    else
        fail "$name" "exit $rc, $(wc -l <err) line(s): $(head -c 300 err)"
    fi
}
o=(--out-train x.svm --out-test x-test.svm)
refused "unknown flag" "unknown flag '--bogus'" "${o[@]}" --bogus 1
refused "--samples 0" "--samples '0': expected an integer in [1, " "${o[@]}" --samples 0
refused "--samples 2x" "--samples '2x'" "${o[@]}" --samples 2x
refused "--test-samples -5" "--test-samples '-5'" "${o[@]}" --test-samples -5
refused "--keys 0" "--keys '0': expected an integer in [1, 2^64 - 1]" "${o[@]}" --keys 0
refused "--keys 2^64" "--keys '18446744073709551616'" "${o[@]}" --keys 18446744073709551616
refused "--nnz above --keys" "--nnz '20': more than --keys (10) distinct features" "${o[@]}" --keys 10 --nnz 20
refused "--nnz 0" "--nnz '0'" "${o[@]}" --nnz 0
refused "--zipf 11" "--zipf '11': expected a number in [0, 10]" "${o[@]}" --zipf 11
refused "--values foo" "--values" "${o[@]}" --values foo
refused "--signal -1" "--signal '-1'" "${o[@]}" --signal -1
refused "--seed -1" "--seed '-1'" "${o[@]}" --seed -1
refused "no --out-test" "--out-train FILE and --out-test FILE are required" --out-train x.svm
refused "the same file twice" "name the same file 'x.svm'" --out-train x.svm --out-test x.svm
refused "a stray argument" "" "${o[@]}" extra

$G --help >out 2>err
check "--help: exit 0, the flags on stdout" bash -c "[ $? = 0 ] && grep -qF -- '--zipf S' out && [ ! -s err ]"

# A file that cannot be written: one line, exit 1, and none of the files
# left behind (they are put in place only once all are written).
mkdir ro && chmod 555 ro
if [ "$(id -u)" = 0 ]; then d=/proc/self; else d=ro; fi
rm -f x.svm x-test.svm x.json
$G --out-train "$d/x.svm" --out-test x-test.svm >out 2>err
rc=$?
check "an unwritable --out-train: exit 1, one line ($(head -c 200 err))" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <err) = 1 ] && grep -qF '$d/x.svm' err && [ ! -e x-test.svm ]"
$G --out-train x.svm --out-test x-test.svm --truth "$d/x.json" >out 2>err
rc=$?
check "an unwritable --truth: exit 1, one line, no data file left ($(head -c 200 err))" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <err) = 1 ] && grep -qF '$d/x.json' err && [ ! -e x.svm ] && [ ! -e x-test.svm ]"
# The truth's write failing (a full disk, by util.h's hook) after both
# data files were written: none of the three is put in place.
DP_TEST_WRITE_FAIL=x.json $G --out-train x.svm --out-test x-test.svm --truth x.json >out 2>err
rc=$?
check "a write failing last: exit 1, one line, no file in place ($(head -c 200 err))" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <err) = 1 ] && [ ! -e x.svm ] && [ ! -e x-test.svm ] && [ ! -e x.json ]"
check "... nor a temporary file" bash -c '! ls | grep -q "\.tmp\."'
finish
