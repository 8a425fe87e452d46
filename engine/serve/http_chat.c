/* http_chat.c - chat messages to a prompt, in the model's template family.
 *
 * GGUF files carry a Jinja template (tokenizer.chat_template); llmd does not
 * run Jinja. It recognises the three families most models use by their
 * markers and renders them itself:
 *
 *   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *   llama3  <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
 *           <|start_header_id|>assistant<|end_header_id|>\n\n   (content trimmed)
 *   llama2  [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] USER [/INST]
 *   plain   ROLE: CONTENT\n ... assistant:    (no template, or one not recognised)
 *
 * The BOS of llama2/llama3 is the engine's (or ours, below), not text.
 * Markers are special tokens: the tokenizer does not parse them out of text
 * (engine/model/tok.h), so when the model file's vocabulary has them as single
 * tokens the prompt is built as token ids, text pieces encoded between them
 * (SentencePiece's space prefix then falls after each special token, as
 * llama.cpp does). The plain template is text and goes to the engine as
 * text, exactly like a completion.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/gguf.h"
#include "engine/serve/http_impl.h"
#include "engine/model/tok.h"
#include "log.h"
#include "mem.h"

static const char *const http_special_texts[HTTP_SP_N] = {
    [HTTP_SP_BOS_TEXT] = "<s>",
    [HTTP_SP_EOS_TEXT] = "</s>",
    [HTTP_SP_IM_START] = "<|im_start|>",
    [HTTP_SP_IM_END] = "<|im_end|>",
    [HTTP_SP_HDR_START] = "<|start_header_id|>",
    [HTTP_SP_HDR_END] = "<|end_header_id|>",
    [HTTP_SP_EOT] = "<|eot_id|>",
};

static const char *const http_tmpl_names[] = {
    [HTTP_TMPL_PLAIN] = "plain",
    [HTTP_TMPL_LLAMA2] = "llama2",
    [HTTP_TMPL_CHATML] = "chatml",
    [HTTP_TMPL_LLAMA3] = "llama3",
};

const char *http_special_text(enum http_special sp) {
    return http_special_texts[sp];
}

const char *http_tmpl_name(enum http_tmpl t) {
    return http_tmpl_names[t];
}

int http_tmpl_from_name(const char *name, enum http_tmpl *out) {
    for (int t = HTTP_TMPL_PLAIN; t <= HTTP_TMPL_LLAMA3; t++)
        if (strcmp(name, http_tmpl_names[t]) == 0) {
            *out = (enum http_tmpl)t;
            return 0;
        }
    return -EINVAL;
}

bool http_chat_template_known(const char *name) {
    enum http_tmpl t;
    return http_tmpl_from_name(name, &t) == 0;
}

static bool http_has(const char *s, size_t len, const char *needle) {
    return memmem(s, len, needle, strlen(needle)) != NULL;
}

enum http_tmpl http_tmpl_detect(const char *tmpl, size_t len) {
    if (!tmpl)
        return HTTP_TMPL_PLAIN;
    if (http_has(tmpl, len, "<|im_start|>"))
        return HTTP_TMPL_CHATML;
    if (http_has(tmpl, len, "<|start_header_id|>"))
        return HTTP_TMPL_LLAMA3;
    if (http_has(tmpl, len, "[INST]"))
        return HTTP_TMPL_LLAMA2;
    return HTTP_TMPL_PLAIN;
}

/* --- rendering ------------------------------------------------------------ */

#define EMIT(s, n)                                                                                 \
    do {                                                                                           \
        int rc_ = emit(ctx, (s), (n), -1);                                                         \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)
#define EMIT_S(s) EMIT((s), strlen(s))
#define EMIT_SP(sp)                                                                                \
    do {                                                                                           \
        int rc_ = emit(ctx, http_special_texts[sp], strlen(http_special_texts[sp]), (sp));         \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

static bool http_is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int http_render_llama2(const struct http_msg *msgs, uint32_t n, http_emit_fn emit,
                              void *ctx) {
    /* the system prompt goes inside the first [INST], as Llama 2's template */
    const struct http_msg *sys = NULL;
    uint32_t i = 0;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0)
        sys = &msgs[i++];
    bool first = true, open = false;
    for (; i < n; i++) {
        const struct http_msg *m = &msgs[i];
        if (strcmp(m->role, "assistant") == 0) {
            if (open)
                EMIT_S(" [/INST]");
            else /* an answer without a question: give it an empty one */
                EMIT_S("[INST]  [/INST]");
            EMIT_S(" ");
            EMIT(m->content, m->len);
            EMIT_S(" ");
            EMIT_SP(HTTP_SP_EOS_TEXT);
            EMIT_SP(HTTP_SP_BOS_TEXT);
            open = false;
            first = false;
            continue;
        }
        if (open) /* two user turns in a row: close the first */
            EMIT_S(" [/INST]");
        EMIT_S("[INST] ");
        if (first && sys) {
            EMIT_S("<<SYS>>\n");
            EMIT(sys->content, sys->len);
            EMIT_S("\n<</SYS>>\n\n");
        }
        EMIT(m->content, m->len);
        first = false;
        open = true;
    }
    if (open)
        EMIT_S(" [/INST]");
    else if (first && sys) { /* only a system message */
        EMIT_S("[INST] <<SYS>>\n");
        EMIT(sys->content, sys->len);
        EMIT_S("\n<</SYS>>\n\n [/INST]");
    }
    return 0;
}

