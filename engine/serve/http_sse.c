/* http_sse.c - `stream: true`: a Server-Sent Events response.
 *
 * The response is libmicrohttpd's callback kind (unknown size, chunked
 * transfer encoding). Its content reader runs on the connection's own
 * thread (thread-per-connection), so it may block: it waits on the
 * request's condvar for the next published text, formats one chunk
 *
 *   data: {"id":...,"object":"text_completion","choices":[{"text":...}]}\n\n
 *
 * (chat: "chat.completion.chunk" with a delta, the first one carrying the
 * assistant role), then, once the request finished, a chunk with its
 * finish_reason, the usage chunk when stream_options.include_usage asked,
 * and `data: [DONE]`. A request that ends without a finish reason (cancelled
 * at shutdown, an engine error) ends with an error event instead,
 * `data: {"error":{...}}`, and no [DONE], which OpenAI's clients raise as
 * an error.
 *
 * n > 1: the choices' chunks are interleaved as their text comes, each
 * with its "index" (OpenAI's shape); each choice gets its own role (or
 * echo) chunk first and its own finish chunk; the usage chunk and [DONE]
 * come after the last choice's finish. One choice without a finish reason
 * ends the stream with the error event and cancels the rest.
 *
 * The text of several steps may arrive in one chunk when the client reads
 * slower than the engine writes; the concatenation is the same.
 *
 * Disconnects: a write to a closed socket fails and libmicrohttpd ends the
 * request (the completion callback cancels it); while waiting for tokens
 * the reader also looks at the socket every HTTP_POLL_NS and cancels when
 * the peer has closed it, so a client that leaves during a long prefill or
 * in the queue gives its pages back too.
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/http_impl.h"
#include "mem.h"

enum http_sse_phase { HTTP_SSE_ROLE, HTTP_SSE_RUN, HTTP_SSE_DONE };

struct http_sse {
    struct http_server *s;
    struct MHD_Connection *c;
    struct serve_req **r;     /* [n] the choices: the reader's references */
    uint32_t n, left;         /* choices; of which not finished */
    bool *done;               /* [n] its finish was formatted */
    struct serve_progress *p; /* [n] the last progress of each */
    size_t *text_offset;      /* [n] completions' logprobs: bytes of its tokens so far */
    struct http_meta meta;
    enum http_sse_phase phase;
    struct http_buf out; /* formatted, not yet handed to libmicrohttpd */
    size_t off;          /* bytes of out already handed over */
    char *text;          /* serve_req_wait()'s buffer */
    size_t text_cap;
    char *lp; /* serve_req_take_lp()'s buffer */
    size_t lp_cap;
};

/* Append one event `data: JSON\n\n`; j is consumed. */
static void http_sse_event(struct http_buf *b, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        b->oom = true;
        return;
    }
    http_buf_puts(b, "data: ");
    http_buf_puts(b, s);
    http_buf_puts(b, "\n\n");
    free(s); /* jansson's allocator */
}

/* Format what follows choice i's last text: its finish chunk, and after
 * the last choice's the usage chunk (when asked) and [DONE]; or the error
 * event of a choice that did not finish by itself, which ends the stream
 * (the other choices are cancelled). */
static void http_sse_finish(struct http_sse *x, uint32_t i) {
    const char *reason = http_finish_reason(x->p[i].finish);
    x->done[i] = true;
    x->left--;
    if (!reason) {
        struct http_err e;
        if (x->p[i].finish == LLMD_FINISH_CANCELLED)
            http_err_set(&e, 503, "cancelled", NULL,
                         "the request was cancelled (the server is shutting down)");
        else
            http_err_set(&e, 500, "engine_error", NULL,
                         "the engine failed while running this request");
        http_sse_event(&x->out, http_err_json(&e));
        for (uint32_t k = 0; k < x->n; k++)
            serve_req_cancel(x->s->loop, x->r[k]);
        x->phase = HTTP_SSE_DONE;
        return;
    }
    http_sse_event(&x->out, http_resp_chunk(&x->meta, i, "", 0, false, reason, NULL, 0, NULL));
    if (x->left > 0)
        return;
    if (x->meta.include_usage) {
        struct serve_progress usage;
        http_usage_sum(x->p, x->n, &usage);
        http_sse_event(&x->out, http_resp_usage_chunk(&x->meta, &usage));
    }
    http_buf_puts(&x->out, "data: [DONE]\n\n");
    x->phase = HTTP_SSE_DONE;
}

