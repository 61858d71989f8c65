/* skiff.h: skiff's wasm guest API, the import module "skiff".
 *
 * A function is a wasm module that exports `memory` and `void handle(void)`; it may
 * export more functions of the same signature as session hooks (`key: wasm:NAME`).
 * Pointers and lengths are i32 offsets into the module's exported memory.
 *
 * State is per session. Mode SKIFF_WEAK reads or writes the latest value with no
 * coordination. A SKIFF_STRONG read opens an atomic read-modify-write on its key that
 * a SKIFF_STRONG write of that key commits; one left open when `handle` returns is
 * released. On SKIFF_ERR_CONFLICT, redo the read-modify-write from the strong read.
 */
#ifndef SKIFF_H
#define SKIFF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SKIFF_IMPORT(name) __attribute__((import_module("skiff"), import_name(name)))

/* Modes of read_state and write_state. */
#define SKIFF_WEAK 0
#define SKIFF_STRONG 1

/* Return codes. Lengths and counts are >= 0. */
#define SKIFF_OK 0
#define SKIFF_ABSENT (-1)          /* no such key or published value */
#define SKIFF_ERR_CONFLICT (-2)    /* the key changed since the strong read: retry */
#define SKIFF_ERR_LOCK_TIMEOUT (-3) /* the key's lock was not granted in time */
#define SKIFF_ERR_UNAVAILABLE (-4) /* the session's state cannot be reached */
#define SKIFF_ERR_BAD_ARGUMENT (-5) /* pointer out of bounds, key too long or reserved */

/* The request body's length in bytes. */
SKIFF_IMPORT("input_len") int32_t skiff_input_len(void);

/* Copies up to `len` bytes of the request body to `buf`; returns the bytes copied. */
SKIFF_IMPORT("read_input") int32_t skiff_read_input(uint8_t *buf, int32_t len);

/* Sets the response body (status 200); returns SKIFF_OK. */
SKIFF_IMPORT("set_output") int32_t skiff_set_output(const uint8_t *buf, int32_t len);

/* Copies up to `buf_len` bytes of `key`'s value to `buf`. Returns the value's full
 * length, which may exceed `buf_len` (then read again with a bigger buffer), or
 * SKIFF_ABSENT, or an error. Keys must not start with a 0 byte (reserved). */
SKIFF_IMPORT("read_state")
int32_t skiff_read_state(const uint8_t *key, int32_t key_len, uint8_t *buf, int32_t buf_len,
                         int32_t mode);

/* Sets `key` to `val`; returns SKIFF_OK or an error (SKIFF_ERR_CONFLICT in strong mode
 * when the key changed since the strong read). */
SKIFF_IMPORT("write_state")
int32_t skiff_write_state(const uint8_t *key, int32_t key_len, const uint8_t *val,
                          int32_t val_len, int32_t mode);

/* Removes `key`; returns 1 if it existed, 0 if not, or an error. */
SKIFF_IMPORT("delete_state") int32_t skiff_delete_state(const uint8_t *key, int32_t key_len);

/* Publishes `val` under `name` for other sessions to read; returns SKIFF_OK or an error. */
SKIFF_IMPORT("publish")
int32_t skiff_publish(const uint8_t *name, int32_t name_len, const uint8_t *val,
                      int32_t val_len);

/* Reads the value published under `name` by the session at address `addr`; same
 * length convention as skiff_read_state, SKIFF_ABSENT when absent. */
SKIFF_IMPORT("read_published")
int32_t skiff_read_published(const uint8_t *addr, int32_t addr_len, const uint8_t *name,
                             int32_t name_len, uint8_t *buf, int32_t buf_len);

#undef SKIFF_IMPORT

#ifdef __cplusplus
}
#endif

#endif /* SKIFF_H */
