/* The block kernel in portable C (the "portable" build: Arm, x86 without AVX2 with FMA and F16C),
   which the compiler vectorizes as it can. One activation row at a time, both layouts; the sums
   are blocks.h's, exact in int32, then scaled in float32 block after block. */

#include "blocks.h"

void lb_quantize(const float *x, int64_t m, const lb_acts *a) {
    for (int64_t b = 0; b < m * a->nb; b++) lb_quantize_block(x + b * LB_QK, a, b);
}

/* sum q p over one block's quants qs (the file's order) and its activations p. */
static LB_INLINE int32_t block_sum(const lb_traits *t, const uint8_t *qs, const int16_t *p) {
    int32_t s = 0;
    if (t->type == LB_Q8_0) {
        for (int i = 0; i < 32; i++) s += (int32_t)(int8_t)qs[i] * p[i];
        return s;
    }
    const int off = t->type == LB_Q4_0 ? 8 : 0;
    for (int i = 0; i < 16; i++) s += ((qs[i] & 15) - off) * p[i] + ((qs[i] >> 4) - off) * p[i + 16];
    return s;
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

static LB_INLINE void rows(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0,
                           int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k);
    for (int64_t i = i0; i < i1; i++) {
        for (int64_t r = r0; r < r1; r++) {
            const int16_t *p = a->p + r * a->k;
            const float *es = a->es + r * 2 * a->nb;
            float total = 0.0f;
            for (int64_t b = 0; b < a->nb; b++) {
                const uint8_t *blk = w + i * row + b * t->bytes;
                total += lb_half(blk) * es[2 * b] * (float)block_sum(t, blk + t->head, p + b * LB_QK);
                if (t->type == LB_Q4_1) total += lb_half(blk + 2) * es[2 * b + 1];
            }
            y[r * n + i] = total;
        }
    }
}

static LB_INLINE void groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a,
                             int64_t r0, int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k), bytes = LB_GROUP * t->bytes, head = LB_GROUP * t->head;
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
