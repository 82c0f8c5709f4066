/* CRC-32C (Castagnoli) through Intel's ISA-L (Debian libisal-dev): crc32_iscsi picks, once per
 * process, the widest code the CPU runs (carry-less multiply folding, AVX-512 where present, the
 * crc32 instruction, tables otherwise). The combining below is ours: ISA-L has none. */
#include "crc32c.h"

#include <isa-l/crc.h>
#include <limits.h>

/* crc32_iscsi's length is an int, so longer buffers go through in pieces that stay well inside
 * it (a multiple of 64 bytes keeps every piece but the last on its whole-block path). */
#define CRC32C_PIECE ((size_t)1 << 30)

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
    /* crc32_iscsi takes and returns the raw register: its init is not inverted on entry nor the
     * result on exit, so the standard CRC is ~crc32_iscsi(buf, len, ~0). Chaining through the
     * raw register is what makes crc32c_update(crc, ...) extend crc as zlib's crc32() does. */
    const unsigned char *p = buf;
    uint32_t r = ~crc;
    while (len > 0) {
        size_t n = len < CRC32C_PIECE ? len : CRC32C_PIECE;
        /* the buffer is only read; the prototype lacks the const */
        r = crc32_iscsi((unsigned char *)p, (int)n, r);
        p += n;
        len -= n;
    }
    return ~r;
}

/* ---- combining: appending len zero bytes is a linear map on the CRC register; square it up ----
 */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1)
            sum ^= mat[i];
    return sum;
}

static void gf2_square(uint32_t *out, const uint32_t *mat)
{
    for (int i = 0; i < 32; i++)
        out[i] = gf2_times(mat, mat[i]);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    uint32_t even[32], odd[32];

    if (len_b == 0)
        return crc_a;
    /* the operator for one zero bit, then two, four, ... */
    odd[0] = 0x82F63B78u;
    for (int i = 1; i < 32; i++)
        odd[i] = 1u << (i - 1);
    gf2_square(even, odd); /* 2 bits */
    gf2_square(odd, even); /* 4 bits */
    do {
        gf2_square(even, odd); /* first pass: one byte */
        if (len_b & 1)
            crc_a = gf2_times(even, crc_a);
        len_b >>= 1;
        if (len_b == 0)
            break;
        gf2_square(odd, even);
        if (len_b & 1)
            crc_a = gf2_times(odd, crc_a);
        len_b >>= 1;
    } while (len_b != 0);
    return crc_a ^ crc_b;
}
