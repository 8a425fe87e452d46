/* The prefix cache in the engine: a shared prefix is computed once (read
 * from the counters), tenants never share pages unless both name the same
 * namespace, and cached pages never change a token. stories260K, greedy,
 * f32 KV, 16 tokens a page. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct job {
    int32_t prompt[512];
    uint32_t n_prompt, max_tokens;
    uint32_t tenant;
    const char *ns;
    float temperature; /* 0: greedy */
    uint64_t seed;
    uint64_t id;
    int32_t out[64];
    uint32_t n_out;
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)text;
    (void)len;
    struct job *j = user;
    cr_assert_eq(id, j->id);
    if (token >= 0 && j->n_out < 64)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

static struct llmd_engine *open_engine(int no_cache) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 8,
                                     .max_batched_tokens = 128,
                                     .kv_type = LLMD_KV_F32,
                                     .no_prefix_cache = no_cache};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

static void submit(struct llmd_engine *e, struct job *j) {
    struct llmd_request r = {.prompt_ids = j->prompt,
                             .n_prompt_ids = j->n_prompt,
                             .max_tokens = j->max_tokens,
                             .tenant = j->tenant,
                             .temperature = j->temperature,
                             .seed = j->seed,
                             .cache_ns = j->ns,
                             .cache_ns_len = j->ns ? strlen(j->ns) : 0,
                             .on_token = on_token,
                             .user = j};
    j->n_out = 0;
    j->finish = LLMD_FINISH_NONE;
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

static void run(struct llmd_engine *e) {
    int steps = 0;
    while (llmd_engine_step(e) > 0)
        cr_assert_lt(++steps, 100000);
}

/* prefix[0..n) = BOS then a fixed pseudo-random stream (seed) */
static void fill(int32_t *t, uint32_t from, uint32_t to, unsigned seed) {
    srand(seed);
    for (uint32_t i = 0; i < to; i++) {
        int32_t v = 3 + rand() % 509;
        if (i >= from)
            t[i] = i == 0 ? 1 : v;
    }
}

static struct llmd_stats stats(struct llmd_engine *e) {
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    return st;
}

/* issue 4: a second request sharing a 400-token prefix prefills at most
 * (400 mod tokens_per_page) + its own new tokens, and both outputs equal
 * their runs without the cache. */
Test(engine_prefix, shared_400_token_prefix_is_computed_once, .timeout = 120) {
    static struct job a, b, a0, b0;
    a.n_prompt = 420;
    fill(a.prompt, 0, 400, 1);
    fill(a.prompt, 400, 420, 2);
    b = a;
    b.n_prompt = 430;
    fill(b.prompt, 400, 430, 3); /* same 400, then 30 of its own */
    a.max_tokens = b.max_tokens = 16;
    a0 = a;
    b0 = b;

    struct llmd_engine *off = open_engine(1);
    submit(off, &a0);
    run(off);
    submit(off, &b0);
    run(off);
    llmd_engine_close(off);

    struct llmd_engine *e = open_engine(0);
    submit(e, &a);
    run(e);
    struct llmd_stats s1 = stats(e);
    submit(e, &b);
    run(e);
    struct llmd_stats s2 = stats(e);
    uint64_t prefilled = s2.prefill_tokens_total - s1.prefill_tokens_total;
    uint64_t hits = s2.prefix_hit_tokens_total - s1.prefix_hit_tokens_total;
    cr_assert_leq(prefilled, 400 % 16 + 30, "second request prefilled %lu tokens",
                  (unsigned long)prefilled);
    cr_assert_eq(hits, 400, "hit tokens %lu", (unsigned long)hits);
    cr_assert_eq(s1.prefix_hit_tokens_total, 0);
    cr_assert_arr_eq(a.out, a0.out, sizeof(int32_t) * 16, "first request changed");
    cr_assert_arr_eq(b.out, b0.out, sizeof(int32_t) * 16, "the cached prefix changed a token");
    cr_assert_eq(b.n_out, 16);
    llmd_engine_close(e);
}

Test(engine_prefix, tenants_share_pages_only_in_a_shared_namespace, .timeout = 120) {
    static struct job j[4];
    for (int i = 0; i < 4; i++) {
        j[i].n_prompt = 100;
        fill(j[i].prompt, 0, 100, 9);
        j[i].max_tokens = 4;
    }
    j[0].tenant = 1;
    j[1].tenant = 2; /* identical prompt, another tenant: no hit */
    j[2].tenant = 1;
    j[2].ns = "org:shared";
    j[3].tenant = 2;
    j[3].ns = "org:shared"; /* both opted into the same namespace: hit */
    struct llmd_engine *e = open_engine(0);
    uint64_t hit[4];
    for (int i = 0; i < 4; i++) {
        uint64_t before = stats(e).prefix_hit_tokens_total;
        submit(e, &j[i]);
        run(e);
        hit[i] = stats(e).prefix_hit_tokens_total - before;
    }
    cr_assert_eq(hit[0], 0);
    cr_assert_eq(hit[1], 0, "tenant 2 hit tenant 1's pages: %lu tokens", (unsigned long)hit[1]);
    cr_assert_eq(hit[2], 0, "a new namespace starts empty");
    cr_assert_eq(hit[3], 96, "shared namespace: 6 full pages of 16 (%lu)", (unsigned long)hit[3]);
    for (int i = 1; i < 4; i++)
        cr_assert_arr_eq(j[i].out, j[0].out, sizeof(int32_t) * 4, "request %d", i);
    llmd_engine_close(e);
}

/* RAG-shaped: 3 documents x 6 questions submitted at once, cache on, equal
 * to each request alone with the cache off. */
Test(engine_prefix, rag_load_with_cache_equals_solo_runs, .timeout = 120) {
    enum { N = 18 };
    static struct job j[N], solo[N];
    for (int i = 0; i < N; i++) {
        j[i].n_prompt = 180 + (uint32_t)(i % 6) * 5;
        fill(j[i].prompt, 0, 160, 100 + (unsigned)(i / 6));       /* the document */
        fill(j[i].prompt, 160, j[i].n_prompt, 200 + (unsigned)i); /* the question */
        j[i].max_tokens = 12;
        solo[i] = j[i];
    }
    struct llmd_engine *off = open_engine(1);
    for (int i = 0; i < N; i++) {
        submit(off, &solo[i]);
        run(off);
    }
    llmd_engine_close(off);
    struct llmd_engine *e = open_engine(0);
    for (int i = 0; i < N; i++)
        submit(e, &j[i]);
    run(e);
    struct llmd_stats st = stats(e);
    cr_assert_gt(st.prefix_hit_tokens_total, 0, "documents were shared");
    for (int i = 0; i < N; i++) {
        cr_assert_eq(j[i].finish, LLMD_FINISH_LENGTH);
        cr_assert_arr_eq(j[i].out, solo[i].out, sizeof(int32_t) * 12, "request %d", i);
    }
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    llmd_engine_close(e);
}

/* A tenant's retention limit caps its cached pages; another tenant's stay. */
Test(engine_prefix, tenant_retention_limit_caps_cached_pages, .timeout = 60) {
    static struct job j[3];
    struct llmd_engine *e = open_engine(0);
    cr_assert_eq(llmd_tenant_retention(e, 1, 2), 0);
    for (int i = 0; i < 3; i++) {
        j[i].n_prompt = 100; /* 6 full pages */
        fill(j[i].prompt, 0, 100, 40 + (unsigned)i);
        j[i].max_tokens = 2;
        j[i].tenant = i < 2 ? 1 : 2;
        submit(e, &j[i]);
        run(e);
    }
    /* tenant 1 keeps at most 2 pages, tenant 2 its 6 */
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.kv_pages_cached, 2 + 6, "cached %lu", (unsigned long)st.kv_pages_cached);
    struct llmd_engine *off = open_engine(1);
    cr_assert_eq(llmd_tenant_retention(off, 1, 2), -ENOTSUP);
    llmd_engine_close(off);
    llmd_engine_close(e);
}

