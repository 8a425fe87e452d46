/* http_buf.c - a growing byte buffer for response bodies and metrics text.
 * Growth doubles (amortized O(1) a byte); an allocation failure sticks in
 * `oom` so a formatter checks once at the end instead of after every line. */
#include <stdio.h>
#include <string.h>

#include "engine/serve/http_impl.h"
#include "mem.h"

/* Room for n more bytes and a NUL. */
static bool http_buf_reserve(struct http_buf *b, size_t n) {
    if (b->oom)
        return false;
    if (b->n + n + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1)
        cap *= 2;
    char *p = mem_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void http_buf_add(struct http_buf *b, const void *s, size_t n) {
    if (!http_buf_reserve(b, n))
        return;
    if (n) /* s may be NULL then */
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void http_buf_puts(struct http_buf *b, const char *s) {
    http_buf_add(b, s, strlen(s));
}

void http_buf_printf(struct http_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !http_buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void http_buf_free(struct http_buf *b) {
    mem_free(b->p);
    *b = (struct http_buf){0};
}
