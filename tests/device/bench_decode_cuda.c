/* bench_decode_cuda.c - the GPU timing table of tests/device/run.sh:
 * decode throughput against the HBM roofline, and spill/restore bandwidth
 * against cudaMemcpy on the same buffers. Real driver only.
 *
 *  roofline   cudaMemcpy device-to-device of 2 GiB: (read + write bytes) / t,
 *             the bandwidth a decode step (a pure read of the weights) can
 *             approach; median of 10.
 *  decode     MODEL (default dummy:llama3-8b-2l, f16: two layers of Llama-3-8B and
 *             its 1 GB classifier, built in seconds; dummy:llama3-8b is all 32) with f16 KV on the
 * GPU: batch 1, 32-token prompt, 32 timed decode steps per run, 5 runs: median step time -> tok/s,
 * and bytes read per step (every weight but the embedding table, plus the KV read) / step time /
 * roofline = the fraction of the roofline reached. Batch 64: 64 sequences decoding together, tok/s.
 *  spill      vmm_page_read (the cuda backend's xfer, D2H) and
 *  restore    vmm_page_restore (H2D) of 64 pages of 2 MiB from/to pinned host
 *             memory, against cudaMemcpy of the same bytes between the same
 *             buffers; median of 5.
 *
 * Prints a table; with $OUT set, writes it to $OUT/device/bench_decode.txt.
 * Checks (counted in the last line "N passed, N failed, N skipped"): the
 * batch-1 decode reaches >= 0.6 of the roofline (issue 7's bar); spill and
 * restore reach >= 0.5 of cudaMemcpy. Without a GPU: a skip line, exit 0.
 * Usage: bench_decode_cuda [MODEL]
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "kernels/kern.h"
#include "log.h"
#include "tests/device/dev_bench.h"
#include "vmm/vmm.h"

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    dev_say("%s: %s\n", ok ? "ok" : "FAIL", what);
    ok ? n_pass++ : n_fail++;
}

struct dec {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
};

static void dec_close(struct dec *d) {
    model_ctx_destroy(d->ctx);
    kern_pool_destroy(d->pool);
    kv_cache_destroy(d->kv);
    d->ctx = NULL;
    d->pool = NULL;
    d->kv = NULL;
}

/* A KV cache and a GPU context over the loaded model m (borrowed). */
static int dec_open(struct dec *d, struct model *m, uint32_t n_seqs, uint32_t max_tok) {
    char err[512] = "";
    memset(d, 0, sizeof(*d));
    d->m = m;
    struct kv_config kc = {.dtype = KV_F16, .n_ctx = 1024, .n_seqs = n_seqs, .device = KV_DEV_CUDA};
    int rc = kv_cache_create(&d->m->hp, &kc, &d->kv, err, sizeof(err));
    if (rc == 0 && (rc = kern_pool_create(1, &d->pool)) == 0 &&
        (rc = model_ctx_create(d->m, d->pool, max_tok, &d->ctx)) == 0)
        rc = model_ctx_use_cuda(d->ctx, d->kv, 0, n_seqs, err, sizeof(err));
    if (rc) {
        dev_say("decode: setup for %u sequences failed: %s (%s)\n", n_seqs, err, strerror(-rc));
        dec_close(d); /* give the device memory back before the next attempt */
    }
    return rc;
}

/* Median seconds of one decode step of n_seqs sequences, each with a
 * 32-token prompt, over 5 runs of 32 steps. */
