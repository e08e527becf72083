/* fuzz_wire: bytes from a fuzzer into the envelope decoder and validator
 * (proto/wire.h), the code every byte from the network goes through first.
 *
 * Input layout: byte 0 = number of tensor frames (mod 5); bytes 1-2 = the
 * envelope's length L (little-endian); the next L bytes = frame 0; the rest
 * split evenly into the tensor frames. Whatever the bytes, the decoder and
 * validator must return (never crash, never read out of bounds), and when
 * dp_wire_check accepts a message its invariants must really hold.
 *
 * With libFuzzer: `make fuzz` builds it with clang -fsanitize=fuzzer,address,
 * undefined -DDP_LIBFUZZER and runs it for FUZZ_SECONDS from a seed corpus that
 * this program writes (`fuzz_wire --write-seeds DIR`: the valid messages below).
 * Built by the normal Makefile with gcc, main() runs a few thousand random and
 * mutated inputs (seeded, reproducible) and prints "N passed, N failed". */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "proto/wire.h"

static int s_violations; /* accepted messages whose invariants do not hold */
static int s_accepted;   /* inputs dp_wire_check accepted */

static void s_violation(const char *what)
{
    fprintf(stderr, "fuzz_wire: invariant violated: %s\n", what);
    s_violations++;
#ifdef DP_LIBFUZZER
    abort();
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    int k = data[0] % 5;
    size_t len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (len > size) len = size;
    const uint8_t *env_bytes = data;
    const uint8_t *rest = data + len;
    size_t rest_n = size - len;
    dp_wire_frame_t frames[5];
    size_t each = k ? rest_n / (size_t)k : 0;
    for (int i = 0; i < k; i++) {
        frames[i].data = rest + (size_t)i * each;
        frames[i].len = each;
    }
    char err[DP_ERR_LEN];
    Downpour__Envelope *env = dp_wire_decode(env_bytes, len, err);
    if (!env) {
        if (strncmp(err, "malformed: ", 11) != 0) s_violation("decode error without 'malformed: '");
        return 0;
    }
    if (dp_wire_check(env, frames, k, err) == 0) {
        s_accepted++;
        if (env->protocol_version != DP_PROTOCOL_VERSION) s_violation("accepted a wrong version");
        if ((int)env->type < 1 || (int)env->type > DOWNPOUR__MSG_TYPE__ROWS_PUSH)
            s_violation("accepted an unknown type");
        bool rows_msg = env->type == DOWNPOUR__MSG_TYPE__ROWS_PULL ||
                        env->type == DOWNPOUR__MSG_TYPE__ROWS || env->type == DOWNPOUR__MSG_TYPE__ROWS_PUSH;
        bool compressed = env->push && env->push->compression != DOWNPOUR__COMPRESSION__COMPRESS_NONE;
        /* tensors in shared memory or in the device region: no frames at
         * all; else one per descriptor */
        if (env->shm || env->devregion ? k != 0 : env->n_tensors != (size_t)k)
            s_violation("accepted a frame count mismatch");
        if (env->devregion && (env->shm || (env->type != DOWNPOUR__MSG_TYPE__PULL &&
                                            env->type != DOWNPOUR__MSG_TYPE__PARAMS &&
                                            env->type != DOWNPOUR__MSG_TYPE__PUSH)))
            s_violation("accepted a device region where none may be");
        for (size_t i = 0; i < env->n_tensors && i < (size_t)k; i++) {
            const Downpour__TensorDesc *d = env->tensors[i];
            if (d->byte_length != frames[i].len) s_violation("accepted a byte length mismatch");
            bool keys = d->dtype == DOWNPOUR__DTYPE__UINT64;
            bool coded = d->dtype == DOWNPOUR__DTYPE__UINT32 || d->dtype == DOWNPOUR__DTYPE__BIT;
            if (keys ? !rows_msg
                     : coded ? !compressed
                             : d->dtype != DOWNPOUR__DTYPE__FLOAT32 && d->dtype != DOWNPOUR__DTYPE__BFLOAT16)
                s_violation("accepted a bad dtype");
            if (d->dtype != DOWNPOUR__DTYPE__BIT &&
                dp_wire_desc_count(d) * dp_wire_dtype_size(d->dtype) != d->byte_length)
                s_violation("accepted a byte length that is not whole elements");
            if (d->checksum != DOWNPOUR__CHECKSUM__CRC32 && d->checksum != DOWNPOUR__CHECKSUM__NO_CHECKSUM)
                s_violation("accepted an unknown checksum kind");
            if (d->checksum == DOWNPOUR__CHECKSUM__CRC32 &&
                dp_wire_crc32(frames[i].data, frames[i].len) != d->crc32)
                s_violation("accepted a bad checksum");
        }
        if (env->pull) {
            if (env->pull->n_cuts >= DP_WIRE_MAX_PULL_PARTS) s_violation("accepted too many PULL cuts");
            for (size_t c = 1; c < env->pull->n_cuts; c++)
                if (env->pull->cuts[c] <= env->pull->cuts[c - 1])
                    s_violation("accepted PULL cuts not strictly ascending");
        }
        /* a scan names no keys and a bounded page; a page's keys and rows agree */
        if (env->rows_pull && env->rows_pull->scan &&
            (env->n_tensors != 0 || env->rows_pull->scan->max_keys < 1 ||
             env->rows_pull->scan->max_keys > DP_WIRE_MAX_ROW_KEYS))
            s_violation("accepted a scan with keys or an unbounded page");
        if (env->rows && env->n_tensors == 2 && env->tensors[0]->shape[0] != env->tensors[1]->shape[0])
            s_violation("accepted a page whose keys and rows differ in number");
        if (env->rows && env->rows->more && (env->n_tensors != 2 || env->tensors[0]->shape[0] < 1))
            s_violation("accepted a page that says more follow without a key");
        /* a row request's key count is what its frame holds: the count a
         * shard checks against max_keys before it sizes anything by it
         * (server/core/ps_rows.c) is bounded by the bytes it received */
        bool keyed = (env->rows_pull && !env->rows_pull->scan) || env->rows_push;
        if (keyed && (k < 1 || (uint64_t)env->tensors[0]->shape[0] * 8 != frames[0].len))
            s_violation("accepted a row request whose key count is not its frame's");
        if (env->rows_push && (k != 2 || env->tensors[1]->shape[0] != env->tensors[0]->shape[0] ||
                               env->tensors[1]->shape[1] != (int64_t)env->rows_push->width))
            s_violation("accepted a row push whose gradients are not its keys' rows");
        if (env->params && (dp_wire_params_parts(env->params) > DP_WIRE_MAX_PULL_PARTS ||
                            env->params->part >= dp_wire_params_parts(env->params)))
            s_violation("accepted a PARAMS part outside its parts");
        /* What a receiver does next must be safe on anything check accepted. */
        dp_wire_check_range(env, 0, 1u << 20, err);
        dp_wire_check_range(env, 100, 50, err); /* nonsense range: must not misbehave */
        dp_wire_check_finite(frames, k, err);
        static float copy[1 << 14];
        static uint16_t half[1 << 14];
        for (int i = 0; i < k; i++) {
            size_t n = frames[i].len / 4 < (1u << 14) ? frames[i].len / 4 : (1u << 14);
            if ((dp_wire_any_nonfinite(frames[i].data, n) != 0) !=
                (dp_wire_copy_finite(copy, frames[i].data, n, err) != 0))
                s_violation("the finite check and the copy-and-check disagree");
            dp_wire_to_bf16(half, copy, n); /* any bits, any alignment: must not misbehave */
            dp_wire_from_bf16(copy, frames[i].data, frames[i].len / 2 < n ? frames[i].len / 2 : n);
        }
    } else if (strncmp(err, "malformed: ", 11) != 0) {
        s_violation("check error without 'malformed: '");
    }
    dp_wire_destroy(&env);
    return 0;
}

