/* sched_stop.c - stop strings matched on the streamed text, across tokens.
 *
 * The text so far is split into released bytes (already streamed) and a held
 * tail H. Invariant: H is the longest suffix of the text that is a proper
 * prefix of some stop string, and no stop string occurs in the text. On each
 * push the window W = H ++ piece is built in the caller's out buffer (so no
 * allocation happens per token) and searched:
 *   - a stop string occurring in W: the earliest occurrence wins, W before it
 *     is released and the match reported. No occurrence can start before W:
 *     its part in the old text would be a suffix that is a prefix of a stop
 *     string, longer than H;
 *   - else the longest suffix of W that is a proper prefix of a stop string
 *     becomes the new H and the rest of W is released.
 * Naive search, O(|W| * sum of stop lengths) per push: with at most 8 stop
 * strings of 128 bytes and |W| <= 127 + piece, a few thousand compares for
 * typical stops (1-10 bytes); Aho-Corasick would make it O(|W|) but is not
 * worth its code at these sizes.
 */
#include <errno.h>
#include <string.h>

#include "engine/core/sched.h"
#include "mem.h"

int sched_stop_init(struct sched_stop *m, const char *const *stops, uint32_t n) {
    memset(m, 0, sizeof(*m));
    if (n > SCHED_STOP_MAX_N || (n > 0 && !stops))
        return -EINVAL;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!stops[i])
            return -EINVAL;
        size_t l = strnlen(stops[i], SCHED_STOP_MAX_BYTES + 1);
        if (l == 0 || l > SCHED_STOP_MAX_BYTES)
            return -EINVAL;
        m->len[i] = (uint32_t)l;
        if (l > m->max_len)
            m->max_len = (uint32_t)l;
        total += l;
    }
    if (n == 0)
        return 0;
    m->mem = mem_alloc(MEM_SCHED, total + m->max_len);
    if (!m->mem) {
        memset(m, 0, sizeof(*m));
        return -ENOMEM;
    }
    char *p = m->mem;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(p, stops[i], m->len[i]);
        m->str[i] = p;
        p += m->len[i];
    }
    m->held = p;
    m->n = n;
    return 0;
}

void sched_stop_fini(struct sched_stop *m) {
    mem_free(m->mem);
    memset(m, 0, sizeof(*m));
}

/* Earliest start of a stop string in w[0..n), or n when none occurs. */
static size_t stop_find(const struct sched_stop *m, const char *w, size_t n) {
    size_t best = n;
    for (uint32_t i = 0; i < m->n; i++) {
        size_t l = m->len[i];
        for (size_t at = 0; at + l <= n && at < best; at++) {
            if (memcmp(w + at, m->str[i], l) == 0) {
                best = at;
                break;
            }
        }
    }
    return best;
}

/* Length of the longest suffix of w[0..n) that is a proper prefix of a stop
 * string (0 when none). */
static size_t stop_tail(const struct sched_stop *m, const char *w, size_t n) {
    size_t k = m->max_len - 1 < n ? m->max_len - 1 : n;
    for (; k > 0; k--) {
        for (uint32_t i = 0; i < m->n; i++) {
            if (k < m->len[i] && memcmp(w + n - k, m->str[i], k) == 0)
                return k;
        }
    }
    return 0;
}

int sched_stop_push(struct sched_stop *m, const char *piece, size_t len, char *out, size_t cap,
                    size_t *n_out, bool *matched) {
    size_t n = m->n_held + len;
    *matched = false;
    if (cap < n) {
        *n_out = 0;
        return -ENOSPC;
    }
    if (m->n_held)
        memcpy(out, m->held, m->n_held);
    if (len)
        memcpy(out + m->n_held, piece, len);
    m->n_held = 0;
    if (m->n == 0) {
        *n_out = n;
        return 0;
    }
    size_t at = stop_find(m, out, n);
    if (at < n) {
        *matched = true;
        *n_out = at;
        return 0;
    }
    size_t k = stop_tail(m, out, n);
    if (k)
        memcpy(m->held, out + n - k, k);
    m->n_held = (uint32_t)k;
    *n_out = n - k;
    return 0;
}

size_t sched_stop_flush(struct sched_stop *m, char *out, size_t cap) {
    size_t k = m->n_held < cap ? m->n_held : cap;
    if (k)
        memcpy(out, m->held, k);
    m->n_held = 0;
    return k;
}
