/* checksum: ISA-L's CRCs behind the project's two names. */
#include "common/checksum.h"

#include <isa-l/crc.h>

/* ISA-L's AVX-512 CRC code returns with the upper halves of the vector
 * registers dirty (no vzeroupper). Until something clears them, every
 * legacy-SSE instruction after it runs several times slower: measured here,
 * the optimizer's sweep over 1.66 M floats took 8.2 ms after a CRC instead
 * of 1.0. So each call clears them, where the CPU has AVX at all (without
 * AVX, ISA-L took no AVX path and there is nothing to clear). */
__attribute__((target("avx"))) static void s_vzeroupper(void)
{
    __builtin_ia32_vzeroupper();
}

static void s_clean_vector_state(void)
{
    if (__builtin_cpu_supports("avx")) s_vzeroupper();
}

uint32_t dp_crc32(uint32_t crc, const void *data, size_t n)
{
    uint32_t c = crc32_gzip_refl(crc, data, n);
    s_clean_vector_state();
    return c;
}

uint32_t dp_crc32c(uint32_t crc, const void *data, size_t n)
{
    /* the iSCSI CRC takes and returns the raw register (no inversions) and
     * an int length */
    const unsigned char *p = data;
    uint32_t reg = ~crc;
    while (n > 0) {
        int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
        reg = crc32_iscsi((unsigned char *)p, chunk, reg);
        p += chunk;
        n -= (size_t)chunk;
    }
    s_clean_vector_state();
    return ~reg;
}
