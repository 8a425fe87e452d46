/* Sampler tests: greedy tie-breaking, filters, and seed reproducibility. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "engine/model/smp.h"

Test(smp, greedy_takes_lowest_id_on_tie) {
    float l[6] = {1.0f, 3.0f, NAN, 3.0f, -INFINITY, 2.0f};
    cr_assert_eq(smp_argmax(l, 6), 1, "argmax %d", smp_argmax(l, 6));
    struct smp *s;
    struct smp_params p = smp_params_default();
    cr_assert_eq(smp_create(&p, 6, &s), 0);
    cr_assert_eq(smp_sample(s, l), 1);
    smp_destroy(s);
}

Test(smp, top_k_one_is_greedy) {
    float l[5] = {0.5f, 0.1f, 2.5f, 2.4f, -1.0f};
    struct smp_params p = {
        .temperature = 1.5f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .seed = 7};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 5, &s), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(smp_sample(s, l), 2);
    smp_destroy(s);
}

Test(smp, min_p_removes_unlikely_ids) {
    /* p(0) ~ 0.73, p(1) ~ 0.27, p(2) ~ 3e-5: min_p 0.1 keeps only ids 0 and 1 */
    float l[3] = {11.0f, 10.0f, 0.5f};
    struct smp_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.1f, .seed = 3};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 3, &s), 0);
    int counts[3] = {0};
    for (int i = 0; i < 4000; i++)
        counts[smp_sample(s, l)]++;
    cr_assert_eq(counts[2], 0, "id 2 drawn %d times", counts[2]);
    /* expected 0.731 of 4000 = 2924, binomial sd ~ 28 */
    cr_assert(counts[0] > 2750 && counts[0] < 3100, "id 0 drawn %d times", counts[0]);
    smp_destroy(s);
}

Test(smp, top_p_keeps_the_nucleus) {
    float l[4] = {3.0f, 2.9f, 0.0f, -1.0f}; /* p ~ .50 .45 .03 .01 */
    struct smp_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 11};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 4, &s), 0);
    for (int i = 0; i < 2000; i++) {
        int32_t id = smp_sample(s, l);
        cr_assert(id == 0 || id == 1, "drew %d outside the nucleus", id);
    }
    smp_destroy(s);
}

Test(smp, same_seed_same_ids) {
    float l[64];
    for (int i = 0; i < 64; i++)
        l[i] = sinf((float)i);
    struct smp_params p = {
        .temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .min_p = 0.0f, .seed = 42};
    struct smp *a, *b;
    cr_assert_eq(smp_create(&p, 64, &a), 0);
    cr_assert_eq(smp_create(&p, 64, &b), 0);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = smp_sample(a, l), y = smp_sample(b, l);
        cr_assert_eq(x, y, "step %d: %d vs %d", i, x, y);
    }
    p.seed = 43;
    struct smp *c;
    cr_assert_eq(smp_create(&p, 64, &c), 0);
    for (int i = 0; i < 50; i++)
        differ += smp_sample(a, l) != smp_sample(c, l);
    cr_assert(differ > 0, "a different seed must give a different sequence");
    smp_destroy(a);
    smp_destroy(b);
    smp_destroy(c);
}

Test(smp, rejects_bad_params) {
    struct smp *s = NULL;
    struct smp_params p = smp_params_default();
    cr_assert_eq(smp_create(&p, 0, &s), -EINVAL);
    p.top_p = 1.5f;
    cr_assert_eq(smp_create(&p, 10, &s), -EINVAL);
    cr_assert_null(s);
}
