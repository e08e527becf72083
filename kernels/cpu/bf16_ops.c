/* bf16_ops: which native bf16 path this CPU runs (bf16_ops.h). */
#include "kernels/cpu/bf16_ops.h"

#include <stdio.h>

#include "common/util.h"

const dp_bf16_ops_t *dp_bf16_ops_native(char *why)
{
    /* No native path is built yet: every CPU gets the refusal. */
    snprintf(why, DP_ERR_LEN, "bf16 needs AVX512_BF16 or AMX; this CPU has neither");
    return NULL;
}
