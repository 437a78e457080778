/* Prefill in the AVX-512 VNNI build: the grouped layout's 4- to 6-bit types (Q4_0, Q4_1, Q4_K,
   Q5_K, Q6_K) against a tile of many activation rows, in 512-bit vectors. Included by x86.c after
   x86_super.h, whose unpacking of a group's block (k_group_block, q6_group_block) it shares.

   Why a second kernel: the decode kernels (x86.c dot_group, x86_super.h) unpack a block's weights
   again for every 4 activation rows and meet them in 256-bit vectors; on a long prompt their
   products ran well behind this kernel (the commit that added it has one thread's timings on the
   1B model's matrices, `llamablock bench size` the prefill beside llama.cpp's, whose
   repacked gemm kernels, ggml-cpu/repack.cpp, also unpack once for many rows). Here two groups (16
   weight rows) are unpacked once per tile of x into a panel, every weight one byte (0..63, the
   types' offsets kept out as integers), each block's 8 chunks of 4 weights one 64-byte vector
   (lanes 0..7 the first group's rows, 8..15 the second's) beside the rows' float factors; then
   each activation row's 16-bit integers meet a chunk as their two bytes (lb_acts lo, hi), each
   broadcast, in two dpbusd of 64 products each (8-bit x: hi's alone, lo being 0).

   Every output is the decode kernels' bit for bit: a block's integer sum is exact whichever way it
   is added up, and the float steps per block (scale products, fused multiply-adds, their order) are
   theirs, lane for lane, so a token's result does not depend on the rows beside it
   (test_file_blocks.py, test_kquant_blocks.py: 37 rows against each row alone, and against the
   plain AVX-512 build, which has no panels). */

#ifndef LLAMABLOCK_X86_PANEL_H
#define LLAMABLOCK_X86_PANEL_H

#if defined(__AVX512VNNI__)

/* From how many activation rows (of a tile) a type takes the panels: below it the decode kernels,
   which unpack a block for at most 4 rows but stream their weights better, are faster. Read off
   two threads' timings of both kernels with the weights coming from memory (matrices past the
   last-level cache), as a served batch's step and a short prompt read them at 1B (the commit that
   set them has the timings, on one AMD Zen 5): Q6_K gains from 4 rows, Q4_K and Q5_K from 8, Q4_0
   and Q4_1 from 12. */
static inline int panel_from(const lb_traits *t) { return t->type == LB_Q6_K ? 4 : t->weights == LB_QK ? 12 : 8; }
/* a panel's block: 8 chunks of 64 bytes, then the 16 rows' factors f and f2 (float32) */
enum { PANEL_BLOCK = 8 * 64 + 2 * 64 };

static inline int panel_type(const lb_traits *t) {
    return t->type == LB_Q4_0 || t->type == LB_Q4_1 || t->type == LB_Q4_K || t->type == LB_Q5_K ||
           t->type == LB_Q6_K;
}

/* Block b (of 32 weights) of group g (8 rows, the grouped layout) as 8 chunks of bytes and each row's
   factors: f the factor of the block's integer sum (d; Q4_K and Q5_K d sc; Q6_K the first 16's d sc),
   f2 the second term's (Q4_1 m, Q4_K and Q5_K dmin m, Q6_K the second 16's d sc; else unused).
   Q4_0's and Q4_1's chunk c of 4 bytes holds weights 4c..4c+3 in its low nibbles and 16 + 4c.. in
   its high ones (blocks.h): the low nibbles are chunks 0..3 here, the high 4..7. */
static LB_INLINE void group_block(const lb_traits *t, const uint8_t *g, int64_t b, __m256i q[8], __m256 *f,
                                  __m256 *f2) {
    const int64_t bytes = LB_GROUP * t->bytes;
    if (t->type == LB_Q6_K) return q6_group_block(t, g + b / 8 * bytes, (int)(b % 8), q, f, f2);
    if (t->weights != LB_QK) return k_group_block(t, g + b / 8 * bytes, (int)(b % 8), q, f, f2);
    const uint8_t *blk = g + b * bytes, *qs = blk + LB_GROUP * t->head;
    const __m256i nibble = _mm256_set1_epi8(15);
    *f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    *f2 = t->type == LB_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * LB_GROUP))) : *f;
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        q[c] = _mm256_and_si256(raw, nibble);
        q[c + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
    }
}

/* Groups g0 and g1 (g1 0: a lone group, its lanes zeros) as a panel of nb blocks */
static LB_INLINE void panel_unpack(const lb_traits *t, const uint8_t *g0, const uint8_t *g1, int64_t nb,
                                   uint8_t *panel) {
    const int64_t bytes = LB_GROUP * t->bytes, per = t->weights / LB_QK; /* a group's block; its blocks of 32 */
    for (int64_t b = 0; b < nb; b++) {
        if (b % per == 0) { /* the stream from memory, as the decode kernels ask for it (x86.c) */
            prefetch_ahead(g0 + b / per * bytes, bytes);
            if (g1) prefetch_ahead(g1 + b / per * bytes, bytes);
        }
        __m256i q0[8], q1[8];
        __m256 f0, f20, f1 = _mm256_setzero_ps(), f21 = _mm256_setzero_ps();
        group_block(t, g0, b, q0, &f0, &f20);
        if (g1) group_block(t, g1, b, q1, &f1, &f21);
        uint8_t *blk = panel + b * PANEL_BLOCK;
        for (int c = 0; c < 8; c++)
            _mm512_storeu_si512((void *)(blk + 64 * c),
                                _mm512_inserti64x4(_mm512_castsi256_si512(q0[c]), g1 ? q1[c] : _mm256_setzero_si256(), 1));
        _mm256_storeu_ps((float *)(blk + 512), f0), _mm256_storeu_ps((float *)(blk + 544), f1);
        _mm256_storeu_ps((float *)(blk + 576), f20), _mm256_storeu_ps((float *)(blk + 608), f21);
    }
}

