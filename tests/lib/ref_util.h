/* ref.h - test helpers: the shared models folder and reference.jsonl. */
#ifndef LLMD_TEST_REF_H
#define LLMD_TEST_REF_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_MODELS "../shared/models"

/* All lines of reference.jsonl as a JSON array; the test fails when the file
 * is missing. Caller frees with json_decref(). */
static inline json_t *ref_load_all(void) {
    FILE *f = fopen(REF_MODELS "/reference.jsonl", "r");
    if (!f)
        return NULL;
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        if (j)
            json_array_append_new(arr, j);
    }
    free(line);
    fclose(f);
    return arr;
}

/* The line with this model file and case, or NULL (borrowed from all). */
static inline json_t *ref_find(json_t *all, const char *model, const char *kase) {
    size_t i;
    json_t *j;
    json_array_foreach(all, i, j) {
        if (strcmp(json_string_value(json_object_get(j, "model")), model) == 0 &&
            strcmp(json_string_value(json_object_get(j, "case")), kase) == 0)
            return j;
    }
    return NULL;
}

/* Copy a JSON int array into out[max]; returns its length. */
static inline size_t ref_ids(json_t *arr, int32_t *out, size_t max) {
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n && i < max; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return n;
}

static const char *const ref_cases[] = {
    "empty", "once", "single_word", "sentence", "long", "punct_digits_utf8", "long_neartie"};
#define REF_N_CASES 7

#endif /* LLMD_TEST_REF_H */
