/* hello-c-wasm: a freestanding C function (no libc). It greets the request body and
 * counts the visits of its session with a strong read-modify-write:
 * "hello, ann! visit 3". Build: make (needs clang and wasm-ld). */
#include <stdint.h>

#include "skiff.h"

#define KEY ((const uint8_t *)"visits")
#define KEY_LEN 6

static uint8_t input[1024];
static uint8_t output[sizeof input + 64];

static int32_t put(int32_t at, const uint8_t *s, int32_t n) {
    for (int32_t i = 0; i < n && at < (int32_t)sizeof output; i++)
        output[at++] = s[i];
    return at;
}

static int32_t put_str(int32_t at, const char *s) {
    int32_t n = 0;
    while (s[n])
        n++;
    return put(at, (const uint8_t *)s, n);
}

/* Decimal text of `n` into `buf` (at least 20 bytes); returns its length. */
static int32_t format_u64(uint64_t n, uint8_t *buf) {
    uint8_t digits[20];
    int32_t len = 0;
    do {
        digits[len++] = (uint8_t)('0' + n % 10);
        n /= 10;
    } while (n);
    for (int32_t i = 0; i < len; i++)
        buf[i] = digits[len - 1 - i];
    return len;
}

static uint64_t parse_u64(const uint8_t *buf, int32_t len) {
    uint64_t n = 0;
    for (int32_t i = 0; i < len && buf[i] >= '0' && buf[i] <= '9'; i++)
        n = n * 10 + (uint64_t)(buf[i] - '0');
    return n;
}

/* The new visit count, or a negative skiff error code. */
static int64_t count_visit(void) {
    uint8_t num[20];
    for (;;) {
        int32_t len = skiff_read_state(KEY, KEY_LEN, num, sizeof num, SKIFF_STRONG);
        if (len < SKIFF_ABSENT)
            return len;
        /* Absent, or something longer than a count: start over from 0. */
        uint64_t visits = len >= 0 && len <= (int32_t)sizeof num ? parse_u64(num, len) : 0;
        visits++;
        int32_t rc = skiff_write_state(KEY, KEY_LEN, num, format_u64(visits, num), SKIFF_STRONG);
        if (rc == SKIFF_OK)
            return (int64_t)visits;
        if (rc != SKIFF_ERR_CONFLICT)
            return rc;
        /* Another request of this session changed the count first: read it again. */
    }
}

void handle(void) {
    int32_t n = skiff_read_input(input, sizeof input);
    while (n > 0 && (input[n - 1] == '\n' || input[n - 1] == '\r'))
        n--;
    int32_t at = put_str(0, "hello, ");
    at = n > 0 ? put(at, input, n) : put_str(at, "world");
    int64_t visits = count_visit();
    if (visits < 0) {
        at = put_str(at, "! (state error)");
    } else {
        uint8_t num[20];
        at = put_str(at, "! visit ");
        at = put(at, num, format_u64((uint64_t)visits, num));
    }
    skiff_set_output(output, at);
}