/* Fill x->out with the next events; blocks until there are some. Returns
 * 0, or -ECONNRESET (the client left), -ENOMEM. */
static int http_sse_next(struct http_sse *x) {
    struct serve_loop *l = x->s->loop;
    if (x->phase == HTTP_SSE_ROLE) {
        x->phase = HTTP_SSE_RUN;
        if (x->meta.chat || x->meta.echo) { /* the role, or the echoed prompt's text */
            for (uint32_t i = 0; i < x->n; i++)
                http_sse_event(&x->out,
                               http_resp_chunk(&x->meta, i, x->meta.echo ? x->meta.echo : "",
                                               x->meta.n_echo, x->meta.chat, NULL, NULL, 0, NULL));
            return x->out.oom ? -ENOMEM : 0;
        }
    }
    for (;;) {
        uint32_t i = 0;
        if (serve_req_wait_any(l, x->r, x->done, x->n, HTTP_POLL_NS, &i) == -ETIMEDOUT) {
            if (http_client_gone(x->c))
                return -ECONNRESET;
            continue;
        }
        size_t n = 0, n_lp = 0;
        serve_req_wait(l, x->r[i], 0, &x->text, &x->text_cap, &n, &x->p[i]);
        if (x->meta.logprobs)
            serve_req_take_lp(l, x->r[i], &x->lp, &x->lp_cap, &n_lp);
        if (n || n_lp)
            http_sse_event(&x->out, http_resp_chunk(&x->meta, i, x->text, n, false, NULL, x->lp,
                                                    n_lp, &x->text_offset[i]));
        if (x->p[i].finish != LLMD_FINISH_NONE)
            http_sse_finish(x, i);
        return x->out.oom ? -ENOMEM : 0;
    }
}

static ssize_t http_sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct http_sse *x = cls;
    while (x->off == x->out.n) {
        x->off = x->out.n = 0;
        if (x->phase == HTTP_SSE_DONE)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (http_sse_next(x) < 0) {
            /* the client is gone or we cannot format: stop the choices now
             * rather than when the connection is torn down */
            for (uint32_t i = 0; i < x->n; i++)
                serve_req_cancel(x->s->loop, x->r[i]);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = x->out.n - x->off < max ? x->out.n - x->off : max;
    memcpy(buf, x->out.p + x->off, n);
    x->off += n;
    return (ssize_t)n;
}

static void http_sse_free(void *cls) {
    struct http_sse *x = cls;
    for (uint32_t i = 0; x->r && i < x->n; i++)
        serve_req_put(x->s->loop, x->r[i]);
    mem_free(x->r);
    mem_free(x->done);
    mem_free(x->p);
    mem_free(x->text_offset);
    http_buf_free(&x->out);
    mem_free(x->text);
    mem_free(x->lp);
    mem_free(x->meta.echo);
    mem_free(x);
}

int http_sse_start(struct http_server *s, struct MHD_Connection *c, struct serve_req *const *r,
                   uint32_t n, const struct http_meta *m) {
    struct http_sse *x = mem_calloc(MEM_HTTP, 1, sizeof(*x));
    if (!x) {
        mem_free(m->echo);
        return MHD_NO;
    }
    *x = (struct http_sse){.s = s, .c = c, .n = n, .left = n, .meta = *m, .phase = HTTP_SSE_ROLE};
    x->r = mem_calloc(MEM_HTTP, n, sizeof(*x->r));
    x->done = mem_calloc(MEM_HTTP, n, sizeof(*x->done));
    x->p = mem_calloc(MEM_HTTP, n, sizeof(*x->p));
    x->text_offset = mem_calloc(MEM_HTTP, n, sizeof(*x->text_offset));
    if (!x->r || !x->done || !x->p || !x->text_offset) {
        x->n = 0; /* no reference taken yet */
        http_sse_free(x);
        return MHD_NO;
    }
    for (uint32_t i = 0; i < n; i++) {
        x->r[i] = r[i];
        serve_req_get(s->loop, r[i]);
    }
    /* from here on the free callback puts the references and frees x */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, http_sse_read, x, http_sse_free);
    if (!resp) {
        http_sse_free(x);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* the connection keeps its reference */
    if (ret == MHD_YES)
        http_count_response(s, MHD_HTTP_OK);
    return ret;
}
