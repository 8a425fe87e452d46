/* admin.h - the admin socket of `llmd serve`, for llmctl.
 *
 * A Unix stream socket (mode 0600, peers of the same user or root) that
 * answers one JSON object a line; the commands are listed in admin.c and
 * docs/serving.md. It is not HTTP: it reaches the engine through the serve
 * loop (engine/serve/serve_loop.h) and what belongs to the front end that
 * owns it through struct admin_ops, so it depends on neither the HTTP
 * server nor libmicrohttpd.
 *
 * Workflow: admin_start() after the serve loop runs; admin_stop() before the
 * loop is closed. Threads: one thread of its own serves one client at a
 * time; the ops are called on it, concurrently with the owner's threads.
 */
#ifndef LLMD_ADMIN_H
#define LLMD_ADMIN_H

#include <stdint.h>

#include <jansson.h>

#include "engine/serve/serve_loop.h"

struct admin;

/* What the front end adds to the answers. Every slot is optional: NULL
 * leaves the fields out (stats, config) or refuses the command (tenant
 * names for purge, drain, drain with exit). Called on the admin thread. */
struct admin_ops {
    void *ctx; /* passed to each slot; borrowed */
    /* "stats": add the front end's own fields to `server` (the answer's
     * "server" object) and to `answer` (top level). */
    void (*stats)(void *ctx, json_t *server, json_t *answer);
    /* "config": the answer without "ok" (a new reference; NULL: no memory). */
    json_t *(*config)(void *ctx);
    /* "purge" by name: the engine id of tenant `name`. Returns 0, -ENOENT. */
    int (*tenant_id)(void *ctx, const char *name, uint32_t *tenant);
    /* "drain": start draining (idempotent); returns the requests still live. */
    uint64_t (*drain)(void *ctx);
    /* "drain" with "exit": ask the owner to shut down (after drain). */
    void (*shutdown)(void *ctx);
};

/* Listen on the Unix socket at path (mode 0600, a stale socket replaced)
 * and serve llmctl's requests on a thread of its own. loop is borrowed and
 * must outlive the socket; ops is copied. Returns 0, -ENAMETOOLONG,
 * -EEXIST (a file that is not a socket), -EADDRINUSE (another server
 * listens), -errno of bind/listen, -ENOMEM; errbuf says which. Stop it with
 * admin_stop(), which unlinks path. */
int admin_start(const char *path, struct serve_loop *loop, const struct admin_ops *ops,
                struct admin **out, char *errbuf, size_t errlen);

/* Wake and join the thread (a client being served finishes its line first,
 * bounded by the 5 s receive timeout), close and unlink. NULL is a no-op. */
void admin_stop(struct admin *a);

#endif /* LLMD_ADMIN_H */