int http_tmpl_render(enum http_tmpl t, const struct http_msg *msgs, uint32_t n, http_emit_fn emit,
                     void *ctx) {
    switch (t) {
    case HTTP_TMPL_LLAMA2:
        return http_render_llama2(msgs, n, emit, ctx);
    case HTTP_TMPL_CHATML:
        for (uint32_t i = 0; i < n; i++) {
            EMIT_SP(HTTP_SP_IM_START);
            EMIT_S(msgs[i].role);
            EMIT_S("\n");
            EMIT(msgs[i].content, msgs[i].len);
            EMIT_SP(HTTP_SP_IM_END);
            EMIT_S("\n");
        }
        EMIT_SP(HTTP_SP_IM_START);
        EMIT_S("assistant\n");
        return 0;
    case HTTP_TMPL_LLAMA3:
        for (uint32_t i = 0; i < n; i++) {
            const char *c = msgs[i].content;
            size_t len = msgs[i].len;
            while (len && http_is_space(*c))
                c++, len--;
            while (len && http_is_space(c[len - 1]))
                len--;
            EMIT_SP(HTTP_SP_HDR_START);
            EMIT_S(msgs[i].role);
            EMIT_SP(HTTP_SP_HDR_END);
            EMIT_S("\n\n");
            EMIT(c, len);
            EMIT_SP(HTTP_SP_EOT);
        }
        EMIT_SP(HTTP_SP_HDR_START);
        EMIT_S("assistant");
        EMIT_SP(HTTP_SP_HDR_END);
        EMIT_S("\n\n");
        return 0;
    default:
        for (uint32_t i = 0; i < n; i++) {
            EMIT_S(msgs[i].role);
            EMIT_S(": ");
            EMIT(msgs[i].content, msgs[i].len);
            EMIT_S("\n");
        }
        EMIT_S("assistant:");
        return 0;
    }
}

/* --- the two emitters ------------------------------------------------------ */

static int http_emit_text(void *ctx, const char *text, size_t len, int sp) {
    (void)sp;
    struct http_buf *b = ctx;
    http_buf_add(b, text, len);
    return b->oom ? -ENOMEM : 0;
}

/* Token ids: specials as their single token, text encoded in runs (adjacent
 * text pieces are joined first: encoding them apart would split words). */
struct http_ids {
    const struct http_model *m;
    int32_t *ids;
    size_t n, cap;
    struct http_buf run; /* text not yet encoded */
};

