/* The K types in the x86 builds, a super-block of 256 weights at a time: included by x86.c after
   its primitives (quant_bytes, block_ints, k_ints, sums, the ACC_ macros), which it uses, so one
   translation unit per build still compiles each type's kernels with its traits as constants.

   Where the blocks of 32 (x86.c dot_rows) convert one block's scales at a time, a K-type
   super-block's are read once for its 8 blocks: Q4_K's and Q5_K's 6-bit scales and mins decoded
   together from their 12 bytes, Q6_K's 16 int8 scales in one load. Q4_K's and Q5_K's scales are
   applied in float, with x's scale, to each block's exact integer sum, and their mins meet x's e P
   in 8 lanes, one per block; Q6_K's scales, one per 16 weights, are multiplied into the integers
   (|sc q| <= 4096), as a block's two halves would otherwise need two float factors. */

#ifndef LLAMABLOCK_X86_SUPER_H
#define LLAMABLOCK_X86_SUPER_H

/* The K types' 6-bit scales and mins of a Q4_K or Q5_K super-block's 12 bytes `s`, all 8 groups
   at once as bytes (blocks.h lb_k_scale, one group at a time, says where each lies): the low 6 bits
   of words 0 and 1 are groups 0..3, the nibbles of word 2 with the top 2 bits of words 0 and 1
   groups 4..7. */
static inline void k_scales(const uint8_t *s, __m256 *sc, __m256 *m) {
    uint32_t u[3], lo[2], hi[2];
    memcpy(u, s, 12);
    lo[0] = u[0] & 0x3f3f3f3fu, lo[1] = (u[2] & 0x0f0f0f0fu) | (u[0] >> 6 & 0x03030303u) << 4;
    hi[0] = u[1] & 0x3f3f3f3fu, hi[1] = (u[2] >> 4 & 0x0f0f0f0fu) | (u[1] >> 6 & 0x03030303u) << 4;
    *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)lo)));
    *m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)hi)));
}

/* A K-type super-block's weights as 8 blocks of 32 q (the file's order, 16 bits), and factors: `f`
   the float factor of each block's integer sum (d sc for Q4_K and Q5_K, whose scales stay out of
   the integers; d for Q6_K, whose scales of 16 weights are multiplied into them, |sc q| <= 4096),
   `min` each block's dmin m (Q4_K, Q5_K). d sc and dmin m are exact: 11 bits times 6. */
static inline void k_factors(const lb_traits *t, const uint8_t *blk, __m256 *f, __m256 *min) {
    int32_t dm = 0; /* d, then dmin (Q4_K, Q5_K) or d alone (Q6_K), float16; F16C converts them exactly */
    memcpy(&dm, blk + (t->type == LB_Q6_K ? 208 : 0), t->type == LB_Q6_K ? 2 : 4);
    const __m128 h = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    if (t->type == LB_Q6_K) {
        *f = _mm256_broadcastss_ps(h);
        return;
    }
    __m256 sc, m;
    k_scales(blk + 4, &sc, &m);
    *f = _mm256_mul_ps(_mm256_broadcastss_ps(h), sc);
    *min = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(h)), m);
}

/* The 8 blocks' (e, e P) pairs at es as e (return) and e P (*ep), each in block order. */
static inline __m256 k_acts(const float *es, __m256 *ep) {
    const __m256 a = _mm256_loadu_ps(es), b = _mm256_loadu_ps(es + 8); /* blocks 0..3, 4..7 */
    /* the shuffles take lanes 0 2 4 6 of a and b per 128 bits, the permute puts the pairs in order */
    *ep = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}

/* One K-type weight row against R activation rows from r, a super-block at a time: its scales are
   decoded once for all 8 blocks of 32 (not a block at a time), each block's integer sums are
   converted and added with one fused multiply-add by d sc e, and the min term sum dmin m e P is
   added in 8 lanes, one per block, and taken off at the end. The same sequence for a row whatever
   R is (test_kquant_blocks.py checks it bit for bit). */
static LB_INLINE void dot_super(const int R, const lb_traits *t, const uint8_t *w, const lb_acts *a, int64_t r,
                             float *out, int64_t out_stride) {
    /* two accumulators a row, for the even and the odd blocks: one chain of dependent multiply-adds
       would wait out each one's latency */
    row_acc acc[4][2] = {{ACC_ZERO, ACC_ZERO}, {ACC_ZERO, ACC_ZERO}, {ACC_ZERO, ACC_ZERO}, {ACC_ZERO, ACC_ZERO}};
    __m256 mins[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float fs[4][8];
    for (int64_t sb = 0; sb < a->nb / 8; sb++) {
        const uint8_t *blk = w + sb * t->bytes;
        __m256 f, min = _mm256_setzero_ps(), ep;
        k_factors(t, blk, &f, &min);
        for (int i = 0; i < R; i++) {
            const __m256 e = k_acts(a->es + (r + i) * 2 * a->nb + 16 * sb, &ep);
            _mm256_storeu_ps(fs[i], _mm256_mul_ps(f, e));
            if (t->type != LB_Q6_K) mins[i] = _mm256_fmadd_ps(min, ep, mins[i]);
        }
        /* each block's factor is then read from memory, a broadcast load, where the compiler would
           otherwise shuffle it out of the register: the shuffles share a port with the widening */
        __asm__ volatile("" : : "r"(fs) : "memory");
        const q6_scales sc = q6_scales_of(blk);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const block_ints q = k_ints(t, blk, j, sc);
            for (int i = 0; i < R; i++)
                acc[i][j & 1] = ACC_FMADD1(fs[i][j], sums(q, a->p + (r + i) * a->k + (8 * sb + j) * LB_QK),
                                           acc[i][j & 1]);
        }
    }
    for (int i = 0; i < R; i++) out[i * out_stride] = ACC_TOTAL(ACC_ADD(acc[i][0], acc[i][1])) - hsum(mins[i]);
}

#endif
