/* ofl_nvme_io.c - the NVMe tier's thread: it owns the ring and does every slot I/O.
 *
 * Loop: take the whole queue of accepted operations under the lock (operations on a slot
 * that was dropped meanwhile complete with -ENOENT without I/O), write the index records
 * buffered so far, prepare one SQE per operation (write_fixed/read_fixed on the
 * registered bounce buffers and file) and submit them with one io_uring_submit_and_wait
 * call, which also waits for the first completion. A batch with writes is submitted first
 * and its pages checksummed while the device works: the caller only copied them, so a
 * write costs its caller one memcpy and the hash overlaps the I/O. An eventfd read sits in the ring
 * so an operation accepted while the thread waits wakes it: callers write the eventfd only when
 * they find the queue empty, and the thread takes the whole queue after every wake-up, so
 * no wake-up is lost and a busy queue costs callers no syscall. Completions are reaped in
 * a batch and finished together: reads are verified against their checksum and copied out
 * of the bounce buffer (unless they landed in a 4 KiB-aligned destination directly: then
 * the copy, about a quarter of the tier thread's work per page, is saved), writes on a buffered
 * (non-O_DIRECT) file get one fdatasync for the batch before their index records are written, so
 * the index never claims a slot whose data is only in the page cache; a per-batch sync costs one
 * device flush per batch instead of one per page.
 *
 * Without io_uring (seccomp, old kernels, or uring = 0) the same loop runs with pread and
 * pwrite, one operation at a time, sleeping on a blocking read of the eventfd.
 *
 * A short transfer is a failure: the entry is dropped. For a write, the tail is written
 * once more only to learn why it stopped (see io_short_write), so that a disk that filled
 * mid-write stops the tier instead of failing one write after another with -EIO.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "offload/ofl_nvme_impl.h"

/* Take the queue. Operations whose slot is DEAD complete at once (no I/O, -ENOENT) and
 * are put on the done list here; the rest are returned in order. */
static struct ofl_tag *io_take(struct ofl_nvme *n, bool *stopping) {
    struct ofl_tag *head = NULL, **tail = &head;
    bool done_some = false;
    pthread_mutex_lock(&n->lock);
    struct ofl_tag *t = n->q_head;
    n->q_head = n->q_tail = NULL;
    *stopping = n->stopping;
    uint64_t now = 0;
    while (t) {
        struct ofl_tag *next = t->next;
        if (n->slots[t->slot].state == OFL_SLOT_DEAD) {
            now = now ? now : ofl_nvme_now_ns();
            t->rc = -ENOENT;
            ofl_nvme_complete_locked(n, t, now);
            done_some = true;
        } else {
            t->next = NULL;
            *tail = t;
            tail = &t->next;
        }
        t = next;
    }
    if (done_some)
        pthread_cond_broadcast(&n->cpl_cv);
    pthread_mutex_unlock(&n->lock);
    return head;
}

/* The fault hook: the result to use for this completed I/O of op. */
static int io_fault(struct ofl_nvme *n, int op, int res) {
    if (!atomic_load_explicit(&n->fault_armed, memory_order_relaxed))
        return res;
    pthread_mutex_lock(&n->lock);
    if (n->fault_nth[op] && --n->fault_nth[op] == 0) {
        res = n->fault_res[op];
        atomic_store(&n->fault_armed, n->fault_nth[OFL_NVME_WRITE] || n->fault_nth[OFL_NVME_READ]);
    }
    pthread_mutex_unlock(&n->lock);
    return res;
}

static int io_write_rc(int res) {
    return res == -ENOSPC || res == -EFBIG || res == -EDQUOT ? -ENOSPC : -EIO;
}

/* A write came back short (0 <= res < io_len). The kernel stops early at a limit and tells
 * why only on the next call, so the tail is written again with pwrite: its errno is the
 * cause (ENOSPC, EFBIG, EDQUOT: the disk is full). The entry fails either way: -EIO unless
 * the tail says the disk is full. Rare, so done synchronously on the tier thread. */