static int http_ids_push(struct http_ids *x, const int32_t *ids, size_t n) {
    if (n == 0)
        return 0;
    if (x->n + n > x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 256;
        while (cap < x->n + n)
            cap *= 2;
        int32_t *p = mem_realloc(x->ids, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        x->ids = p;
        x->cap = cap;
    }
    memcpy(x->ids + x->n, ids, n * sizeof(*ids));
    x->n += n;
    return 0;
}

static int http_ids_flush(struct http_ids *x) {
    if (x->run.oom)
        return -ENOMEM;
    if (x->run.n == 0)
        return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_encode_alloc(x->m->tok, x->run.p, x->run.n, false, 0, &ids, &n);
    if (rc == 0)
        rc = http_ids_push(x, ids, n);
    mem_free(ids);
    x->run.n = 0;
    return rc;
}

static int http_emit_ids(void *ctx, const char *text, size_t len, int sp) {
    struct http_ids *x = ctx;
    if (sp < 0 || x->m->special[sp] < 0) { /* text, or a marker the vocabulary lacks */
        http_buf_add(&x->run, text, len);
        return x->run.oom ? -ENOMEM : 0;
    }
    int rc = http_ids_flush(x);
    return rc ? rc : http_ids_push(x, &x->m->special[sp], 1);
}

int http_chat_prompt(const struct http_model *m, const struct http_msg *msgs, uint32_t n,
                     char **text, size_t *text_len, int32_t **ids, uint32_t *n_ids) {
    *text = NULL;
    *ids = NULL;
    if (m->tmpl == HTTP_TMPL_PLAIN || !m->tok) {
        struct http_buf b = {0};
        int rc = http_tmpl_render(m->tmpl, msgs, n, http_emit_text, &b);
        if (rc == 0 && !b.p)
            http_buf_add(&b, "", 0);
        if (rc < 0 || b.oom) {
            http_buf_free(&b);
            return -ENOMEM;
        }
        *text = b.p;
        *text_len = b.n;
        return 0;
    }
    struct http_ids x = {.m = m};
    int rc = 0;
    int32_t bos = tok_bos(m->tok);
    /* Llama 3's template starts with {{ bos_token }}: the BOS comes first
     * whether or not the vocabulary adds one to every prompt */
    if (bos >= 0 && (tok_add_bos_default(m->tok) || m->tmpl == HTTP_TMPL_LLAMA3))
        rc = http_ids_push(&x, &bos, 1);
    if (rc == 0)
        rc = http_tmpl_render(m->tmpl, msgs, n, http_emit_ids, &x);
    if (rc == 0)
        rc = http_ids_flush(&x);
    http_buf_free(&x.run);
    if (rc == 0 && x.n > UINT32_MAX)
        rc = -ENOMEM;
    if (rc < 0) {
        mem_free(x.ids);
        return rc;
    }
    *ids = x.ids;
    *n_ids = (uint32_t)x.n;
    return 0;
}

/* --- the model as the API sees it ------------------------------------------ */

/* Find special token texts in the vocabulary: O(vocab) once at start-up. */
static void http_model_specials(struct http_model *m) {
    uint64_t n = 0;
    const struct gguf_str *items = NULL;
    for (int sp = 0; sp < HTTP_SP_N; sp++)
        m->special[sp] = -1;
    if (!m->tok || gguf_get_str_arr(m->gguf, "tokenizer.ggml.tokens", &n, &items) < 0)
        return;
    for (uint64_t i = 0; i < n && i <= INT32_MAX; i++)
        for (int sp = 0; sp < HTTP_SP_N; sp++)
            if (m->special[sp] < 0 && gguf_str_eq(items[i], http_special_texts[sp]))
                m->special[sp] = (int32_t)i;
}

/* The served name: the file name without its directory and ".gguf". */
static char *http_model_default_name(const char *path) {
    if (strncmp(path, "dummy:", 6) == 0)
        return mem_strdup(MEM_HTTP, path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".gguf") == 0)
        len -= 5;
    return mem_strndup(MEM_HTTP, base, len);
}

int http_model_init(struct http_model *m, const struct http_config *cfg, char *errbuf,
                    size_t errlen) {
    *m = (struct http_model){0}; /* n_ctx: the engine's, set by the caller */
    for (int sp = 0; sp < HTTP_SP_N; sp++)
        m->special[sp] = -1;
    m->name = cfg->served_model_name ? mem_strdup(MEM_HTTP, cfg->served_model_name)
                                     : http_model_default_name(cfg->model_path);
    if (!m->name)
        return -ENOMEM;
    struct gguf_str tmpl = {0};
    if (strncmp(cfg->model_path, "dummy:", 6) != 0) {
        char err[256];
        int rc = gguf_open(cfg->model_path, &m->gguf, err, sizeof(err));
        if (rc < 0) {
            LOG_WARN("http", "%s: %s: chat template unknown", cfg->model_path, err);
        } else {
            gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl);
            if (tok_create_pre(m->gguf, cfg->tokenizer_pre, &m->tok, err, sizeof(err)) < 0)
                LOG_WARN("http", "%s: %s: chat prompts go to the engine as text", cfg->model_path,
                         err);
        }
    }
    m->tmpl = http_tmpl_detect(tmpl.ptr, tmpl.len);
    if (cfg->chat_template && http_tmpl_from_name(cfg->chat_template, &m->tmpl) < 0) {
        snprintf(errbuf, errlen,
                 "llmd serve: unknown chat template '%s' (chatml, llama2, llama3, plain)",
                 cfg->chat_template);
        http_model_fini(m);
        return -EINVAL;
    }
    http_model_specials(m);
    return 0;
}

void http_model_fini(struct http_model *m) {
    tok_destroy(m->tok);
    gguf_close(m->gguf);
    mem_free(m->name);
    *m = (struct http_model){0};
}
