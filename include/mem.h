/* mem.h - the one funnel for host heap allocations in llmd.
 *
 * Every module allocates through mem_alloc()/mem_free() with its tag, so that
 * (a) the bytes each module holds are counted and can be reported
 * (mem_bytes(), INFO section "# mem"), and (b) a test can make the N-th
 * allocation fail (mem_fail_nth()) and prove the error path leaves nothing
 * behind. Source of the idea: redis zmalloc, sqlite's N-th malloc fault
 * injection (https://sqlite.org/testing.html §3.1).
 *
 * Every block is 64-byte aligned (a 64-byte header precedes it), so kernels
 * can use aligned loads on any buffer from here.
 *
 * Thread safety: all functions may be called from any thread at once; the
 * counters are atomics. The fault hook is meant for single-threaded tests.
 */
#ifndef LLMD_MEM_H
#define LLMD_MEM_H

#include <stddef.h>
#include <stdint.h>

enum mem_tag {
    MEM_MISC = 0,
    MEM_VMM,
    MEM_OFL,
    MEM_GGUF,
    MEM_TOK,
    MEM_MODEL,
    MEM_KERN,
    MEM_SMP,
    MEM_SCHED,
    MEM_CLI,
    MEM_TEST,
    MEM_PFX,
    MEM_HTTP,
    MEM_KVEV,
    MEM_N_TAGS,
};

/* Allocate `bytes` (0 is allowed and returns a unique pointer) aligned to 64 B.
 * Returns NULL on failure (real or injected); never aborts.
 * The caller frees with mem_free(). */
void *mem_alloc(enum mem_tag tag, size_t bytes);

/* As mem_alloc(), for a large, long-lived buffer that kernels stream
 * through (packed weights): its own anonymous mapping, 2 MiB aligned and
 * advised MADV_HUGEPAGE, so that with transparent huge pages in "madvise"
 * mode (Debian's default) the kernel backs it with 2 MiB pages where it
 * can: fewer TLB misses, and fewer restarts of hardware prefetchers that
 * stop at a 4 KiB page's end (on a Zen 3, q4_0 decode ran 1.11-1.17x
 * faster with its packs so: docs/benchmarks.md, "Packs on huge pages").
 * The mapping is rounded up to 2 MiB, so use it for one large block, not
 * many small ones; a block of at most 1 MiB (with its 64-byte header) is
 * a plain mem_alloc() block instead, where a huge page would cost more
 * memory than it holds. Not zeroed (callers write every byte). Under ASan
 * the mapping's slack past the block is poisoned (an overread fails the
 * run, as past a heap block's redzone). Counted, failed by mem_fail_nth()
 * and freed by mem_free() as any block; mem_realloc() moves it to the
 * heap. NULL on failure. */
void *mem_alloc_huge(enum mem_tag tag, size_t bytes);

/* As mem_alloc() for n * size bytes, zeroed. NULL on overflow or failure. */
void *mem_calloc(enum mem_tag tag, size_t n, size_t size);

/* Resize a block from this funnel (p may be NULL). On failure returns NULL
 * and p is left valid and unchanged. The tag of p is kept. */
void *mem_realloc(void *p, size_t bytes);

/* Free a block from this funnel; NULL is a no-op. */
void mem_free(void *p);

/* Copy of the NUL-terminated s, or of its first n bytes plus a NUL.
 * NULL on failure. Caller frees with mem_free(). */
char *mem_strdup(enum mem_tag tag, const char *s);
char *mem_strndup(enum mem_tag tag, const char *s, size_t n);

/* Bytes currently held by `tag` (payload only, headers excluded). */
uint64_t mem_bytes(enum mem_tag tag);

/* Name of a tag ("vmm", "gguf", ...), for reports. */
const char *mem_tag_name(enum mem_tag tag);

/* Test hook: make the n-th allocation from now fail (n >= 1); 0 disables.
 * Counts every mem_alloc/mem_calloc/mem_realloc/mem_strdup call. */
void mem_fail_nth(uint64_t n);

/* Allocations attempted since the process started; tests use the delta to
 * learn how many fault points an operation has. */
uint64_t mem_calls(void);

#endif /* LLMD_MEM_H */
