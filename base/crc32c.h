/* CRC-32C (Castagnoli), the checksum the checkpoint index records per tensor. Pure: no I/O. */
#ifndef BASE_CRC32C_H
#define BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc with len bytes at buf and return the new CRC; chains like zlib's crc32():
 * crc32c_update(0, a, n) is the CRC-32C of a, and crc32c_update(crc32c_update(0, a, n), b, m) is
 * the CRC-32C of a followed by b. buf may be NULL when len is 0. ISA-L's crc32_iscsi, which uses
 * the fastest code the CPU runs; any length. Thread-safe. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);

/* The CRC-32C of a||b from crc_a = CRC(a), crc_b = CRC(b) and len_b = |b|, without b's bytes:
 * a checkpoint derives a tensor's CRC from its blocks' CRCs (zlib's crc32_combine method). */
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif
