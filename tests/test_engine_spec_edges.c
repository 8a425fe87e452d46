/* Speculative decoding's edges in the engine (issue 16): a stop string
 * that completes inside an accepted run, max_tokens and the context (and
 * the KV budget) ending a run, EOS drafted and accepted, preemption and
 * cancellation of speculating requests, a prefix-cache hit followed by
 * speculation, spills to the host tier while speculating. Each is compared
 * token for token (and text, finish, usage) with the same requests run
 * without speculation, and after every step each decoding sequence holds
 * exactly the pages its committed tokens need (tests/lib/spec_util.h). */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/lib/spec_util.h"

static const char *const stories[] = {
    "The cat was very happy. The cat was very happy. The cat",
    "They had a lot of fun. They had a lot of fun. They had a lot of",
    "Tom had a dog. The dog was big. Tom had a dog. The dog was big. Tom had a dog.",
    "Lily and Ben went to the park. They played on the swings. Lily and Ben went to the park.",
};
#define N_STORIES 4

static const struct eng_opts spec8 = {
    .max_seqs = 8, .max_batched = 128, .spec = LLMD_SPEC_NGRAM, .spec_tokens = 8};

/* The text of the non-speculative run, cut at a place where a stop string
 * then completes inside an accepted run of the speculative one: for each
 * job a 4-byte stop string taken at offsets through its text. Among all
 * the cases some stop must complete at a token that was not the first of
 * its step (an accepted draft token), with tokens after it in the run. */
Test(engine_spec_edges, stop_string_completing_inside_an_accepted_run, .timeout = 240) {
    enum { N = 24 };
    static struct job free_run[N_STORIES], alone[N], spec[N];
    for (int i = 0; i < N_STORIES; i++)
        free_run[i] = (struct job){.prompt = stories[i], .max_tokens = 100};
    solo(free_run, N_STORIES);
    static char stops[N][8];
    for (int i = 0; i < N; i++) {
        const struct job *f = &free_run[i % N_STORIES];
        size_t at = 8 + (size_t)(i / N_STORIES) * (f->n_text / 8);
        cr_assert_lt(at + 4, f->n_text);
        memcpy(stops[i], f->text + at, 4);
        stops[i][4] = 0;
        alone[i] = (struct job){
            .prompt = stories[i % N_STORIES], .max_tokens = 100, .stop = {stops[i]}, .n_stop = 1};
        spec[i] = alone[i];
    }
    solo(alone, N);
    struct llmd_engine *e = open_engine(&spec8);
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    run(e, spec, N, false);
    expect_same(alone, spec, N, "stop strings");
    int inside = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(spec[i].finish, LLMD_FINISH_STOP, "job %d (stop \"%s\")", i, stops[i]);
        cr_assert_null(strstr(spec[i].text, stops[i]), "job %d: the stop string is not sent", i);
        inside += spec[i].finish_rank > 0;
    }
    cr_assert_gt(inside, 0, "no stop completed inside a run");
    cr_log_info("%d of %d stops completed inside an accepted run", inside, N);
    expect_counts(e, spec, N, 20, "stops");
    llmd_engine_close(e);
}

/* max_tokens of 1..24: a run never returns more (the draft is capped at
 * what is left), usage counts only those tokens. */
Test(engine_spec_edges, max_tokens_ends_inside_a_run, .timeout = 240) {
    enum { N = 24 };
    static struct job alone[N], spec[N];
    for (int i = 0; i < N; i++)
        alone[i] = spec[i] =
            (struct job){.prompt = stories[i % N_STORIES], .max_tokens = 1 + (uint32_t)i};
    solo(alone, N);
    struct llmd_engine *e = open_engine(&spec8);
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    run(e, spec, N, false);
    expect_same(alone, spec, N, "max_tokens");
    int inside = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(spec[i].finish, LLMD_FINISH_LENGTH);
        cr_assert_eq(spec[i].usage.completion_tokens, spec[i].max_tokens);
        inside += spec[i].finish_rank > 0;
    }
    cr_assert_gt(inside, 0, "no max_tokens was reached by an accepted run");
    expect_counts(e, spec, N, 20, "max_tokens");
    llmd_engine_close(e);
}

/* The context (n_ctx 100) and the KV budget (a pool of 5 pages, 80
 * tokens) end speculating sequences at exactly the token the plain run
 * ends at. */
