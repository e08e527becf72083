/* bf16_emulated: the "emulated" bf16 path (bf16_ops.h) and the choice of
 * the table `--precision bf16` runs on the CPU.
 *
 * The emulated path rounds each pass's operands to bf16 (common/bf16.h's
 * dp_bf16_round) into per-thread scratch and calls the fast fp32 kernel
 * (ops.h) on the copies: a product of two bf16 values is exact in fp32,
 * so the results are a bf16 kernel's with fp32 sums, on any CPU. Which
 * operands each pass rounds: forward in and w; the input gradient dout
 * and w; the weight gradient dout and in; the bias and its gradient are
 * fp32 sums of the fp32 values. Slower than fp32 (the copies): a test
 * hook's path, never chosen for a user. */
#ifndef DP_CPU_BF16_EMULATED_H
#define DP_CPU_BF16_EMULATED_H

#include "kernels/cpu/bf16_ops.h"

extern const dp_bf16_ops_t dp_bf16_emulated;

/* The table --precision bf16 runs on this CPU: dp_bf16_ops_native, except
 * under the test hook DP_TEST_BF16=emulated (read here only), which picks
 * dp_bf16_emulated. NULL with one line in why (DP_ERR_LEN) where neither. */
const dp_bf16_ops_t *dp_bf16_ops_select(char *why);

#endif
