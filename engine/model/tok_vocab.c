/* tok_vocab.c - the vocabulary's lookups and the merge loop, shared by the
 * SPM encoder (tok.c) and the BPE encoder (tok_bpe.c); calls nothing in
 * either.
 *
 * Token texts and merges are found by open-addressing hash tables (FNV-1a,
 * linear probing, load <= 1/2) of uint32_t slots holding index + 1, built
 * once at creation. The merge loop is llama.cpp's: a max-heap of adjacent
 * symbol pairs, best first, ties leftmost (see tok_impl.h).
 */
#include "engine/model/tok_impl.h"

#include <errno.h>
#include <string.h>

#include "mem.h"

/* ---- hashing ---------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_SEED 0xcbf29ce484222325ull

static uint64_t merge_hash(const char *a, size_t na, const char *b, size_t nb) {
    /* The separator keeps ("ab", "c") and ("a", "bc") apart. */
    return fnv1a(fnv1a(FNV_SEED, a, na) ^ 0xff, b, nb);
}

static bool str_eq(struct tok_str s, const char *p, size_t n) {
    return s.len == n && memcmp(s.ptr, p, n) == 0;
}

static uint32_t table_mask(uint32_t n) {
    uint32_t size = 16;
    while (size < 2 * (uint64_t)n)
        size *= 2;
    return size - 1;
}

int32_t tok_lookup(const struct tok *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)fnv1a(FNV_SEED, s, n) & t->ht_mask;; i = (i + 1) & t->ht_mask) {
        uint32_t v = t->ht[i];
        if (v == 0)
            return -1;
        if (str_eq(t->text[v - 1], s, n))
            return (int32_t)(v - 1);
    }
}

int32_t tok_merge_rank(const struct tok *t, const char *a, size_t na, const char *b, size_t nb) {
    if (!t->mht)
        return -1;
    uint32_t i = (uint32_t)merge_hash(a, na, b, nb) & t->mht_mask;
    for (;; i = (i + 1) & t->mht_mask) {
        uint32_t v = t->mht[i];
        if (v == 0)
            return -1;
        const struct tok_merge *m = &t->merges[v - 1];
        if (str_eq(m->a, a, na) && str_eq(m->b, b, nb))
            return (int32_t)(v - 1);
    }
}

int tok_vocab_index(struct tok *t) {
    t->ht_mask = table_mask(t->n_vocab);
    t->ht = mem_calloc(MEM_TOK, (size_t)t->ht_mask + 1, sizeof(*t->ht));
    if (!t->ht)
        return -ENOMEM;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        struct tok_str s = t->text[id];
        uint32_t i = (uint32_t)fnv1a(FNV_SEED, s.ptr, s.len) & t->ht_mask;
        while (t->ht[i] && !str_eq(t->text[t->ht[i] - 1], s.ptr, s.len))
            i = (i + 1) & t->ht_mask;
        t->ht[i] = id + 1; /* a duplicate text: the later id wins */
    }
    return 0;
}

/* Split each "left right" merge at its first space after the first byte
 * (llama.cpp: word.find(' ', 1)); a merge without one can never apply and
 * is skipped, as llama.cpp effectively does. */
int tok_merges_index(struct tok *t, const struct tok_str *merges, uint32_t n) {
    t->n_merges = n;
    t->merges = mem_calloc(MEM_TOK, (size_t)n + 1, sizeof(*t->merges));
    t->mht_mask = table_mask(n);
    t->mht = mem_calloc(MEM_TOK, (size_t)t->mht_mask + 1, sizeof(*t->mht));
    if (!t->merges || !t->mht)
        return -ENOMEM;
    for (uint32_t r = 0; r < n; r++) {
        const char *p = merges[r].ptr;
        const char *sp = merges[r].len > 1 ? memchr(p + 1, ' ', merges[r].len - 1) : NULL;
        if (!sp)
            continue;
        struct tok_merge *m = &t->merges[r];
        m->a = (struct tok_str){p, (size_t)(sp - p)};
        m->b = (struct tok_str){sp + 1, merges[r].len - m->a.len - 1};
        uint32_t i = (uint32_t)merge_hash(m->a.ptr, m->a.len, m->b.ptr, m->b.len) & t->mht_mask;
        bool dup = false;
        for (; t->mht[i]; i = (i + 1) & t->mht_mask) {
            const struct tok_merge *o = &t->merges[t->mht[i] - 1];
            if (str_eq(o->a, m->a.ptr, m->a.len) && str_eq(o->b, m->b.ptr, m->b.len)) {
                dup = true; /* the first rank wins */
                break;
            }
        }
        if (!dup)
            t->mht[i] = r + 1;
    }
    return 0;
}

/* ---- the merge loop ---------------------------------------------------- */

static bool bigram_better(const struct tok_bigram *x, const struct tok_bigram *y) {
    return x->prio > y->prio || (x->prio == y->prio && x->left < y->left);
}

static int heap_push(struct tok_work *w, struct tok_bigram b) {
    if (w->n_heap == w->cap_heap) {
        size_t cap = w->cap_heap ? 2 * w->cap_heap : 64;
        struct tok_bigram *h = mem_realloc(w->heap, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        w->heap = h;
        w->cap_heap = cap;
    }
    size_t i = w->n_heap++;
    while (i > 0 && bigram_better(&b, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = b;
    return 0;
}

static struct tok_bigram heap_pop(struct tok_work *w) {
    struct tok_bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bigram_better(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!bigram_better(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static int try_add(const struct tok *t, struct tok_work *w, const char *text, int32_t l,
                   int32_t r) {
    if (l < 0 || r < 0)
        return 0;
    const struct tok_sym *a = &w->sym[l], *b = &w->sym[r];
    double prio;
    if (t->kind == TOK_SPM) {
        int32_t id = tok_lookup(t, text + a->off, a->n + b->n); /* a, b are adjacent */
        if (id < 0)
            return 0;
        prio = t->score[id];
    } else {
        int32_t rank = tok_merge_rank(t, text + a->off, a->n, text + b->off, b->n);
        if (rank < 0)
            return 0;
        prio = -(double)rank;
    }
    return heap_push(w, (struct tok_bigram){prio, l, r, a->n + b->n});
}

static size_t utf8_len(uint8_t c) {
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

int tok_work_merge(const struct tok *t, struct tok_work *w, const char *text, size_t len) {
    if (len + 1 > w->cap_sym) {
        struct tok_sym *s = mem_realloc(w->sym, (len + 1) * sizeof(*s));
        if (!s)
            return -ENOMEM;
        w->sym = s;
        w->cap_sym = len + 1;
    }
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t k = utf8_len((uint8_t)text[off]);
        if (k > len - off)
            k = len - off;
        w->sym[n] =
            (struct tok_sym){n - 1, off + k == len ? -1 : n + 1, (uint32_t)off, (uint32_t)k};
        off += k;
        n++;
    }
    w->n_heap = 0;
    for (int32_t i = 1; i < n; i++)
        if (try_add(t, w, text, i - 1, i))
            return -ENOMEM;
    while (w->n_heap) {
        struct tok_bigram bg = heap_pop(w);
        struct tok_sym *l = &w->sym[bg.left], *r = &w->sym[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* one side already merged elsewhere */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = bg.left;
        if (try_add(t, w, text, l->prev, bg.left) || try_add(t, w, text, bg.left, l->next))
            return -ENOMEM;
    }
    return 0;
}

void tok_work_fini(struct tok_work *w) {
    mem_free(w->heap);
    mem_free(w->sym);
}