static bool all_started(const struct job *j, int n) {
    for (int i = 0; i < n; i++)
        if (j[i].n_out == 0 && j[i].finish == LLMD_FINISH_NONE)
            return false;
    return true;
}

/* issue 18 (n > 1): four samples of one 300-token prompt, submitted
 * together, prefill it once: the first computes it, the other three are
 * held back until its 18 full pages are in the cache, then share them and
 * compute their 12-token partial page each. Each output equals its own run
 * without the cache (same seed). */
Test(engine_prefix, four_samples_of_one_prompt_share_its_full_pages, .timeout = 120) {
    enum { N = 4, LEN = 300, FULL = LEN / 16, TAIL = LEN % 16 };
    static struct job j[N], solo[N];
    for (int i = 0; i < N; i++) {
        j[i].n_prompt = LEN;
        fill(j[i].prompt, 0, LEN, 7);
        j[i].max_tokens = 24;
        j[i].temperature = 0.8f;
        j[i].seed = 11 + (uint64_t)i;
        solo[i] = j[i];
    }
    struct llmd_engine *off = open_engine(1);
    for (int i = 0; i < N; i++) {
        submit(off, &solo[i]);
        run(off);
    }
    llmd_engine_close(off);

    struct llmd_engine *e = open_engine(0);
    for (int i = 0; i < N; i++)
        submit(e, &j[i]);
    int steps = 0;
    while (!all_started(j, N)) {
        cr_assert_gt(llmd_engine_step(e), 0);
        cr_assert_lt(++steps, 100);
    }
    uint32_t pages[N][FULL + 2];
    for (int i = 0; i < N; i++) /* 18 full pages and the partial one (its decode goes on in it) */
        cr_assert_eq(llmd_request_pages(e, j[i].id, pages[i], FULL + 2), FULL + 1, "request %d", i);
    for (int i = 1; i < N; i++) {
        cr_assert_arr_eq(pages[i], pages[0], FULL * sizeof(uint32_t), "request %d", i);
        for (int k = 0; k < i; k++)
            cr_assert_neq(pages[i][FULL], pages[k][FULL], "partial pages of %d and %d", i, k);
    }
    char map[1024];
    cr_assert_eq(llmd_pool_map(e, map, sizeof(map)), 0);
    uint32_t shared4 = 0;
    for (const char *c = map; *c; c++)
        shared4 += *c == '4';
    cr_assert_eq(shared4, FULL, "pages mapped by all four: %u\n%s", shared4, map);
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.prefill_tokens_total, LEN + (N - 1) * TAIL, "prefilled %lu",
                 (unsigned long)st.prefill_tokens_total);
    cr_assert_eq(st.prefix_hit_tokens_total, (N - 1) * FULL * 16);
    run(e);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(j[i].finish, LLMD_FINISH_LENGTH);
        cr_assert_eq(j[i].n_out, 24);
        cr_assert_arr_eq(j[i].out, solo[i].out, sizeof(int32_t) * 24, "sample %d", i);
    }
    cr_assert(llmd_engine_check(e));
    st = stats(e);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    llmd_engine_close(e);
}

