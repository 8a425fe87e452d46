/* stat_util.h - goodness-of-fit helpers for the statistical tests
 * (speculative sampling must keep the target's distribution).
 *
 * Pearson's chi-square statistic over cells with expected counts, and its
 * p-value from the regularized upper incomplete gamma function
 * Q(df/2, x/2), computed as Numerical Recipes (Press et al., 3rd ed.,
 * 6.2) does: the series for x < a + 1, Lentz's continued fraction beyond.
 * A test that asserts p > alpha fails a correct implementation with
 * probability alpha: each caller states its alpha. Cells whose expected
 * count is under 5 are pooled into one (the usual validity rule).
 */
#ifndef LLMD_TEST_STAT_UTIL_H
#define LLMD_TEST_STAT_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0. */
static inline double stat_gamma_q(double a, double x) {
    if (x <= 0)
        return 1.0;
    double lg = lgamma(a);
    if (x < a + 1) { /* series for P, then Q = 1 - P */
        double ap = a, del = 1.0 / a, sum = del;
        for (int n = 0; n < 10000; n++) {
            ap += 1;
            del *= x / ap;
            sum += del;
            if (fabs(del) < fabs(sum) * 1e-15)
                break;
        }
        return 1.0 - sum * exp(-x + a * log(x) - lg);
    }
    double b = x + 1 - a, c = 1 / 1e-300, d = 1 / b, h = d; /* continued fraction */
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300)
            d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300)
            c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15)
            break;
    }
    return exp(-x + a * log(x) - lg) * h;
}

/* Pearson's test of observed[0..n) against probabilities p[0..n) (summing
 * to 1) over `total` draws. Cells expected under 5 are pooled; a pool still
 * under 5 joins the smallest other cell. Returns the p-value; *chi2 and
 * *df (may be NULL) get the statistic and the degrees of freedom. A cell
 * with p = 0 but observed > 0 gives p-value 0. */
static inline double stat_chi2_p(const uint64_t *observed, const double *p, uint32_t n,
                                 uint64_t total, double *chi2, uint32_t *df) {
    double pool_e = 0, pool_o = 0, small_e = INFINITY;
    uint32_t small = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        double e = p[i] * (double)total;
        if (e == 0 && observed[i] > 0)
            return 0.0;
        if (e < 5) {
            pool_e += e;
            pool_o += (double)observed[i];
        } else if (e < small_e) {
            small_e = e;
            small = i;
        }
    }
    bool merge = pool_e > 0 && pool_e < 5 && small != UINT32_MAX;
    double x = 0;
    uint32_t cells = 0;
    for (uint32_t i = 0; i < n; i++) {
        double e = p[i] * (double)total, o = (double)observed[i];
        if (e < 5)
            continue;
        if (merge && i == small) {
            e += pool_e;
            o += pool_o;
        }
        x += (o - e) * (o - e) / e;
        cells++;
    }
    if (pool_e > 0 && !merge) {
        x += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    uint32_t d = cells > 1 ? cells - 1 : 1;
    if (chi2)
        *chi2 = x;
    if (df)
        *df = d;
    return stat_gamma_q(d / 2.0, x / 2.0);
}

#endif /* LLMD_TEST_STAT_UTIL_H */
