/* The block kernel in portable C (the "portable" build: Arm, x86 without AVX2 with FMA and F16C),
   which the compiler vectorizes as it can. One activation row at a time, both layouts; the sums
   are blocks.h's, exact in int32, then scaled in float32 block after block. */

#include "blocks.h"

void lb_quantize(const float *x, int64_t b0, int64_t b1, const lb_acts *a) {
    for (int64_t b = b0; b < b1; b++) lb_quantize_block(x + b * LB_QK, a, b);
}

/* sum q p over block j (of 32 weights) of the weight block blk and its activations p, the K types'
   group scales folded in (blocks.h); exact: in int32 for each 16 or 32 products, then in int64,
   which Q6_K's scaled sums need (32 products of up to 128 * 32 * 32767 pass 2^31). */
static LB_INLINE int64_t block_sum(const lb_traits *t, const uint8_t *blk, int j, const int16_t *p) {
    const uint8_t *qs = blk + t->head;
    int32_t s = 0;
    if (t->type == LB_Q8_0) {
        for (int i = 0; i < 32; i++) s += (int32_t)(int8_t)qs[i] * p[i];
    } else if (t->type == LB_Q5_0) { /* qh[4], then the nibbles */
        uint32_t qh;
        memcpy(&qh, qs, 4);
        for (int i = 0; i < 16; i++)
            s += ((int)((qs[4 + i] & 15) | ((qh >> i & 1) << 4)) - 16) * p[i] +
                 ((int)((qs[4 + i] >> 4) | ((qh >> (i + 16) & 1) << 4)) - 16) * p[i + 16];
    } else if (t->type == LB_Q4_K || t->type == LB_Q5_K) { /* Q5_K: qh[32], then Q4_K's nibbles */
        int sc, m;
        lb_k_scale(blk + 4, j, &sc, &m);
        const uint8_t *ql = qs + (t->type == LB_Q5_K ? 32 : 0) + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
            int q = (ql[i] >> 4 * (j & 1)) & 15;
            if (t->type == LB_Q5_K) q |= ((qs[i] >> j) & 1) << 4;
            s += q * p[i];
        }
        return (int64_t)sc * s;
    } else if (t->type == LB_Q6_K) { /* block j is 32 weights of half j / 4, two groups of 16 */
        const int h = j / 4, c = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (c & 1), *qh = blk + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(blk + 192) + 2 * j;
        int32_t half[2] = {0, 0};
        for (int i = 0; i < 32; i++)
            half[i / 16] += ((((ql[i] >> 4 * (c >> 1)) & 15) | (((qh[i] >> 2 * c) & 3) << 4)) - 32) * p[i];
        return (int64_t)sc[0] * half[0] + (int64_t)sc[1] * half[1];
    } else { /* Q4_0, Q4_1 */
        const int off = t->type == LB_Q4_0 ? 8 : 0;
        for (int i = 0; i < 16; i++) s += ((qs[i] & 15) - off) * p[i] + ((qs[i] >> 4) - off) * p[i + 16];
    }
    return s;
}

/* Block j's scale d, and the term `off` that its weights add per unit of the activations
   (block_sum's integers times d, plus off): Q4_1's m, the K types' -dmin m, else 0. */
static LB_INLINE float block_scale(const lb_traits *t, const uint8_t *blk, int j, float *off) {
    *off = t->type == LB_Q4_1 ? lb_half(blk + 2) : 0.0f;
    if (t->type == LB_Q4_K || t->type == LB_Q5_K) {
        int sc, m;
        lb_k_scale(blk + 4, j, &sc, &m);
        *off = -(lb_half(blk + 2) * (float)m); /* exact: 11 bits times 6 */
    }
    return lb_half(t->type == LB_Q6_K ? blk + 208 : blk);
}

