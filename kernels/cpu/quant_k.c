/* quant_k.c - K-quant super-blocks: ggml's reference quantizers, row
 * dequantization, and the Q8_K activation quantizer.
 *
 * Formats: ggml-common.h block_q2_K / block_q3_K / block_q4_K / block_q5_K /
 * block_q6_K / block_q8_K
 * (QK_K = 256), described in kern_cpu.h; docs/gguf.md in ggml-org/ggml
 * lists the type ids. The algorithms are those of ggml-quants.c (llama.cpp
 * c392e50): quantize_row_q4_K_ref and q5_K_ref (per sub-block of 32 a
 * weighted least-squares search of scale and min, make_qkx2_quants; then
 * the 8 scales and 8 mins quantized to 6 bits against the block's largest,
 * and every value re-quantized against its rounded scale and min),
 * quantize_row_q6_K_ref (per group of 16 a search of the symmetric scale,
 * make_qx_quants with weights x^2; scales to int8 against the largest),
 * quantize_row_q2_K_ref (per group of 16 make_qkx2_quants with weights |x|
 * and absolute errors; 4-bit scales and mins against the largest),
 * quantize_row_q3_K_ref (per group of 16 make_q3_quants: levels refined
 * one at a time for the x^2-weighted fit; scales to 6 bits against the
 * largest), and quantize_row_q8_K_ref. This file is written from those
 * definitions, not copied; each float expression keeps ggml's operand
 * order, because a writer that matches llama-quantize byte for byte must
 * round the same way (llmd builds as ISO C, so nothing is contracted into
 * an fma; ggml-base, where these live, is built without FMA too). Rounding to an integer is
 * ggml's nearest_int: add 1.5 * 2^23 and read the mantissa, i.e. round half
 * to even, valid for |x| < 2^22.
 *
 * llama-quantize calls these reference functions when it has no importance
 * matrix, which is what `llmd dummy` reproduces. Scalar on purpose: they
 * run once per weight (writers, tests) or once per activation row.
 */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <string.h>

#define QK         KERN_QK_K
#define GROUP_EPS  1e-15f /* ggml's GROUP_MAX_EPS: below it a group is all zero */
#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

static int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- Q4_K / Q5_K ---- */

/* make_qkx2_quants: levels L[n] in 0..nmax and a scale s and offset -min
 * (returned in *the_min) minimising sum w (s L + min - x)^2 (use_mad: sum
 * w |s L + min - x|), searched over nstep + 1 trial scales (nmax + rmin +
 * rdelta * is) / (max - min). */
