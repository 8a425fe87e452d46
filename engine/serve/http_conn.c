/* http_conn.c - what the router (http_server.c) and the SSE reader
 * (http_sse.c) both do to a connection: count its response by status, and
 * notice that its client has gone. Calls neither of them, so the two call
 * here and the router calls the reader, never the reverse.
 */
#include <errno.h>
#include <microhttpd.h>
#include <sys/socket.h>

#include "engine/serve/http_impl.h"

void http_count_response(struct http_server *s, unsigned status) {
    int i = 0;
    while (i < HTTP_N_CODES - 1 && http_codes[i] != status)
        i++;
    atomic_fetch_add(&s->responses[i], 1);
}

bool http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