static double dec_time(struct dec *d, uint32_t n_seqs) {
    enum { PROMPT = 32, STEPS = 32, RUNS = 5 };
    uint32_t nv = d->m->hp.n_vocab;
    float *logits = malloc((size_t)n_seqs * nv * sizeof(float));
    struct model_batch_seq *b = calloc(n_seqs, sizeof(*b));
    int32_t *toks = calloc((size_t)n_seqs * PROMPT, sizeof(int32_t));
    double t[RUNS * STEPS];
    int nt = 0, rc = 0;
    for (int run = 0; rc == 0 && run < RUNS; run++) {
        uint32_t opened = 0;
        for (uint32_t s = 0; rc == 0 && s < n_seqs; s++) {
            uint32_t seq;
            if ((rc = kv_seq_open(d->kv, &seq)))
                break;
            b[opened++].seq = seq;
            if ((rc = kv_seq_reserve(d->kv, seq, PROMPT + STEPS)))
                break;
            for (int i = 0; i < PROMPT; i++)
                toks[s * PROMPT + i] = 1 + (int32_t)((s * 131 + (uint32_t)i * 17) % (nv - 1));
            b[s] = (struct model_batch_seq){.seq = seq,
                                            .pos0 = 0,
                                            .n_tok = PROMPT,
                                            .tokens = &toks[s * PROMPT],
                                            .logits = logits + (size_t)s * nv};
        }
        if (rc == 0)
            rc = model_forward_batch(d->ctx, d->kv, b, n_seqs);
        for (int i = 0; rc == 0 && i < STEPS; i++) {
            for (uint32_t s = 0; s < n_seqs; s++) {
                b[s].pos0 = PROMPT + (uint32_t)i;
                b[s].n_tok = 1;
                b[s].tokens = &toks[s * PROMPT + (uint32_t)i % PROMPT];
            }
            double t0 = dev_now_s();
            rc = model_forward_batch(d->ctx, d->kv, b, n_seqs);
            t[nt++] = dev_now_s() - t0;
        }
        for (uint32_t s = 0; s < opened; s++)
            kv_seq_close(d->kv, b[s].seq);
    }
    free(logits);
    free(b);
    free(toks);
    if (rc) {
        dev_say("decode: a forward pass failed: %s\n", strerror(-rc));
        return 0;
    }
    return dev_median(t, nt);
}

static void bench_decode(const char *model, double roof) {
    struct model *m = NULL;
    char err[512] = "";
    double t0 = dev_now_s();
    int rc = model_load(model, &(struct model_load_opts){.quiet = true, .no_pack = true}, &m, err,
                        sizeof(err));
    if (rc) {
        dev_say("decode: cannot load %s: %s\n", model, err);
        check(0, "decode model loads");
        return;
    }
    dev_say("model   %s: %.1f GB of weights, built/loaded in %.1f s\n", model,
            (double)m->weight_bytes / 1e9, dev_now_s() - t0);
    struct dec d;
    if (dec_open(&d, m, 1, 32) == 0) {
        const struct model_hparams *hp = &m->hp;
        uint64_t emb =
            gguf_type_bytes((enum gguf_ttype)m->tok_embd.type, (uint64_t)hp->n_vocab * hp->n_embd);
        uint64_t bytes = m->weight_bytes - (m->output_tied ? 0 : emb);
        bytes += (uint64_t)48 *
                 model_kv_token_bytes(
                     hp, kern_kv_row_bytes(KERN_KV_F16, (int)hp->n_head_kv,
                                           (int)hp->head_dim)); /* mean KV read of the steps */
        double t1 = dec_time(&d, 1);
        double frac = t1 > 0 ? (double)bytes / t1 / roof : 0;
        dev_say("decode  batch  1: %8.1f tok/s  %7.3f ms/step  %6.2f GB read/step  %6.0f GB/s  "
                "%.2f of roofline\n",
                t1 > 0 ? 1.0 / t1 : 0, t1 * 1e3, (double)bytes / 1e9,
                t1 > 0 ? (double)bytes / t1 / 1e9 : 0, frac);
        char what[160];
        snprintf(what, sizeof(what), "batch-1 decode reaches %.2f of the HBM roofline (>= 0.6)",
                 frac);
        check(frac >= 0.6, what);
        dec_close(&d);
    } else {
        check(0, "decode setup");
    }
    if (dec_open(&d, m, 64, 64 * 32) == 0) {
        double t64 = dec_time(&d, 64);
        dev_say("decode  batch 64: %8.1f tok/s  %7.3f ms/step\n", t64 > 0 ? 64.0 / t64 : 0,
                t64 * 1e3);
        check(t64 > 0, "batch-64 decode runs");
        dec_close(&d);
    } else {
        check(0, "batch-64 decode setup");
    }
    model_free(m);
}

/* Spill (vmm_page_read) and restore (vmm_page_restore) of N pages against
 * cudaMemcpy of the same bytes between the same buffers. */