/* The same for row `row` of a group's block, whose quants are in chunks of 4 bytes per row. */
static LB_INLINE int32_t group_sum(const lb_traits *t, const uint8_t *qs, int row, const int16_t *p) {
    int32_t s = 0;
    const int off = t->type == LB_Q4_0 ? 8 : 0;
    for (int c = 0; c < t->chunks; c++) {
        for (int i = 0; i < 4; i++) {
            const uint8_t v = qs[32 * c + 4 * row + i];
            if (t->type == LB_Q8_0)
                s += (int32_t)(int8_t)v * p[4 * c + i];
            else
                s += ((v & 15) - off) * p[4 * c + i] + ((v >> 4) - off) * p[16 + 4 * c + i];
        }
    }
    return s;
}

/* Weight block blk (the file's order) against activation row r's blocks from b0: its term of the row's total. */
static LB_INLINE float block_dot(const lb_traits *t, const uint8_t *blk, const lb_acts *a, int64_t r, int64_t b0) {
    const int16_t *p = a->p + r * a->k;
    const float *es = a->es + r * 2 * a->nb;
    float total = 0.0f;
    for (int j = 0; j < t->weights / LB_QK; j++) { /* block b of x meets block j of the weight block */
        const int64_t b = b0 + j;
        float off;
        const float d = block_scale(t, blk, j, &off);
        total += d * es[2 * b] * (float)block_sum(t, blk, j, p + b * LB_QK);
        if (lb_has_min(t->type)) total += off * es[2 * b + 1];
    }
    return total;
}

static LB_INLINE void rows(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0,
                           int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k), per = t->weights / LB_QK;
    for (int64_t i = i0; i < i1; i++) {
        for (int64_t r = r0; r < r1; r++) {
            float total = 0.0f;
            for (int64_t wb = 0; wb < a->nb / per; wb++) total += block_dot(t, w + i * row + wb * t->bytes, a, r, wb * per);
            y[r * n + i] = total;
        }
    }
}

/* The K types' groups: each row's super-block taken back out of its group (lb_ungroup_block), then
   as in rows(), the same sums in the same order. */
static LB_INLINE void super_groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a,
                                   int64_t r0, int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k), bytes = LB_GROUP * t->bytes, per = t->weights / LB_QK;
    uint8_t blk[256]; /* one super-block: at most 210 bytes (Q6_K) */
    for (int64_t i = i0; i < i1; i += LB_GROUP)
        for (int64_t r = r0; r < r1; r++)
            for (int j = 0; j < LB_GROUP; j++) {
                float total = 0.0f;
                for (int64_t wb = 0; wb < a->nb / per; wb++) {
                    lb_ungroup_block(t, w + i * row + wb * bytes, j, blk);
                    total += block_dot(t, blk, a, r, wb * per);
                }
                y[r * n + i + j] = total;
            }
}

static LB_INLINE void groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a,
                             int64_t r0, int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k), bytes = LB_GROUP * t->bytes, head = LB_GROUP * t->head;
    if (t->weights != LB_QK) {
        super_groups(t, w, i0, i1, a, r0, r1, y, n);
        return;
    }
    for (int64_t i = i0; i < i1; i += LB_GROUP) {
        for (int64_t r = r0; r < r1; r++) {
            const int16_t *p = a->p + r * a->k;
            const float *es = a->es + r * 2 * a->nb;
            for (int j = 0; j < LB_GROUP; j++) {
                float total = 0.0f;
                for (int64_t b = 0; b < a->nb; b++) {
                    const uint8_t *blk = w + i * row + b * bytes;
                    total += lb_half(blk + 2 * j) * es[2 * b] * (float)group_sum(t, blk + head, j, p + b * LB_QK);
                    if (t->type == LB_Q4_1) total += lb_half(blk + 2 * LB_GROUP + 2 * j) * es[2 * b + 1];
                }
                y[r * n + i + j] = total;
            }
        }
    }
}

LB_ENTRY_POINTS /* lb_rows and lb_groups over rows() and groups() above, per type (blocks.h) */