Test(engine_spec_edges, context_and_kv_budget_end_a_run, .timeout = 240) {
    static struct job alone[N_STORIES], spec[N_STORIES];
    const struct eng_opts limits[2] = {
        {.n_ctx = 100, .max_batched = 64},
        {.n_ctx = 512, .max_batched = 64, .budget = 5 * 20480},
    };
    for (int c = 0; c < 2; c++) {
        int inside = 0;
        for (int i = 0; i < N_STORIES; i++)
            alone[i] = spec[i] = (struct job){.prompt = stories[i]};
        solo_like(alone, N_STORIES, &limits[c]);
        struct eng_opts o = limits[c];
        o.max_seqs = 1;
        o.spec = LLMD_SPEC_NGRAM;
        o.spec_tokens = 16;
        struct llmd_engine *e = open_engine(&o);
        for (int i = 0; i < N_STORIES; i++) {
            submit(e, &spec[i]);
            run(e, &spec[i], 1, false);
            cr_assert_eq(spec[i].finish, c == 0 ? LLMD_FINISH_CONTEXT : LLMD_FINISH_KV_BUDGET);
            cr_assert_eq(spec[i].usage.prompt_tokens + spec[i].usage.completion_tokens,
                         c == 0 ? 100u : 80u);
            inside += spec[i].finish_rank > 0;
        }
        cr_assert_gt(inside, 0, "no limit was reached by an accepted run");
        expect_same(alone, spec, N_STORIES, c == 0 ? "context" : "kv budget");
        expect_counts(e, spec, N_STORIES, 5, c == 0 ? "context" : "kv budget");
        llmd_engine_close(e);
    }
}

/* stories260K ends a story with BOS (id 1) and never samples its EOS (2);
 * a copy whose metadata names 1 the EOS ends stories with an EOS. Patch
 * tokenizer.ggml.eos_token_id's u32 in a copy of the file. */
static void eos_is_bos_copy(const char *path) {
    int in = open(F32, O_RDONLY);
    cr_assert_geq(in, 0);
    off_t n = lseek(in, 0, SEEK_END);
    char *b = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, in, 0);
    cr_assert_neq(b, MAP_FAILED);
    static const char key[] = "tokenizer.ggml.eos_token_id";
    char *at = memmem(b, (size_t)n, key, sizeof key - 1);
    cr_assert_not_null(at);
    size_t off = (size_t)(at - b) + sizeof key - 1; /* then u32 type 4, then the value */
    uint32_t type, val;
    memcpy(&type, b + off, 4);
    memcpy(&val, b + off + 4, 4);
    cr_assert_eq(type, 4, "eos_token_id is a u32");
    cr_assert_eq(val, 2);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, off + 4, f), off + 4);
    uint32_t one = 1;
    cr_assert_eq(fwrite(&one, 4, 1, f), 1);
    cr_assert_eq(fwrite(b + off + 8, 1, (size_t)n - off - 8, f), (size_t)n - off - 8);
    fclose(f);
    munmap(b, (size_t)n);
    close(in);
}

/* EOS drafted and accepted: a prompt that holds a story, its EOS and the
 * start of the same story again, so the drafter proposes the story's end
 * and its EOS, and the model ends the story there too. */
Test(engine_spec_edges, eos_drafted_and_accepted, .timeout = 240) {
    char path[] = "/tmp/llmd-spec-eos-XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    cr_assert_geq(fd, 0);
    close(fd);
    eos_is_bos_copy(path);
    /* the story stories[k] gives greedily, up to its end */
    enum { N = 6 };
    static struct job first[N_STORIES], alone[N], spec[N];
    static int32_t ids[N][1024];
    for (int i = 0; i < N_STORIES; i++)
        first[i] = (struct job){.prompt = stories[i], .max_tokens = 400};
    struct eng_opts eo = {.model = path, .max_batched = 64};
    solo_like(first, N_STORIES, &eo);
    int n = 0;
    for (int i = 0; i < N_STORIES && n < N; i++) {
        cr_log_info("story %d: %u tokens, finish %d", i, first[i].n_out, first[i].finish);
        if (first[i].finish != LLMD_FINISH_EOS || 2 * first[i].n_out + 48 > 512)
            continue; /* no end, or twice the story does not fit the context */
        /* BOS + the story (it ends with the EOS) + BOS + the story again, cut
         * short of its end by 6 or 12 tokens */
        for (int cut = 6; cut <= 12 && n < N; cut += 6) {
            uint32_t m = 0, s = first[i].n_out;
            ids[n][m++] = 1;
            for (uint32_t k = 0; k < s; k++)
                ids[n][m++] = first[i].out[k];
            for (uint32_t k = 0; k + (uint32_t)cut < s; k++)
                ids[n][m++] = first[i].out[k];
            alone[n] = (struct job){.ids = ids[n], .n_ids = m, .max_tokens = 40};
            spec[n] = alone[n];
            n++;
        }
    }
    cr_assert_geq(n, 2, "stories that end with an EOS: %d", n);
    solo_like(alone, n, &eo);
    struct eng_opts so = eo;
    so.max_seqs = 4;
    so.spec = LLMD_SPEC_NGRAM;
    so.spec_tokens = 16;
    struct llmd_engine *e = open_engine(&so);
    for (int i = 0; i < n; i++)
        submit(e, &spec[i]);
    run(e, spec, n, false);
    expect_same(alone, spec, n, "eos");
    int accepted_eos = 0;
    for (int i = 0; i < n; i++)
        accepted_eos += spec[i].finish == LLMD_FINISH_EOS && spec[i].finish_rank > 0;
    cr_log_info("%d of %d ended with an EOS after accepted draft tokens", accepted_eos, n);
    cr_assert_gt(accepted_eos, 0, "no EOS ended an accepted run");
    expect_counts(e, spec, n, 5, "eos");
    llmd_engine_close(e);
    unlink(path);
}

