/* http.h - `llmd serve`: an OpenAI-compatible HTTP server over one engine.
 *
 * Model: libmicrohttpd accepts connections and runs each on its own thread
 * (MHD_USE_THREAD_PER_CONNECTION); a request thread parses and validates
 * the JSON body, submits through the engine thread (engine/serve/serve_loop.h)
 * and then blocks: until the request finishes (a JSON answer), or, for
 * `stream: true`, in the response's content reader until the next tokens
 * arrive (Server-Sent Events). A client that goes away is noticed by a
 * failed write or a closed socket and its request cancelled, so its KV
 * pages return within one step. Endpoints, errors and metrics:
 * docs/serving.md.
 *
 * Workflow:
 *   http_server_start(&cfg, engine, &s, err, sizeof err);  // takes the engine
 *   ... serve; on SIGTERM: http_server_drain(s); wait for http_server_live(s) == 0
 *   http_server_stop(s);  // cancels the rest, closes everything
 *
 * Threads: start/drain/stop belong to the owner thread; http_server_port,
 * _live, _stats and _drain may be called from any thread. The server never
 * touches signals: the owner handles them (admin_shutdown is its hook for
 * `llmctl drain --exit`).
 */
#ifndef LLMD_HTTP_H
#define LLMD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmd.h"

struct http_server;

struct http_config {
    const char *host;                  /* address to bind (numeric); NULL: "127.0.0.1" */
    uint16_t port;                     /* 0: an ephemeral port, see http_server_port() */
    const char *model_path;            /* the engine's model: GGUF path or "dummy:SPEC" */
    const char *served_model_name;     /* NULL: the file name without ".gguf" */
    const char *api_keys_path;         /* NULL: no authentication, every request is tenant 0 */
    const char *tokenizer_pre;         /* the engine's llmd_engine_config.tokenizer_pre, for
                                        * the chat templates' tokenizer; NULL: the file's */
    const char *chat_template;         /* NULL: detect from tokenizer.chat_template; or
                                        * "chatml", "llama2", "llama3", "plain" */
    uint64_t max_body_bytes;           /* request bodies larger get 413; 0: 4 MiB */
    uint32_t max_connections;          /* 0: 512 (one thread each) */
    uint32_t idle_timeout_s;           /* close idle connections after this; 0: 120 */
    bool no_vllm_metrics;              /* leave the vllm:* gauges out of /metrics */
    const char *admin_socket;          /* Unix socket for llmctl (mode 0600); NULL: none */
    const char *admin_config;          /* JSON object `llmctl config` shows as "engine"
                                        * (borrowed until stop); NULL: {} */
    void (*admin_shutdown)(void *ctx); /* `llmctl drain --exit`: ask the owner to
                                        * shut down (any thread); NULL: refused */
    void *admin_ctx;
};

/* Load the keys file (and give the engine its tenants' weights and
 * retention), read the model's chat template, start the engine thread and
 * listen. Takes ownership of e: it is closed by http_server_stop(), or here
 * on failure. errbuf gets a one-line reason. Returns 0, -EINVAL (bad config
 * or keys file), -ENOENT/-EACCES (keys file), -EADDRINUSE and other
 * -errno of bind (as -EIO when libmicrohttpd does not say), -ENOMEM. */
int http_server_start(const struct http_config *cfg, struct llmd_engine *e,
                      struct http_server **out, char *errbuf, size_t errlen);

/* Whether name is a chat template family http_config.chat_template takes:
 * "chatml", "llama2", "llama3" or "plain". For a command to refuse a bad
 * flag before it loads anything. */
bool http_chat_template_known(const char *name);

/* The port bound (the ephemeral one when cfg.port was 0). */
uint16_t http_server_port(const struct http_server *s);

/* Start draining: /health answers 503 {"status":"draining"}, new
 * completions get 503; running requests go on. Idempotent. */
void http_server_drain(struct http_server *s);

/* Requests submitted to the engine and not yet finished. */
uint64_t http_server_live(struct http_server *s);

/* The engine's statistics as of its last step (engine-thread snapshot). */
void http_server_stats(struct http_server *s, struct llmd_stats *out);

/* Cancel whatever still runs (clients get an error event or 503), stop
 * listening, join every connection thread, close the engine, free. NULL ok. */
void http_server_stop(struct http_server *s);

#endif /* LLMD_HTTP_H */
