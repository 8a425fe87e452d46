/* tok_bpe.c - GPT-2 byte-level BPE. Not implemented yet: tok_create()
 * refuses gpt2 vocabularies with -ENOTSUP until it lands. */
#include "engine/tok_impl.h"

#include <errno.h>
#include <stdio.h>

int tok_bpe_init(struct tok *t, char *errbuf, size_t errlen) {
    (void)t;
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "gpt2 tokenizer not implemented yet");
    return -ENOTSUP;
}

void tok_bpe_fini(struct tok *t) {
    (void)t;
}

int tok_bpe_encode(const struct tok *t, const char *text, size_t len, struct tok_out *o) {
    (void)t, (void)text, (void)len, (void)o;
    return -ENOTSUP;
}

size_t tok_bpe_decode(const char *s, size_t n, char *out) {
    (void)s, (void)n, (void)out;
    return 0;
}
