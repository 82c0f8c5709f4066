/* The one JSON entry point of every reader of untrusted JSON (config files, checkpoint indexes,
 * safetensors headers): exactly one JSON value, nothing cJSON accepts beyond the grammar.
 * cJSON alone takes text after the value, cuts strings at "\u0000" (a key "embed\u0000,w" became
 * "embed"), skips any control byte as a blank, and reads "01", "1." or "-.5" as numbers. Pure:
 * no I/O, no MPI, no logging; a refusal fills a message that starts with the byte offset. */
#ifndef RUNTIME_JSON_STRICT_H
#define RUNTIME_JSON_STRICT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "shardopt.h"

/* Every number is a non-negative integer written in plain digits ("0", "15"; not "-1", "2.0",
 * "1e3", "007"): the checkpoint index, which holds nothing else. */
#define JSON_STRICT_INTEGERS 1u
/* Numbers and duplicate keys are left to the caller, which refuses them after its own checks
 * with messages that name the field (safetensors headers). */
#define JSON_STRICT_CALLER_CHECKS 2u

/* Length of the valid UTF-8 sequence at s (1-4), or 0. Strict like Rust's str::from_utf8: no
 * overlongs, surrogates or code points past U+10FFFF. */
size_t json_strict_utf8_seq_len(const unsigned char *s, size_t n);

/* Parse text[0, len) as one JSON value followed only by JSON whitespace (space, tab, LF, CR).
 * text[len] must be readable and NUL (no cJSON version then reads past the text). Refused: a NUL
 * byte anywhere; invalid UTF-8; a control byte outside a string other than whitespace, or any
 * unescaped one inside; "\u0000" in any string, key or value; anything before the value other
 * than whitespace (a byte-order mark); a number outside JSON's grammar (leading zeros, "1.",
 * "-.5"); text after the value; a key twice in one object; nesting beyond cJSON's limit.
 * @param flags  JSON_STRICT_INTEGERS, JSON_STRICT_CALLER_CHECKS or 0
 * @param out    receives the tree (set only on success); the caller cJSON_Deletes it
 * @param err    receives "byte N: what" on a refusal, what could not be allocated otherwise
 * @return SHARDOPT_OK, SHARDOPT_ERR_CORRUPT (not strict JSON) or SHARDOPT_ERR_OUT_OF_MEMORY */
shardopt_status_t json_strict_parse(const char *text, size_t len, unsigned flags, cJSON **out,
                                    char *err, size_t errlen);

#endif
