/* lb_dequantize: weight rows of a file's blocks as float32, for prefill, where a float GEMM over
   the dequantized rows (torch.mm) beats the block kernel's integer products once x has enough
   rows (`llamablock bench prefill_crossover` finds the row count per CPU kind; ggml_kernel.matmul
   and block_op.cpp call it a tile of rows at a time). The same in every build: portable C that the
   compiler vectorizes with the build's flags.

   Exact: each weight is blocks.h's formula, and every product in it is exact in float32 (a
   float16's 11 bits times at most 8 bits of integer, or Q4_K's d sc, 17 bits, times a 5-bit q),
   so a weight takes at most one rounding (Q4_1's + m, the K types' - dmin m) whether or not the
   compiler fuses it into an FMA: the values equal the gguf package's dequantization bit for bit
   (tests/fast/kernels/test_dequant_and_layout.py). */

#include "blocks.h"

/* The 32 or 256 weights of one block `blk` in the file's order. */
static LB_INLINE void block_weights(const lb_traits *t, const uint8_t *blk, float *out) {
    const float d = lb_half(t->type == LB_Q6_K ? blk + 208 : blk);
    if (t->type == LB_Q8_0) {
        for (int i = 0; i < 32; i++) out[i] = d * (float)(int8_t)blk[2 + i];
    } else if (t->type == LB_Q4_0 || t->type == LB_Q4_1) {
        const uint8_t *qs = blk + t->head;
        const float m = t->type == LB_Q4_1 ? lb_half(blk + 2) : 0.0f;
        const int off = t->type == LB_Q4_0 ? 8 : 0;
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)((qs[i] & 15) - off) + m;
            out[i + 16] = d * (float)((qs[i] >> 4) - off) + m;
        }
    } else if (t->type == LB_Q5_0) { /* qh[4], then the nibbles; bit i of qh is weight i's fifth */
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)((int)((blk[6 + i] & 15) | ((qh >> i & 1) << 4)) - 16);
            out[i + 16] = d * (float)((int)((blk[6 + i] >> 4) | ((qh >> (i + 16) & 1) << 4)) - 16);
        }
    } else if (t->type == LB_Q4_K || t->type == LB_Q5_K) { /* group g: weights 32 g .. 32 g + 31 */
        const float dmin = lb_half(blk + 2);
        const uint8_t *qh = blk + 16, *ql = blk + 16 + (t->type == LB_Q5_K ? 32 : 0);
        for (int g = 0; g < 8; g++) {
            int sc, m;
            lb_k_scale(blk + 4, g, &sc, &m);
            const float scale = d * (float)sc, low = dmin * (float)m; /* both exact */
            for (int i = 0; i < 32; i++) {
                int q = (ql[32 * (g / 2) + i] >> 4 * (g & 1)) & 15;
                if (t->type == LB_Q5_K) q |= ((qh[i] >> g) & 1) << 4;
                out[32 * g + i] = scale * (float)q - low;
            }
        }
    } else { /* Q6_K: weight 32 c + i of half h; a scale per 16 weights (s: which 16) */
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++)
                for (int s = 0; s < 2; s++) {
                    const float scale = d * (float)sc[8 * h + 2 * c + s]; /* exact: 11 bits times 8 */
                    const uint8_t *ql = blk + 64 * h + 32 * (c & 1) + 16 * s, *qh = blk + 128 + 32 * h + 16 * s;
                    for (int i = 0; i < 16; i++) {
                        const int q = ((ql[i] >> 4 * (c >> 1)) & 15) | ((qh[i] >> 2 * c) & 3) << 4;
                        out[128 * h + 32 * c + 16 * s + i] = scale * (float)(q - 32);
                    }
                }
    }
}

/* Row `row`'s 32 weights of a 32-weight type (Q4_0, Q4_1, Q8_0) straight from its group's block g:
   field f of its head at 2 (8 f + row), its quant bytes 4 c .. 4 c + 3 at 32 c + 4 row past the
   head (blocks.h's grouped layout). lb_ungroup_block then block_weights computes the same, more
   slowly (timed by hand on one AVX2 thread: the commit gives the figures). */
static LB_INLINE void group_weights32(const lb_traits *t, const uint8_t *g, int row, float *out) {
    const float d = lb_half(g + 2 * row);
    const uint8_t *qs = g + LB_GROUP * t->head + 4 * row;
    if (t->type == LB_Q8_0) {
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++) out[4 * c + i] = d * (float)(int8_t)qs[32 * c + i];
        return;
    }
    const float m = t->type == LB_Q4_1 ? lb_half(g + 2 * LB_GROUP + 2 * row) : 0.0f;
    const int off = t->type == LB_Q4_0 ? 8 : 0;
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 4; i++) {
            out[4 * c + i] = d * (float)((qs[32 * c + i] & 15) - off) + m;
            out[16 + 4 * c + i] = d * (float)((qs[32 * c + i] >> 4) - off) + m;
        }
}

/* Rows i0..i1-1 of w into out, row after row of k floats. */
static LB_INLINE void dequantize(const lb_traits *t, int layout, const uint8_t *w, int64_t k, int64_t i0, int64_t i1,
                                 float *out, int threads) {
    const int64_t row = lb_row_bytes(t, k), per_row = k / t->weights;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t i = i0; i < i1; i++) {
        float *o = out + (i - i0) * k;
        if (layout == LB_ROWS) {
            for (int64_t b = 0; b < per_row; b++) block_weights(t, w + i * row + b * t->bytes, o + b * t->weights);
        } else { /* the row's blocks out of its group's (blocks.h lb_ungroup_block) */
            const uint8_t *group = w + (i / LB_GROUP) * LB_GROUP * row;
            uint8_t blk[256];
            for (int64_t b = 0; b < per_row; b++) {
                if (t->type == LB_Q4_0 || t->type == LB_Q4_1 || t->type == LB_Q8_0) {
                    group_weights32(t, group + b * LB_GROUP * t->bytes, (int)(i % LB_GROUP), o + b * t->weights);
                } else {
                    lb_ungroup_block(t, group + b * LB_GROUP * t->bytes, (int)(i % LB_GROUP), blk);
                    block_weights(t, blk, o + b * t->weights);
                }
            }
        }
    }
}

#define LB_DEQUANTIZE_OF(id, ...) \
    case id: dequantize(&(const lb_traits){id, __VA_ARGS__}, layout, w, k, i0, i1, out, threads); break;

int lb_dequantize(int type, int layout, const uint8_t *w, int64_t n, int64_t k, int64_t i0, int64_t i1, float *out,
                  int threads) {
    const lb_traits *t = lb_find(type);
    if (!t || (layout != LB_ROWS && layout != LB_GROUPS) || (layout == LB_GROUPS && !t->chunks)) return LB_UNKNOWN;
    if (k % t->weights || (layout == LB_GROUPS && n % LB_GROUP) || i0 < 0 || i1 > n || i0 > i1) return LB_BAD_SHAPE;
    switch (type) { LB_TYPE_TABLE(LB_DEQUANTIZE_OF) }
    return LB_OK;
}