/* 32 requests on 8 slots in a pool of a quarter of their demand:
 * speculating requests are preempted (and resumed) without a token
 * changing. */
Test(engine_spec_edges, preemption_of_speculating_requests, .timeout = 240) {
    enum { N = 32 };
    static struct job alone[N], spec[N];
    for (int i = 0; i < N; i++)
        alone[i] = spec[i] = (struct job){.prompt = stories[i % N_STORIES],
                                          .max_tokens = 60 + (uint32_t)(i % 5) * 9};
    solo(alone, N);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 8,
                                                           .max_batched = 64,
                                                           .budget = 24 * 20480,
                                                           .spec = LLMD_SPEC_NGRAM,
                                                           .spec_tokens = 8});
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    run(e, spec, N, false);
    expect_same(alone, spec, N, "preemption");
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_gt(st.preemptions_total, 0, "a tight pool must preempt");
    expect_counts(e, spec, N, 20, "preemption");
    llmd_engine_close(e);
}

/* Cancelling speculating requests at random points leaves no page behind;
 * the others finish with the tokens they have alone. */
Test(engine_spec_edges, cancel_while_speculating, .timeout = 240) {
    enum { N = 24 };
    static struct job alone[N], spec[N];
    for (int i = 0; i < N; i++)
        alone[i] = spec[i] = (struct job){.prompt = stories[i % N_STORIES], .max_tokens = 80};
    solo(alone, N);
    struct llmd_engine *e = open_engine(&spec8);
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    srand(5);
    int cancelled = 0;
    for (spec_step_now = 1; llmd_engine_step(e) > 0; spec_step_now++) {
        check_pages(e, spec, N, false);
        int i = rand() % N;
        if (rand() % 3 == 0 && spec[i].finish == LLMD_FINISH_NONE &&
            spec[i].usage.spec_draft_tokens > 0) {
            cr_assert_eq(llmd_cancel(e, spec[i].id), 0);
            cancelled++;
        }
    }
    cr_assert_gt(cancelled, 3);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "pages left behind");
    for (int i = 0; i < N; i++) {
        if (spec[i].finish == LLMD_FINISH_CANCELLED) {
            for (uint32_t k = 0; k < spec[i].n_out; k++)
                cr_assert_eq(spec[i].out[k], alone[i].out[k], "cancelled job %d token %u", i, k);
            continue;
        }
        expect_same(&alone[i], &spec[i], 1, "not cancelled");
    }
    llmd_engine_close(e);
}

/* A long prompt computed once, then asked for again: the second request
 * maps the cached pages and speculates from there; its tokens are those
 * of the first. */
Test(engine_spec_edges, prefix_cache_hit_then_speculation, .timeout = 120) {
    static const char *doc =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big red ball. The cat was very happy. The cat was very happy. "
        "The cat";
    static struct job alone[1], spec[2];
    alone[0] = spec[0] = spec[1] = (struct job){.prompt = doc, .max_tokens = 80};
    solo(alone, 1);
    struct llmd_engine *e = open_engine(&spec8);
    for (int i = 0; i < 2; i++) {
        submit(e, &spec[i]);
        run(e, &spec[i], 1, false);
        expect_same(alone, &spec[i], 1, i ? "after a hit" : "first");
    }
    cr_assert_eq(spec[0].usage.cached_tokens, 0);
    cr_assert_gt(spec[1].usage.cached_tokens, 16, "the second request hits the cache");
    cr_assert_gt(spec[1].usage.spec_accepted_tokens, 5);
    llmd_engine_close(e);
}

/* A device pool too small for the cached prefixes: pages spill to the
 * host tier and come back while requests speculate. */
Test(engine_spec_edges, spills_while_speculating, .timeout = 240) {
    enum { N = 16 };
    static struct job alone[N], spec[N];
    for (int i = 0; i < N; i++)
        alone[i] = spec[i] = (struct job){.prompt = stories[i % N_STORIES], .max_tokens = 70};
    solo(alone, N);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 4,
                                                           .max_batched = 64,
                                                           .budget = 20 * 20480,
                                                           .host_bytes = 4u << 20,
                                                           .spec = LLMD_SPEC_NGRAM,
                                                           .spec_tokens = 8});
    for (int w = 0; w < N; w += 4) {
        for (int i = w; i < w + 4; i++)
            submit(e, &spec[i]);
        run(e, spec + w, 4, false);
    }
    expect_same(alone, spec, N, "spills");
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_log_info("spills %lu restores %lu preemptions %lu", (unsigned long)st.spills_host_total,
                (unsigned long)st.restores_host_total, (unsigned long)st.preemptions_total);
    cr_assert_gt(st.spills_host_total, 0, "the pool must spill");
    expect_counts(e, spec, N, 20, "spills");
    llmd_engine_close(e);
}