#ifndef DP_LIBFUZZER
/* Valid messages to mutate: a PUSH with k frames, a HELLO, a PULL, an
 * ERROR, a ROWS_PULL scan (the chief's read of a shard's table) and its
 * page (ROWS: 16 keys, then their rows of width 2, 128 bytes each), a
 * ROWS_PULL of 16 keys (more than a shard of max_keys 8 takes) and a
 * ROWS_PUSH of their rows (at step 3, and at 2^62: what a shard refuses
 * past the wire; issue 55), and a whole dense PUSH through the device
 * region (its descriptor naming the worker's slot, no frames: the input
 * that showed this program's frame rule older than the wire's). */
#define S_KINDS 9
static size_t s_seed(uint8_t *out, size_t cap, int which, dp_rng_t *r)
{
    static float t[64];
    for (int i = 0; i < 64; i++) t[i] = dp_rng_uniform(r) - 0.5f;
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, dp_rng_next(r), 1, dp_rng_next(r));
    Downpour__Push push = DOWNPOUR__PUSH__INIT;
    Downpour__Hello hello = DOWNPOUR__HELLO__INIT;
    Downpour__Pull pull = DOWNPOUR__PULL__INIT;
    Downpour__Error error = DOWNPOUR__ERROR__INIT;
    Downpour__RowsPull rows_pull = DOWNPOUR__ROWS_PULL__INIT;
    Downpour__RowsScan scan = DOWNPOUR__ROWS_SCAN__INIT;
    Downpour__Rows rows = DOWNPOUR__ROWS__INIT;
    Downpour__RowsPush rows_push = DOWNPOUR__ROWS_PUSH__INIT;
    Downpour__TensorDesc d[2];
    Downpour__TensorDesc *dv[2] = {&d[0], &d[1]};
    int64_t sh[2][2];
    int k = 0;
    switch (which % S_KINDS) {
    case 0:
        k = 1 + (int)dp_rng_below(r, 2);
        env.push = &push;
        dp_wire_desc_fill(&d[0], sh[0], "params", t, 32, 0, 0, 0);
        dp_wire_desc_fill(&d[1], sh[1], "params", t + 32, 32, 32, 0, 0);
        if (which >= S_KINDS) dp_wire_desc_no_checksum(&d[1]); /* a sender on this host */
        env.n_tensors = (size_t)k;
        env.tensors = dv;
        break;
    case 1:
        env.type = DOWNPOUR__MSG_TYPE__HELLO;
        hello.model_spec = (char *)"conv5x5:32 relu maxpool2 fc:10 softmax";
        hello.in_c = 1;
        hello.in_h = hello.in_w = 28;
        env.hello = &hello;
        break;
    case 2:
        env.type = DOWNPOUR__MSG_TYPE__PULL;
        pull.min_version = 3;
        if (which >= S_KINDS) { /* a pull in parts */
            static uint64_t cuts[3] = {10, 200, 4000};
            pull.n_cuts = 3;
            pull.cuts = cuts;
        }
        env.pull = &pull;
        break;
    case 3:
        env.type = DOWNPOUR__MSG_TYPE__ERROR;
        error.message = "model mismatch";
        env.error = &error;
        break;
    case 4:
        env.type = DOWNPOUR__MSG_TYPE__ROWS_PULL;
        rows_pull.width = 2;
        scan.from = which >= S_KINDS ? 0x9E3779B97F4A7C15ull : 0;
        scan.max_keys = which >= S_KINDS ? 65536 : 7;
        rows_pull.scan = &scan;
        env.rows_pull = &rows_pull;
        break;
    case 6:
        k = 1;
        env.type = DOWNPOUR__MSG_TYPE__ROWS_PULL;
        rows_pull.width = which >= S_KINDS ? 4096 : 2;
        env.rows_pull = &rows_pull;
        dp_wire_desc_keyed(&d[0], sh[0], "keys", DOWNPOUR__DTYPE__UINT64, t, 16, 0);
        env.n_tensors = 1;
        env.tensors = dv;
        break;
    case 7:
        k = 2;
        env.type = DOWNPOUR__MSG_TYPE__ROWS_PUSH;
        rows_push.version = 4;
        rows_push.step = which >= S_KINDS ? 1ull << 62 : 3;
        rows_push.width = 2;
        env.rows_push = &rows_push;
        dp_wire_desc_keyed(&d[0], sh[0], "keys", DOWNPOUR__DTYPE__UINT64, t, 16, 0);
        dp_wire_desc_keyed(&d[1], sh[1], "grads", DOWNPOUR__DTYPE__FLOAT32, t + 32, 16, 2);
        env.n_tensors = 2;
        env.tensors = dv;
        break;
    case 8:
        env.push = &push;
        env.devregion = 1;
        dp_wire_desc_fill(&d[0], sh[0], "params", t, 32, 0, 0, 0);
        env.n_tensors = 1;
        env.tensors = dv;
        break;
    default:
        k = 2;
        env.type = DOWNPOUR__MSG_TYPE__ROWS;
        rows.version = 5;
        rows.held = 16;
        rows.more = which < S_KINDS;
        rows.init = 0.01f;
        rows.seed = 7;
        env.rows = &rows;
        dp_wire_desc_keyed(&d[0], sh[0], "keys", DOWNPOUR__DTYPE__UINT64, t, 16, 0);
        dp_wire_desc_keyed(&d[1], sh[1], "rows", DOWNPOUR__DTYPE__FLOAT32, t + 32, 16, 2);
        env.n_tensors = 2;
        env.tensors = dv;
        break;
    }
    size_t len = downpour__envelope__get_packed_size(&env);
    if (3 + len + (size_t)k * 128 > cap) return 0;
    out[0] = (uint8_t)k;
    out[1] = (uint8_t)(len & 0xff);
    out[2] = (uint8_t)(len >> 8);
    downpour__envelope__pack(&env, out + 3);
    memcpy(out + 3 + len, t, (size_t)k * 128);
    return 3 + len + (size_t)k * 128;
}