static void bench_xfer(void) {
    enum { N = 64, RUNS = 5 };
    struct vmm_backend *b = NULL;
    struct vmm *v = NULL;
    char err[256] = "";
    int rc = vmm_cuda_backend_create(0, &b);
    struct vmm_config vc = {.backend = b,
                            .token_bytes = 2 << 20,
                            .page_bytes = 2 << 20,
                            .n_pages = N + 1,
                            .n_ranges = 1,
                            .max_tokens = N};
    if (rc == 0)
        rc = vmm_create(&vc, &v, err, sizeof(err));
    size_t P = 2u << 20;
    void *host = NULL, *dev = NULL;
    if (rc == 0 && (cudaMallocHost(&host, (size_t)N * P) != cudaSuccess ||
                    cudaMalloc(&dev, (size_t)N * P) != cudaSuccess))
        rc = -ENOMEM;
    uint32_t r, pages[N];
    if (rc == 0)
        rc = vmm_range_acquire(v, &r);
    if (rc == 0)
        rc = vmm_range_grow(v, r, N);
    if (rc) {
        dev_say("xfer: setup failed: %s %s\n", err, strerror(-rc));
        check(0, "xfer setup");
        goto out;
    }
    for (uint32_t i = 0; i < N; i++)
        pages[i] = vmm_range_page(v, r, i);
    double ts[RUNS], tr[RUNS], md[RUNS], mh[RUNS];
    for (int k = 0; rc == 0 && k < RUNS; k++) {
        double t0 = dev_now_s();
        for (uint32_t i = 0; rc == 0 && i < N; i++)
            rc = vmm_page_read(v, pages[i], (char *)host + (size_t)i * P);
        ts[k] = dev_now_s() - t0;
        t0 = dev_now_s();
        cudaMemcpy(host, dev, (size_t)N * P, cudaMemcpyDeviceToHost);
        md[k] = dev_now_s() - t0;
        t0 = dev_now_s();
        cudaMemcpy(dev, host, (size_t)N * P, cudaMemcpyHostToDevice);
        mh[k] = dev_now_s() - t0;
    }
    /* restores: free the range's pages, then fill them back from host */
    if (rc == 0)
        rc = vmm_range_release(v, r);
    for (int k = 0; rc == 0 && k < RUNS; k++) {
        uint32_t got[N];
        double t0 = dev_now_s();
        for (uint32_t i = 0; rc == 0 && i < N; i++)
            rc = vmm_page_restore(v, (char *)host + (size_t)i * P, &got[i]);
        tr[k] = dev_now_s() - t0;
        for (uint32_t i = 0; rc == 0 && i < N; i++)
            rc = vmm_page_restore_abort(v, got[i]);
    }
    if (rc) {
        dev_say("xfer: a copy failed: %s\n", strerror(-rc));
        check(0, "xfer copies");
        goto out;
    }
    double bytes = (double)N * (double)P;
    double s = bytes / dev_median(ts, RUNS), rr = bytes / dev_median(tr, RUNS);
    double d2h = bytes / dev_median(md, RUNS), h2d = bytes / dev_median(mh, RUNS);
    dev_say("spill   vmm_page_read     %7.1f GB/s   cudaMemcpy D2H %7.1f GB/s   ratio %.2f\n",
            s / 1e9, d2h / 1e9, s / d2h);
    dev_say("restore vmm_page_restore  %7.1f GB/s   cudaMemcpy H2D %7.1f GB/s   ratio %.2f\n",
            rr / 1e9, h2d / 1e9, rr / h2d);
    check(s / d2h >= 0.5, "spill reaches >= 0.5 of cudaMemcpy D2H on the same buffers");
    check(rr / h2d >= 0.5, "restore reaches >= 0.5 of cudaMemcpy H2D on the same buffers");
out:
    cudaFreeHost(host);
    cudaFree(dev);
    vmm_destroy(v);
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "dummy:llama3-8b-2l";
    log_set_level(LOG_LEVEL_WARN);
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        printf("cuda unavailable: %s\n0 passed, 0 failed, 1 skipped\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 0;
    }
    dev_out_open("bench_decode.txt");
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    double roof = dev_d2d_bps(2ull << 30, 1, 10);
    dev_say("device  %s, %.1f GiB\n", prop.name, (double)prop.totalGlobalMem / (1u << 30));
    dev_say("roofline cudaMemcpy D2D 2 GiB: %.0f GB/s (read + write, median of 10)\n", roof / 1e9);
    double t0 = dev_now_s();
    bench_decode(model, roof);
    bench_xfer();
    dev_say("bench_decode_cuda: %.1f s\n", dev_now_s() - t0);
    dev_say("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    if (dev_out)
        fclose(dev_out);
    return n_fail ? 1 : 0;
}