static float qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                         float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                         bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAXI(0, MINI(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float mad = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                mad += w[i] * (use_mad ? fabsf(diff) : diff * diff);
            }
            if (mad < best) {
                memcpy(L, Laux, (size_t)n);
                best = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* The common part of the Q4_K and Q5_K reference quantizers for one block
 * of x[256]: fills d, dmin, scales[12] and the levels L[256] in 0..nmax. */
static void quant_k4_block(const float *x, int nmax, float rmin, int nstep, uint16_t *d,
                           uint16_t *dmin, uint8_t *scales, uint8_t *L) {
    uint8_t Laux[32];
    float w[32], mins[QK / 32], sc[QK / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        sc[j] = qkx2_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep,
                            false);
        if (sc[j] > max_scale)
            max_scale = sc[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK / 32; j++) {
        /* ggml stores nearest_int into a uint8_t before the clamp */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * sc[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = MINI(63, ls);
        lm = MINI(63, lm);
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = kern_f32_to_f16_1(max_scale / 63.f);
    *dmin = kern_f32_to_f16_1(max_min / 63.f);
    for (int j = 0; j < QK / 32; j++) {
        int s, m;
        kern_cpu_scale_min_k4(scales, j, &s, &m);
        const float dj = kern_f16_to_f32_1(*d) * s;
        if (!dj)
            continue; /* the sub-block keeps the search's levels, as in ggml */
        const float dm = kern_f16_to_f32_1(*dmin) * m;
        for (int i = 0; i < 32; i++) {
            int l = nearest_int((x[32 * j + i] + dm) / dj);
            L[32 * j + i] = (uint8_t)MAXI(0, MINI(nmax, l));
        }
    }
}

void kern_quantize_row_q4_K(const float *x, void *dst, int n) {
    struct kern_blk_q4_K *y = dst;
    uint8_t L[QK];
    for (int b = 0; b < n / QK; b++, x += QK) {
        memset(y[b].scales, 0, sizeof(y[b].scales));
        quant_k4_block(x, 15, -1.f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
        for (int k = 0; k < QK / 64; k++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * k + l] = (uint8_t)(L[64 * k + l] | (L[64 * k + 32 + l] << 4));
    }
}

void kern_quantize_row_q5_K(const float *x, void *dst, int n) {
    struct kern_blk_q5_K *y = dst;
    uint8_t L[QK];
    for (int b = 0; b < n / QK; b++, x += QK) {
        memset(y[b].scales, 0, sizeof(y[b].scales));
        quant_k4_block(x, 31, -0.5f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
        memset(y[b].qh, 0, sizeof(y[b].qh));
        for (int k = 0; k < QK / 64; k++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * k + l], hi = L[64 * k + 32 + l];
                if (lo > 15) {
                    lo -= 16;
                    y[b].qh[l] |= (uint8_t)(1u << (2 * k));
                }
                if (hi > 15) {
                    hi -= 16;
                    y[b].qh[l] |= (uint8_t)(2u << (2 * k));
                }
                y[b].qs[32 * k + l] = (uint8_t)(lo | (hi << 4));
            }
    }
}

void kern_cpu_dequant_q4_K(const void *src, float *dst, int n) {
    const struct kern_blk_q4_K *b = src;
    for (int i = 0; i < n / QK; i++) {
        const float d = kern_f16_to_f32_1(b[i].d), min = kern_f16_to_f32_1(b[i].dmin);
        for (int j = 0; j < QK / 32; j++) {
            int s, m;
            kern_cpu_scale_min_k4(b[i].scales, j, &s, &m);
            const float dj = d * s, mj = min * m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++)
                *dst++ = dj * ((j & 1) ? q[l] >> 4 : q[l] & 0xF) - mj;
        }
    }
}

void kern_cpu_dequant_q5_K(const void *src, float *dst, int n) {
    const struct kern_blk_q5_K *b = src;
    for (int i = 0; i < n / QK; i++) {
        const float d = kern_f16_to_f32_1(b[i].d), min = kern_f16_to_f32_1(b[i].dmin);
        for (int j = 0; j < QK / 32; j++) {
            int s, m;
            kern_cpu_scale_min_k4(b[i].scales, j, &s, &m);
            const float dj = d * s, mj = min * m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = ((j & 1) ? q[l] >> 4 : q[l] & 0xF) + ((b[i].qh[l] >> j) & 1) * 16;
                *dst++ = dj * v - mj;
            }
        }
    }
}

/* ---- Q2_K ---- */

/* Levels 0..3 of a block, L[256], into qs[64] (Q2_K, and Q3_K's low bits):
 * the inverse of kern_cpu_q2_bits. */
static void pack_q2_bits(uint8_t *qs, const uint8_t *L) {
    for (int h = 0; h < QK / 128; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Lh = L + 128 * h;
            qs[32 * h + l] =
                (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
        }
}

void kern_quantize_row_q2_K(const float *x, void *dst, int n) {
    struct kern_blk_q2_K *y = dst;
    const float q4scale = 15.f;
    uint8_t L[QK], Laux[16];
    float w[16], mins[QK / 16], sc[QK / 16];
    for (int b = 0; b < n / QK; b++, x += QK) {
        float max_scale = 0, max_min = 0;
        for (int g = 0; g < QK / 16; g++) {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * g + l]);
            sc[g] = qkx2_quants(16, 3, x + 16 * g, w, L + 16 * g, &mins[g], Laux, -0.5f, 0.1f, 15,
                                true);
            if (sc[g] > max_scale)
                max_scale = sc[g];
            if (mins[g] > max_min)
                max_min = mins[g];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int g = 0; g < QK / 16; g++)
                y[b].scales[g] = (uint8_t)nearest_int(iscale * sc[g]);
            y[b].d = kern_f32_to_f16_1(max_scale / q4scale);
        } else {
            memset(y[b].scales, 0, sizeof(y[b].scales));
            y[b].d = kern_f32_to_f16_1(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int g = 0; g < QK / 16; g++)
                y[b].scales[g] |= (uint8_t)(nearest_int(iscale * mins[g]) << 4);
            y[b].dmin = kern_f32_to_f16_1(max_min / q4scale);
        } else {
            y[b].dmin = kern_f32_to_f16_1(0.f);
        }
        for (int g = 0; g < QK / 16; g++) {
            const float d = kern_f16_to_f32_1(y[b].d) * (y[b].scales[g] & 0xF);
            if (!d)
                continue; /* keeps the search's levels, as in ggml */
            const float dm = kern_f16_to_f32_1(y[b].dmin) * (y[b].scales[g] >> 4);
            for (int i = 0; i < 16; i++) {
                int l = nearest_int((x[16 * g + i] + dm) / d);
                L[16 * g + i] = (uint8_t)MAXI(0, MINI(3, l));
            }
        }
        pack_q2_bits(y[b].qs, L);
    }
}

void kern_cpu_dequant_q2_K(const void *src, float *dst, int n) {
    const struct kern_blk_q2_K *b = src;
    for (int i = 0; i < n / QK; i++) {
        const float d = kern_f16_to_f32_1(b[i].d), min = kern_f16_to_f32_1(b[i].dmin);
        for (int e = 0; e < QK; e++) {
            const int q = kern_cpu_q2_bits(b[i].qs, e);
            const uint8_t sc = b[i].scales[e / 16];
            /* ggml: dl = d * (sc & 15), ml = min * (sc >> 4); dl * q - ml */
            const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
            dst[e] = dl * q - ml;
        }
        dst += QK;
    }
}

/* ---- Q3_K and Q6_K: symmetric scales ---- */

/* The value of largest magnitude in x[n] with its sign (the first of equal
 * magnitudes), or 0 with L[n] zeroed when every |x| is below GROUP_EPS:
 * the start of make_q3_quants and make_qx_quants. */
static float signed_max(int n, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    return max;
}

/* The levels l = clamp(nearest(iscale * x), -nmax, nmax - 1) of x[n] and
 * their x^2-weighted sums, *sumlx = sum w x l and *suml2 = sum w l^2 (w =
 * x^2, ggml's operand order); L, when not NULL, gets l + off. The pass
 * make_q3_quants starts with and make_qx_quants repeats for each trial
 * scale. */
static void sym_levels(int n, int nmax, const float *x, float iscale, int8_t *L, int off,
                       float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAXI(-nmax, MINI(nmax - 1, l));
        if (L)
            L[i] = (int8_t)(l + off);
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* make_q3_quants with do_rmse: levels l in [-nmax, nmax - 1] for x[n], first
 * nearest(-nmax / max * x) (max: the value of largest magnitude), then up to
 * five sweeps that move one level at a time to its best value given the
 * others, kept when the x^2-weighted fit (sum w x l)^2 / sum w l^2 grows.
 * L gets l + nmax; returns the fit's scale, sum w x l / sum w l^2. */
static float q3_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_max(n, x, L);
    if (max == 0)
        return 0.f;
    float sumlx, suml2;
    sym_levels(n, nmax, x, -nmax / max, L, 0, &sumlx, &suml2);
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = MAXI(-nmax, MINI(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

void kern_quantize_row_q3_K(const float *x, void *dst, int n) {
    struct kern_blk_q3_K *y = dst;
    int8_t L[QK];
    float sc[QK / 16];
    for (int b = 0; b < n / QK; b++, x += QK) {
        float max_scale = 0, amax = 0;
        for (int g = 0; g < QK / 16; g++) {
            sc[g] = q3_quants(16, 4, x + 16 * g, L + 16 * g);
            if (fabsf(sc[g]) > amax) {
                amax = fabsf(sc[g]);
                max_scale = sc[g];
            }
        }
        memset(y[b].scales, 0, sizeof(y[b].scales));
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int g = 0; g < QK / 16; g++) {
                int l = MAXI(-32, MINI(31, nearest_int(iscale * sc[g]))) + 32;
                if (g < 8)
                    y[b].scales[g] = (uint8_t)(l & 0xF);
                else
                    y[b].scales[g - 8] |= (uint8_t)((l & 0xF) << 4);
                y[b].scales[8 + g % 4] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
            }
            y[b].d = kern_f32_to_f16_1(1 / iscale);
        } else {
            y[b].d = kern_f32_to_f16_1(0.f);
        }
        for (int g = 0; g < QK / 16; g++) {
            const float d = kern_f16_to_f32_1(y[b].d) * kern_cpu_scale_q3_K(y[b].scales, g);
            if (!d)
                continue; /* keeps the search's levels, as in ggml */
            for (int i = 0; i < 16; i++) {
                int l = nearest_int(x[16 * g + i] / d);
                L[16 * g + i] = (int8_t)(MAXI(-4, MINI(3, l)) + 4);
            }
        }
        /* level bit 2 of element e into bit e / 32 of hmask[e % 32] */
        memset(y[b].hmask, 0, sizeof(y[b].hmask));
        for (int e = 0; e < QK; e++)
            if (L[e] > 3) {
                y[b].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                L[e] = (int8_t)(L[e] - 4);
            }
        pack_q2_bits(y[b].qs, (const uint8_t *)L); /* now 0..3 */
    }
}

void kern_cpu_dequant_q3_K(const void *src, float *dst, int n) {
    const struct kern_blk_q3_K *b = src;
    for (int i = 0; i < n / QK; i++) {
        const float d = kern_f16_to_f32_1(b[i].d);
        for (int e = 0; e < QK; e++) {
            const int q =
                kern_cpu_q2_bits(b[i].qs, e) - ((b[i].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
            /* ggml: dl = d * (sc - 32), then dl * q */
            const float dl = d * kern_cpu_scale_q3_K(b[i].scales, e / 16);
            dst[e] = dl * q;
        }
        dst += QK;
    }
}

/* ---- Q6_K ---- */

/* make_qx_quants with rmse_type 1 and no importance weights: a symmetric
 * scale for x[n] with levels L = l + nmax, l in [-nmax, nmax - 1], chosen
 * among -(nmax + 0.1 is) / max, is = -9..9, by the x^2-weighted fit. */
static float qx_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_max(n, x, L);
    if (max == 0)
        return 0.f;
    float sumlx, suml2;
    sym_levels(n, nmax, x, -nmax / max, L, nmax, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        sym_levels(n, nmax, x, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sym_levels(n, nmax, x, iscale, L, nmax, &sumlx, &suml2); /* the same sums, kept */
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void kern_quantize_row_q6_K(const float *x, void *dst, int n) {
    struct kern_blk_q6_K *y = dst;
    int8_t L[QK];
    float sc[QK / 16];
    for (int b = 0; b < n / QK; b++, x += QK) {
        float max_scale = 0, max_abs = 0;
        for (int g = 0; g < QK / 16; g++) {
            sc[g] = qx_quants(16, 32, x + 16 * g, L + 16 * g);
            if (fabsf(sc[g]) > max_abs) {
                max_abs = fabsf(sc[g]);
                max_scale = sc[g];
            }
        }
        if (max_abs < GROUP_EPS) {
            memset(&y[b], 0, sizeof(y[b]));
            y[b].d = kern_f32_to_f16_1(0.f);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[b].d = kern_f32_to_f16_1(1 / iscale);
        for (int g = 0; g < QK / 16; g++)
            y[b].scales[g] = (int8_t)MINI(127, nearest_int(iscale * sc[g]));
        for (int g = 0; g < QK / 16; g++) {
            float d = kern_f16_to_f32_1(y[b].d) * y[b].scales[g];
            if (!d)
                continue; /* keeps the search's levels, as in ggml */
            for (int i = 0; i < 16; i++) {
                int l = nearest_int(x[16 * g + i] / d);
                L[16 * g + i] = (int8_t)(MAXI(-32, MINI(31, l)) + 32);
            }
        }
        for (int h = 0; h < QK / 128; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                  ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

void kern_cpu_dequant_q6_K(const void *src, float *dst, int n) {
    const struct kern_blk_q6_K *b = src;
    for (int i = 0; i < n / QK; i++) {
        const float d = kern_f16_to_f32_1(b[i].d);
        for (int e = 0; e < QK; e++) {
            const int h = e / 128, r = (e % 128) / 32, l = e % 32;
            const uint8_t lo = b[i].ql[64 * h + 32 * (r & 1) + l];
            const int q =
                ((r < 2 ? lo & 0xF : lo >> 4) | (((b[i].qh[32 * h + l] >> (2 * r)) & 3) << 4));
            /* ggml: d * sc * q, left to right */
            dst[e] = d * b[i].scales[e / 16] * (q - 32);
        }
        dst += QK;
    }
}

/* ---- Q8_K (activations) ---- */

/* One block of x[256] -> qs[256]; returns d. */
static float quant_q8K_block(const float *x, int8_t *qs) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (!amax) {
        memset(qs, 0, QK);
        return 0.f;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK; j++)
        qs[j] = (int8_t)MINI(127, nearest_int(iscale * x[j]));
    return 1 / iscale;
}

void kern_quantize_row_q8_K(const float *x, void *dst, int n) {
    struct kern_blk_q8_K *y = dst;
    for (int b = 0; b < n / QK; b++) {
        y[b].d = quant_q8K_block(x + b * QK, y[b].qs);
        for (int j = 0; j < QK / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)s;
        }
    }
}

void kern_cpu_act_q8K16(const float *x, void *dst, int n) {
    kern_cpu_act_q8K(x, dst, n);
    const int8_t *qs = dst;
    int16_t *s16 = (int16_t *)((char *)dst + kern_cpu_act_q8K_bytes(n));
    for (int j = 0; j < n / 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++)
            s += qs[16 * j + i];
        s16[j] = (int16_t)s;
    }
}

void kern_cpu_act_q8K(const float *x, void *dst, int n) {
    if (kern_isa() >= KERN_ISA_AVX2) {
        kern_cpu_act_q8K_avx2(x, dst, n); /* the same bytes, vectorised */
        return;
    }
    int8_t *qs = dst;
    float *d = (float *)(qs + n);
    int16_t *s32 = (int16_t *)(d + n / QK);
    for (int b = 0; b < n / QK; b++)
        d[b] = quant_q8K_block(x + b * QK, qs + b * QK);
    for (int j = 0; j < n / 32; j++) {
        int s = 0;
        for (int i = 0; i < 32; i++)
            s += qs[32 * j + i];
        s32[j] = (int16_t)s;
    }
}
