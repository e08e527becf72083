/* checksum: the two CRCs the project uses, computed by ISA-L (Intel's
 * storage library: carry-less-multiply SIMD, ~13x zlib's own CRC-32 here).
 *
 *   dp_crc32   zlib's CRC-32 (IEEE, reflected): the wire's tensor frames
 *   dp_crc32c  CRC-32C (Castagnoli): TensorBoard's TFRecord framing
 *
 * Both chain: f(f(0, a, na), b, nb) is the CRC of a followed by b. */
#ifndef DP_CHECKSUM_H
#define DP_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* dp_crc32(0, "123456789", 9) == 0xCBF43926 (zlib's crc32). */
uint32_t dp_crc32(uint32_t crc, const void *data, size_t n);
/* dp_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t dp_crc32c(uint32_t crc, const void *data, size_t n);

#endif