static int io_short_write(struct ofl_nvme *n, const struct ofl_tag *t, int res) {
    uint32_t from = (uint32_t)res & ~(OFL_ALIGN - 1); /* O_DIRECT wants aligned offsets */
    ssize_t w = pwrite(n->fd, t->buf + from, t->io_len - from, (off_t)t->slot * n->stride + from);
    return w < 0 ? io_write_rc(-errno) : -EIO;
}

/* Turn the raw results of a batch into completion codes and hand the batch back. Reads are
 * verified and copied here, outside the lock; busy_ns is the I/O time this batch adds. */
static void io_finish(struct ofl_nvme *n, struct ofl_tag *batch, uint64_t busy_ns) {
    bool synced_writes = false;
    for (struct ofl_tag *t = batch; t; t = t->next) {
        int res = io_fault(n, t->op, t->res);
        if (t->op == OFL_NVME_WRITE) {
            t->rc = res == (int)t->io_len ? 0
                    : res >= 0            ? io_short_write(n, t, res)
                                          : io_write_rc(res);
            synced_writes |= t->rc == 0;
        } else if (res != (int)t->io_len) {
            t->rc = -EIO;
        } else if (XXH3_64bits(t->into_dst ? t->dst : t->buf, t->len) != t->csum) {
            t->rc = -EBADMSG;
        } else {
            if (!t->into_dst)
                memcpy(t->dst, t->buf, t->len);
            t->rc = 0;
        }
        if (t->rc)
            LOG_DEBUG("ofl", "nvme %s: %s of slot %u: result %d of %u bytes", n->path,
                      t->op == OFL_NVME_WRITE ? "write" : "read", t->slot, res, t->io_len);
        /* a full disk is logged where it stops the tier; any other failed write says
         * why once (EPERM, EIO...), or a tier failing every write goes unnoticed */
        if (t->op == OFL_NVME_WRITE && t->rc == -EIO && !n->write_err_logged) {
            n->write_err_logged = true;
            LOG_WARN("ofl",
                     "nvme %s: writing slot %u failed (%s): entry dropped; later write "
                     "failures are only counted (ofl_nvme_write_failures_total)",
                     n->path, t->slot, res < 0 ? strerror(-res) : "short write");
        }
    }
    if (synced_writes && !n->direct && fdatasync(n->fd) != 0) {
        int e = errno;
        LOG_WARN("ofl", "nvme %s: fdatasync after a batch of writes: %s: the batch is dropped",
                 n->path, strerror(e));
        for (struct ofl_tag *t = batch; t; t = t->next)
            if (t->op == OFL_NVME_WRITE && t->rc == 0)
                t->rc = io_write_rc(-e);
    }
    uint64_t now = ofl_nvme_now_ns();
    pthread_mutex_lock(&n->lock);
    n->c.busy_ns_total += busy_ns;
    while (batch) {
        struct ofl_tag *next = batch->next;
        ofl_nvme_complete_locked(n, batch, now);
        batch = next;
    }
    pthread_cond_broadcast(&n->cpl_cv);
    pthread_mutex_unlock(&n->lock);
    ofl_nvme_idx_flush(n);
}

/* ---- io_uring ---- */

static void io_prep(struct ofl_nvme *n, struct io_uring_sqe *sqe, struct ofl_tag *t) {
    int fd = n->fixed_file ? 0 : n->fd;
    uint64_t off = (uint64_t)t->slot * n->stride;
    if (t->op == OFL_NVME_WRITE) {
        if (n->fixed_buffers)
            io_uring_prep_write_fixed(sqe, fd, t->buf, t->io_len, off, (int)t->i);
        else
            io_uring_prep_write(sqe, fd, t->buf, t->io_len, off);
    } else if (t->into_dst) {
        io_uring_prep_read(sqe, fd, t->dst, t->io_len, off);
    } else if (n->fixed_buffers) {
        io_uring_prep_read_fixed(sqe, fd, t->buf, t->io_len, off, (int)t->i);
    } else {
        io_uring_prep_read(sqe, fd, t->buf, t->io_len, off);
    }
    if (n->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, t->i);
}

/* An SQE; the ring has qd + 2 entries and at most qd + 1 are ever in flight, so this only
 * submits to make room if something is badly off. */
static struct io_uring_sqe *io_sqe(struct ofl_nvme *n) {
    struct io_uring_sqe *sqe;
    while (!(sqe = io_uring_get_sqe(&n->ring)))
        io_uring_submit(&n->ring);
    return sqe;
}