/* A panel against R activation rows from r: out[i * n + lane] for the `lanes` kept (16, or 8 for a lone
   group). Per block and row: the chunks' exact integer sums (lo's and hi's), less the type's offset
   (Q4_0 8 P, Q6_K 32 P16), then the decode kernels' float steps. The block's two halves (chunks 0..3,
   4..7) add up in chains of their own, chunk c of each side by side: one chain of 8 dependent dpbusd
   a row left the multiplier waiting on each one's latency (the commit that split them has the
   timings); Q6_K keeps the halves apart anyway, its halves' scales differ. */
static LB_INLINE void panel_dot(const int R, const lb_traits *t, const uint8_t *panel, const lb_acts *a, int64_t r,
                                float *out, int64_t n, __mmask16 lanes, const int eight) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < a->nb; b++) {
        const uint8_t *blk = panel + b * PANEL_BLOCK;
        __m512i hi[2][4], lo[2][4]; /* [half][row] */
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < R; i++) hi[h][i] = lo[h][i] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < 4; c++) {
            for (int h = 0; h < 2; h++) {
                const int cc = 4 * h + c;
                const __m512i w = _mm512_loadu_si512((const void *)(blk + 64 * cc));
                for (int i = 0; i < R; i++) {
                    const int64_t at = (r + i) * a->k + b * LB_QK + 4 * cc;
                    int32_t xh, xl;
                    memcpy(&xh, a->hi + at, 4);
                    hi[h][i] = _mm512_dpbusd_epi32(hi[h][i], w, _mm512_set1_epi32(xh)); /* w unsigned, hi signed */
                    if (!eight) {
                        memcpy(&xl, a->lo + at, 4);
                        lo[h][i] = _mm512_dpbusd_epi32(lo[h][i], _mm512_set1_epi32(xl), w); /* lo unsigned, w < 128 */
                    }
                }
            }
        }
        if (t->type != LB_Q6_K) /* one sum of the whole block (exact), into half 0 */
            for (int i = 0; i < R; i++) {
                hi[0][i] = _mm512_add_epi32(hi[0][i], hi[1][i]);
                if (!eight) lo[0][i] = _mm512_add_epi32(lo[0][i], lo[1][i]);
            }
        for (int h = 0; h < (t->type == LB_Q6_K ? 2 : 1); h++) {
            const __m512 f = _mm512_loadu_ps(blk + 512 + 64 * h);
            for (int i = 0; i < R; i++) {
                const int64_t ib = (r + i) * a->nb + b;
                const float *e = a->es + 2 * ib;
                __m512i s = _mm512_slli_epi32(hi[h][i], 8);
                if (!eight) s = _mm512_add_epi32(s, lo[h][i]);
                if (t->type == LB_Q4_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * a->ps[ib]));
                if (t->type == LB_Q6_K)
                    s = _mm512_sub_epi32(s, _mm512_set1_epi32(32 * (h ? a->ps[ib] - a->ps16[ib] : a->ps16[ib])));
                acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(f, _mm512_set1_ps(e[0])), _mm512_cvtepi32_ps(s), acc[i]);
            }
        }
        if (t->type == LB_Q4_1 || t->type == LB_Q4_K || t->type == LB_Q5_K) {
            const __m512 f2 = _mm512_loadu_ps(blk + 576);
            for (int i = 0; i < R; i++) {
                const __m512 ep = _mm512_set1_ps(a->es[2 * ((r + i) * a->nb + b) + 1]);
                acc[i] = t->type == LB_Q4_1 ? _mm512_fmadd_ps(f2, ep, acc[i]) : _mm512_fnmadd_ps(f2, ep, acc[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) _mm512_mask_storeu_ps(out + i * n, lanes, acc[i]);
}

/* Weight rows i0..i1-1 (whole groups) against activation rows r0..r1-1, two groups a panel. Returns
   0 where it has no panel's memory (the caller then takes the decode kernels). */
static LB_INLINE int panels(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a,
                            int64_t r0, int64_t r1, float *y, int64_t n) {
    uint8_t *panel = malloc((size_t)(a->nb * PANEL_BLOCK));
    if (!panel) return 0;
    const int64_t row = lb_row_bytes(t, a->k);
    for (int64_t i = i0; i < i1; i += 2 * LB_GROUP) {
        const int two = i + LB_GROUP < i1;
        panel_unpack(t, w + i * row, two ? w + (i + LB_GROUP) * row : 0, a->nb, panel);
        const __mmask16 lanes = two ? 0xFFFF : 0x00FF;
        int64_t r = r0;
        if (a->bits == 8) {
            for (; r + 4 <= r1; r += 4) panel_dot(4, t, panel, a, r, y + r * n + i, n, lanes, 1);
            for (; r < r1; r++) panel_dot(1, t, panel, a, r, y + r * n + i, n, lanes, 1);
        } else {
            for (; r + 4 <= r1; r += 4) panel_dot(4, t, panel, a, r, y + r * n + i, n, lanes, 0);
            for (; r < r1; r++) panel_dot(1, t, panel, a, r, y + r * n + i, n, lanes, 0);
        }
    }
    free(panel);
    return 1;
}

#endif
#endif