/* A request held behind another's prefill is let go when that one is
 * cancelled half-way: the others finish, each with its own run's tokens,
 * and every page comes back. */
Test(engine_prefix, held_requests_go_on_when_the_prefill_they_wait_for_is_cancelled,
     .timeout = 120) {
    enum { N = 3, LEN = 300 };
    static struct job j[N], solo;
    for (int i = 0; i < N; i++) {
        j[i].n_prompt = LEN;
        fill(j[i].prompt, 0, LEN, 8);
        j[i].max_tokens = 12;
    }
    solo = j[0];
    struct llmd_engine *off = open_engine(1);
    submit(off, &solo);
    run(off);
    llmd_engine_close(off);

    struct llmd_engine *e = open_engine(0);
    for (int i = 0; i < N; i++)
        submit(e, &j[i]);
    cr_assert_gt(llmd_engine_step(e), 0); /* the first prefills 128 tokens, the rest wait */
    cr_assert_eq(llmd_request_pages(e, j[1].id, NULL, 0), -ENOENT, "held, not running");
    cr_assert_eq(llmd_cancel(e, j[0].id), 0);
    run(e);
    cr_assert_eq(j[0].finish, LLMD_FINISH_CANCELLED);
    for (int i = 1; i < N; i++) {
        cr_assert_eq(j[i].finish, LLMD_FINISH_LENGTH, "request %d", i);
        cr_assert_arr_eq(j[i].out, solo.out, sizeof(int32_t) * 12, "request %d", i);
    }
    cr_assert(llmd_engine_check(e));
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    llmd_engine_close(e);
}

/* Four samples of one 300-token prompt in a pool too small for all of
 * them to reach their 60 tokens: some are preempted (recompute) and come
 * back, sharing the cached prompt again. Each output still equals its own
 * run, and every page comes back. */
Test(engine_prefix, four_samples_survive_preemption_in_a_small_pool, .timeout = 120) {
    enum { N = 4, LEN = 300, GEN = 60 };
    static struct job j[N], solo[N];
    for (int i = 0; i < N; i++) {
        j[i].n_prompt = LEN;
        fill(j[i].prompt, 0, LEN, 9);
        j[i].max_tokens = GEN;
        j[i].temperature = 0.8f;
        j[i].seed = 21 + (uint64_t)i;
        solo[i] = j[i];
    }
    struct llmd_engine *off = open_engine(1);
    for (int i = 0; i < N; i++) {
        submit(off, &solo[i]);
        run(off);
    }
    struct llmd_stats st = stats(off);
    llmd_engine_close(off);
    /* 18 shared + 4 x 6 private pages would be 42: give it 30 */
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 8,
                                     .max_batched_tokens = 128,
                                     .kv_type = LLMD_KV_F32,
                                     .kv_budget_bytes = 30 * st.kv_page_bytes};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    for (int i = 0; i < N; i++)
        submit(e, &j[i]);
    run(e);
    st = stats(e);
    cr_assert_gt(st.preemptions_total, 0, "the pool was not small enough to preempt");
    for (int i = 0; i < N; i++) {
        cr_assert_eq(j[i].finish, LLMD_FINISH_LENGTH, "sample %d", i);
        cr_assert_arr_eq(j[i].out, solo[i].out, sizeof(int32_t) * GEN, "sample %d", i);
    }
    cr_assert(llmd_engine_check(e));
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    llmd_engine_close(e);
}