static void io_loop_uring(struct ofl_nvme *n) {
    uint32_t in_flight = 0;
    bool efd_armed = false;
    uint64_t busy_t0 = 0;
    for (;;) {
        bool stopping;
        struct ofl_tag *list = io_take(n, &stopping);
        ofl_nvme_idx_flush(n);
        bool writes = false;
        for (struct ofl_tag *t = list; t; t = t->next) {
            io_prep(n, io_sqe(n), t);
            in_flight++;
            writes |= t->op == OFL_NVME_WRITE;
        }
        if (writes) {
            /* Checksum the pages while the device writes them: the bounce buffers are
             * only read on both sides, and the sum is needed at completion, not before. */
            io_uring_submit(&n->ring);
            if (in_flight && !busy_t0)
                busy_t0 = ofl_nvme_now_ns();
            for (struct ofl_tag *t = list; t; t = t->next)
                if (t->op == OFL_NVME_WRITE)
                    t->csum = XXH3_64bits(t->buf, t->len);
        }
        if (stopping && in_flight == 0)
            break;
        if (!efd_armed && !stopping) {
            struct io_uring_sqe *sqe = io_sqe(n);
            io_uring_prep_read(sqe, n->efd, &n->efd_val, sizeof n->efd_val, 0);
            io_uring_sqe_set_data64(sqe, OFL_EFD_TAG);
            efd_armed = true;
        }
        if (in_flight && !busy_t0)
            busy_t0 = ofl_nvme_now_ns();
        int ret = io_uring_submit_and_wait(&n->ring, 1);
        if (ret < 0 && ret != -EINTR) {
            /* Nothing was lost: the SQEs stay in the ring for the next call. */
            if (!n->submit_err_logged)
                LOG_ERROR("ofl", "nvme %s: io_uring_submit_and_wait: %s (retrying)", n->path,
                          strerror(-ret));
            n->submit_err_logged = true;
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        }
        struct ofl_tag *done = NULL, **tail = &done;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&n->ring, head, cqe) {
            seen++;
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            if (ud == OFL_EFD_TAG) {
                efd_armed = false;
                continue;
            }
            struct ofl_tag *t = &n->tags[ud];
            t->res = cqe->res;
            t->next = NULL;
            *tail = t;
            tail = &t->next;
            in_flight--;
        }
        io_uring_cq_advance(&n->ring, seen);
        if (done) {
            uint64_t busy = 0;
            if (in_flight == 0 && busy_t0) {
                busy = ofl_nvme_now_ns() - busy_t0;
                busy_t0 = 0;
            }
            io_finish(n, done, busy);
        }
    }
}

/* ---- pread / pwrite ---- */

static void io_loop_sync(struct ofl_nvme *n) {
    for (;;) {
        bool stopping;
        struct ofl_tag *list = io_take(n, &stopping);
        ofl_nvme_idx_flush(n);
        if (!list) {
            if (stopping)
                break;
            eventfd_t v;
            while (eventfd_read(n->efd, &v) != 0 && errno == EINTR)
                ;
            continue;
        }
        uint64_t t0 = ofl_nvme_now_ns();
        for (struct ofl_tag *t = list; t; t = t->next) {
            off_t off = (off_t)t->slot * n->stride;
            if (t->op == OFL_NVME_WRITE)
                t->csum = XXH3_64bits(t->buf, t->len);
            ssize_t r;
            do {
                r = t->op == OFL_NVME_WRITE
                        ? pwrite(n->fd, t->buf, t->io_len, off)
                        : pread(n->fd, t->into_dst ? t->dst : t->buf, t->io_len, off);
            } while (r < 0 && errno == EINTR);
            t->res = r < 0 ? -errno : (int)r;
        }
        io_finish(n, list, ofl_nvme_now_ns() - t0);
    }
}

void *ofl_nvme_thread(void *arg) {
    struct ofl_nvme *n = arg;
    if (n->thread_init)
        n->thread_init(n->thread_ctx);
    if (n->uring)
        io_loop_uring(n);
    else
        io_loop_sync(n);
    return NULL;
}