/* The seed corpus for libFuzzer: one file per valid message kind. */
static int s_write_seeds(const char *dir)
{
    dp_rng_t r;
    dp_rng_seed(&r, 12345);
    static uint8_t buf[8192];
    char path[4096], err[DP_ERR_LEN];
    for (int w = 0; w < 2 * S_KINDS; w++) {
        size_t n = s_seed(buf, sizeof buf, w, &r);
        snprintf(path, sizeof path, "%s/seed-%d", dir, w);
        if (dp_write_file_atomic(path, buf, n, err) != 0) {
            fprintf(stderr, "fuzz_wire: %s\n", err);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return s_write_seeds(argv[2]);
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    dp_rng_t r;
    dp_rng_seed(&r, 12345);
    static uint8_t buf[8192];
    /* Two tests: the valid seeds are accepted; no mutated input breaks an
     * invariant (each input is not a test of its own). */
    int passed = 0, failed = 0, seeds_ok = 0, bad_inputs = 0;
    /* Unmutated seeds must all be accepted: the fuzzer starts from valid input. */
    for (int w = 0; w < 2 * S_KINDS; w++) {
        size_t n = s_seed(buf, sizeof buf, w, &r);
        int before = s_accepted;
        LLVMFuzzerTestOneInput(buf, n);
        if (s_accepted == before + 1) seeds_ok++;
    }
    if (seeds_ok == 2 * S_KINDS) passed++;
    else {
        fprintf(stderr, "fuzz_wire: only %d of %d valid seeds accepted\n", seeds_ok, 2 * S_KINDS);
        failed++;
    }
    for (int it = 0; it < iters; it++) {
        size_t n;
        if (it % 4 == 0) { /* pure noise */
            n = 3 + dp_rng_below(&r, 600);
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)dp_rng_next(&r);
        } else { /* a valid message with a few mutations */
            n = s_seed(buf, sizeof buf, (int)dp_rng_below(&r, S_KINDS), &r);
            int muts = 1 + (int)dp_rng_below(&r, 4);
            for (int m = 0; m < muts && n > 3; m++) {
                size_t at = 3 + dp_rng_below(&r, (uint32_t)(n - 3));
                switch (dp_rng_below(&r, 5)) {
                case 0: buf[at] ^= (uint8_t)(1u << dp_rng_below(&r, 8)); break;  /* bit flip */
                case 1: buf[at] = (uint8_t)dp_rng_next(&r); break;              /* byte */
                case 2: n = at; break;                                           /* truncate */
                case 3: buf[0] = (uint8_t)dp_rng_next(&r); break;                /* frame count */
                default: buf[at] = 0xff; break;                                  /* varint bomb */
                }
            }
        }
        int before = s_violations;
        LLVMFuzzerTestOneInput(buf, n);
        bad_inputs += s_violations != before;
    }
    fprintf(stderr, "fuzz_wire: %d inputs, %d accepted by the validator, %d broke an invariant\n",
            iters, s_accepted, bad_inputs);
    if (bad_inputs) failed++;
    else passed++;
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif
