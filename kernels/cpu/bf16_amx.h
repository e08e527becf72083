/* bf16_amx: the bf16 convolution and fc passes on Intel AMX tiles
 * (Sapphire Rapids and later): TDPBF16PS on 16x32 bf16 tiles into 16x16
 * fp32 tiles. The table's meaning is bf16_ops.h's; the kernel itself is
 * bf16_amx_body.h, which tests/unit/test_bf16_amx.c also compiles against
 * a scalar model of the tile instructions, so its packing, tiling and tails
 * are tested on CPUs without AMX. */
#ifndef DP_CPU_BF16_AMX_H
#define DP_CPU_BF16_AMX_H

#include "kernels/cpu/bf16_ops.h"

/* The "amx" path (x86-64 builds only). Only after dp_bf16_amx_enable has
 * returned 0 in this process: a tile instruction before it is SIGILL. */
#if defined(__x86_64__)
extern const dp_bf16_ops_t dp_bf16_amx;
#endif

/* Whether this CPU and kernel run AMX-BF16, and if so Linux's permission
 * for the tile data (per process, needed before the first tile
 * instruction in any thread; asking again is harmless): 0, or -1 with one
 * line in why (DP_ERR_LEN) naming what is missing or the errno. */
int dp_bf16_amx_enable(char *why);

#endif
