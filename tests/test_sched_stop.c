/* Stop strings across token boundaries: the matcher reports a stop string
 * however the text is cut into tokens, and what it releases never contains
 * any byte of the stop string. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/sched.h"
#include "mem.h"

struct fed {
    char text[4096];
    size_t len;
    bool matched;
};

/* Push each piece in turn, appending the released bytes; flush at the end
 * unless a stop matched. */
static struct fed feed(const char *const *stops, uint32_t n_stops, const char *const *pieces,
                       uint32_t n_pieces) {
    struct sched_stop m;
    cr_assert_eq(sched_stop_init(&m, stops, n_stops), 0);
    struct fed f = {0};
    for (uint32_t i = 0; i < n_pieces && !f.matched; i++) {
        size_t n;
        int rc = sched_stop_push(&m, pieces[i], strlen(pieces[i]), f.text + f.len,
                                 sizeof(f.text) - f.len, &n, &f.matched);
        cr_assert_eq(rc, 0, "push %u: %d", i, rc);
        f.len += n;
    }
    if (!f.matched)
        f.len += sched_stop_flush(&m, f.text + f.len, sizeof(f.text) - f.len);
    sched_stop_fini(&m);
    f.text[f.len] = 0;
    return f;
}

Test(sched_stop, newline_pair_split_across_tokens) {
    const char *stops[] = {"\n\n"};
    const char *pieces[] = {"Hello", "\n", "\nfoo"};
    struct fed f = feed(stops, 1, pieces, 3);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "Hello");
}

Test(sched_stop, word_split_in_two) {
    const char *stops[] = {"END"};
    const char *pieces[] = {"the E", "ND of it"};
    struct fed f = feed(stops, 1, pieces, 2);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "the ");
}

Test(sched_stop, held_text_released_when_prefix_breaks) {
    const char *stops[] = {"END"};
    struct sched_stop m;
    cr_assert_eq(sched_stop_init(&m, stops, 1), 0);
    char out[64];
    size_t n;
    bool hit;
    cr_assert_eq(sched_stop_push(&m, "xE", 2, out, sizeof(out), &n, &hit), 0);
    cr_assert(!hit);
    cr_assert_eq(n, 1, "released %zu want 1", n);
    cr_assert_eq(out[0], 'x');
    cr_assert_eq(sched_stop_held(&m), 1);
    cr_assert_eq(sched_stop_push(&m, "N", 1, out, sizeof(out), &n, &hit), 0);
    cr_assert_eq(n, 0, "\"EN\" is still a prefix of END");
    cr_assert_eq(sched_stop_held(&m), 2);
    cr_assert_eq(sched_stop_push(&m, "x", 1, out, sizeof(out), &n, &hit), 0);
    cr_assert(!hit);
    cr_assert_eq(n, 3, "released %zu want 3", n);
    cr_assert(memcmp(out, "ENx", 3) == 0);
    cr_assert_eq(sched_stop_held(&m), 0);
    sched_stop_fini(&m);
}

Test(sched_stop, overlapping_prefix_keeps_only_what_may_start_a_stop) {
    const char *stops[] = {"END"};
    const char *pieces[] = {"E", "EN", "D"};
    struct fed f = feed(stops, 1, pieces, 3);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "E");
}

Test(sched_stop, earliest_of_several_wins) {
    const char *stops[] = {"cd", "bcde"};
    const char *pieces[] = {"ab", "cdef"};
    struct fed f = feed(stops, 2, pieces, 2);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "a");
}

Test(sched_stop, stop_inside_one_piece_and_no_stops) {
    const char *stops[] = {"###"};
    const char *pieces[] = {"ab### cd"};
    struct fed f = feed(stops, 1, pieces, 1);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "ab");
    const char *p2[] = {"plain", " text"};
    f = feed(NULL, 0, p2, 2);
    cr_assert(!f.matched);
    cr_assert_str_eq(f.text, "plain text");
}

Test(sched_stop, utf8_stop_split_mid_character) {
    const char *stops[] = {"\xE2\x80\x9C"}; /* U+201C */
    const char *pieces[] = {"say \xE2", "\x80", "\x9Chi"};
    struct fed f = feed(stops, 1, pieces, 3);
    cr_assert(f.matched);
    cr_assert_str_eq(f.text, "say ");
}

Test(sched_stop, bad_arguments_and_small_buffer) {
    struct sched_stop m;
    const char *empty[] = {""};
    cr_assert_eq(sched_stop_init(&m, empty, 1), -EINVAL);
    char longs[SCHED_STOP_MAX_BYTES + 2];
    memset(longs, 'a', sizeof(longs) - 1);
    longs[sizeof(longs) - 1] = 0;
    const char *lp[] = {longs};
    cr_assert_eq(sched_stop_init(&m, lp, 1), -EINVAL);
    const char *many[SCHED_STOP_MAX_N + 1];
    for (int i = 0; i <= SCHED_STOP_MAX_N; i++)
        many[i] = "x";
    cr_assert_eq(sched_stop_init(&m, many, SCHED_STOP_MAX_N + 1), -EINVAL);
    const char *stops[] = {"abc"};
    cr_assert_eq(sched_stop_init(&m, stops, 1), 0);
    char out[4];
    size_t n;
    bool hit;
    cr_assert_eq(sched_stop_push(&m, "xxab", 4, out, sizeof(out), &n, &hit), 0);
    cr_assert_eq(sched_stop_held(&m), 2);
    cr_assert_eq(sched_stop_push(&m, "zzz", 3, out, 4, &n, &hit), -ENOSPC, "2 held + 3 > 4");
    cr_assert_eq(sched_stop_held(&m), 2, "unchanged on -ENOSPC");
    sched_stop_fini(&m);
    uint64_t before = mem_bytes(MEM_SCHED);
    mem_fail_nth(1);
    cr_assert_eq(sched_stop_init(&m, stops, 1), -ENOMEM);
    mem_fail_nth(0);
    sched_stop_fini(&m);
    cr_assert_eq(mem_bytes(MEM_SCHED), before);
}

static uint64_t rng(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Random texts over a tiny alphabet cut at random points: the released text
 * is exactly the text before the first stop string (all of it without one). */
Test(sched_stop, random_cuts_match_the_reference) {
    const char *stops[] = {"aab", "\n\n", "ba\nb"};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int iter = 0; iter < 3000; iter++) {
        char text[64];
        size_t len = 1 + rng(&x) % 48;
        for (size_t i = 0; i < len; i++)
            text[i] = "ab\n"[rng(&x) % 3];
        text[len] = 0;
        size_t want = len;
        for (size_t i = 0; i < 3; i++) {
            const char *p = strstr(text, stops[i]);
            if (p && (size_t)(p - text) < want)
                want = (size_t)(p - text);
        }
        char buf[64][64];
        const char *pieces[64];
        uint32_t np = 0;
        for (size_t at = 0; at < len; np++) {
            size_t k = 1 + rng(&x) % 4;
            k = k > len - at ? len - at : k;
            memcpy(buf[np], text + at, k);
            buf[np][k] = 0;
            pieces[np] = buf[np];
            at += k;
        }
        struct fed f = feed(stops, 3, pieces, np);
        cr_assert_eq(f.matched, want < len, "iter %d text '%s'", iter, text);
        cr_assert_eq(f.len, want, "iter %d text '%s': released %zu want %zu", iter, text, f.len,
                     want);
        cr_assert(memcmp(f.text, text, want) == 0, "iter %d", iter);
    }
}
