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

/* The grouped layout (blocks.h): the integer sums of `chunks` chunks q[] of a block for 8 weight
   rows against activation row r, as 8 int32 lanes, one a row. Chunk k holds weights 4k..4k+3 of
   its 8 rows, one unsigned byte each (Q4_K's 4 bits, Q5_K's 5, Q6_K's 6: `six`); x's integers meet
   them as their two bytes, sum q p = 256 sum q hi + sum q lo (lb_acts lo, hi), so every product is
   of bytes: VNNI's dpbusd takes 4 a lane and adds them in int32; without it, maddubs pairs them
   in int16 and madd widens: hi's pairs (at most 2 * 63 * 128) two chunks at a time, lo's (2 * 31 *
   255; with six bits 2 * 63 * 255) two at a time below six bits, else one. `eight`: 8-bit x
   (lb_acts bits 8), whose lo bytes are 0: their products are skipped. Exact either way, as the
   sums are integers and no partial sum overflows. */
static inline __m256i chunk_sums(const __m256i *q, const int chunks, const int six, const uint8_t *lo,
                                 const int8_t *hi, const int eight) {
    __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)six;
    for (int k = 0; k < chunks; k++) {
        int32_t l, h;
        memcpy(&l, lo + 4 * k, 4);
        memcpy(&h, hi + 4 * k, 4);
        if (!eight) low = _mm256_dpbusd_epi32(low, _mm256_set1_epi32(l), q[k]); /* lo unsigned, q as signed (< 64) */
        high = _mm256_dpbusd_epi32(high, q[k], _mm256_set1_epi32(h));            /* q unsigned, hi signed */
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    for (int k = 0; k < chunks; k += 2) {
        int32_t l0, l1, h0, h1;
        memcpy(&l0, lo + 4 * k, 4), memcpy(&l1, lo + 4 * k + 4, 4);
        memcpy(&h0, hi + 4 * k, 4), memcpy(&h1, hi + 4 * k + 4, 4);
        if (!eight) {
            const __m256i l_0 = _mm256_maddubs_epi16(_mm256_set1_epi32(l0), q[k]);
            const __m256i l_1 = _mm256_maddubs_epi16(_mm256_set1_epi32(l1), q[k + 1]);
            low = six ? _mm256_add_epi32(low, _mm256_add_epi32(_mm256_madd_epi16(l_0, ones), _mm256_madd_epi16(l_1, ones)))
                      : _mm256_add_epi32(low, _mm256_madd_epi16(_mm256_add_epi16(l_0, l_1), ones));
        }
        const __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(q[k], _mm256_set1_epi32(h0)),
                                           _mm256_maddubs_epi16(q[k + 1], _mm256_set1_epi32(h1)));
        high = _mm256_add_epi32(high, _mm256_madd_epi16(h, ones));
    }
#endif
    return _mm256_add_epi32(low, _mm256_slli_epi32(high, 8));
}

/* Field pair (2f, 2f + 1) of a grouped head's 2-byte fields as one 32-bit word per row, rows in lanes */
static inline __m256i head_words(const uint8_t *head, int f) {
    const __m128i a = _mm_loadu_si128((const __m128i *)(head + 16 * f)), b = _mm_loadu_si128((const __m128i *)(head + 16 * f + 16));
    return _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
}

/* Block j (of 32 weights) of a grouped Q4_K or Q5_K super-block at `head`, for its 8 rows (rows in
   lanes): its chunks q[k], weights 4k..4k+3 of the 8 rows, a byte each (0..31), the rows' d sc (`f`)
   and dmin m (`min`), decoded as blocks.h lb_k_scale does one row's (sc0, m0: groups 0..3; sc1, m1:
   4..7). Shared by the decode kernel below and the prefill panels (x86_panel.h); with j a constant
   the compiler keeps one decode of the scales for a super-block's 8 blocks. */
static LB_INLINE void k_group_block(const lb_traits *t, const uint8_t *head, int j, __m256i q[8], __m256 *f,
                                    __m256 *min) {
    const int five = t->type == LB_Q5_K;
    const uint8_t *qs = head + LB_GROUP * t->head;
    const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f),
                  top2 = _mm256_set1_epi32(0x03030303), byte = _mm256_set1_epi32(255), nibble = _mm256_set1_epi8(15);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)head));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16)));
    const __m256i u0 = head_words(head, 2), u1 = head_words(head, 4), u2 = head_words(head, 6);
    const __m256i sc0 = _mm256_and_si256(u0, low6), m0 = _mm256_and_si256(u1, low6);
    const __m256i sc1 = _mm256_or_si256(_mm256_and_si256(u2, low4),
                                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), top2), 4));
    const __m256i m1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), low4),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), top2), 4));
    const int shift = 8 * (j & 3);
    *f = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(j < 4 ? sc0 : sc1, shift), byte)));
    *min = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(j < 4 ? m0 : m1, shift), byte)));
    const uint8_t *nib = qs + 32 * (8 * five + 8 * (j >> 1)); /* Q5_K: 8 chunks of qh first */
    for (int k = 0; k < 8; k++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(nib + 32 * k));
        q[k] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, nibble);
        if (five) { /* bit j of qh byte i: weight i's fifth bit, worth 16 */
            const __m256i h = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));
            q[k] = _mm256_or_si256(q[k], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), _mm256_set1_epi8(1)), 4));
        }
    }
}

/* One group's 8 weight rows of Q4_K or Q5_K against R activation rows from r: out[i * out_stride +
   0..7]. Per super-block the 8 rows' scales and mins are decoded together (k_group_block), each
   block's 8 bytes of nibbles (and Q5_K's fifth bits) are taken out once for all R rows, and each
   block's integer sums get one conversion and one multiply-add by d sc e, the mins' term one more
   by dmin m e P. */
static LB_INLINE void dot_group_super(const int R, const lb_traits *t, const uint8_t *g, const lb_acts *a,
                                      int64_t r, float *out, int64_t out_stride, const int eight) {
    const int64_t bytes = LB_GROUP * t->bytes;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t sb = 0; sb < a->nb / 8; sb++) {
        const uint8_t *head = g + sb * bytes;
        prefetch_ahead(head, bytes);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i q[8];
            __m256 sc, m;
            k_group_block(t, head, j, q, &sc, &m);
            for (int i = 0; i < R; i++) {
                const int64_t b = 8 * sb + j, at = (r + i) * a->k + b * LB_QK;
                const float *e = a->es + (r + i) * 2 * a->nb + 2 * b;
                const __m256 s = _mm256_cvtepi32_ps(chunk_sums(q, 8, 0, a->lo + at, a->hi + at, eight));
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_broadcast_ss(e)), s, acc[i]);
                acc[i] = _mm256_fnmadd_ps(m, _mm256_broadcast_ss(e + 1), acc[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(out + i * out_stride, acc[i]);
}

/* Block j of a grouped Q6_K super-block at `head` for its 8 rows: its chunks q[k] (weights 4k..4k+3,
   a byte each, 0..63) and the rows' d sc of its two halves of 16 (`f0`, `f1`). The grouped block
   (blocks.h) is the file's rotated: fields 0..7 of its head are each row's two scales of block j,
   field 8 its d, then ql's 32 chunks and qh's 16. Block j (quarter c of half h) takes its low 4
   bits from ql chunks 16 h + 8 (c & 1) + k, nibble c >> 1, and its top 2 from qh chunks 8 h + k,
   bits 2c, as in the file's order (quant_bytes). d sc is exact: 11 bits times 8. */
static LB_INLINE void q6_group_block(const lb_traits *t, const uint8_t *head, int j, __m256i q[8], __m256 *f0,
                                    __m256 *f1) {
    const uint8_t *qs = head + LB_GROUP * t->head;
    const __m256i nibble = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 2 * LB_GROUP * 8)));
    const int h = j / 4, c = j % 4;
    /* each row's scales 2j and 2j + 1 as the int16 halves of its 32-bit lane */
    const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(head + 2 * LB_GROUP * j)));
    *f0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16)));
    *f1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(pair, 16)));
    const uint8_t *ql = qs + 32 * (16 * h + 8 * (c & 1)), *qh = qs + 32 * (32 + 8 * h);
    for (int k = 0; k < 8; k++) {
        const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * k));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * k));
        /* bits 2c, 2c + 1 of each qh byte to bits 4, 5 (shifts in 16-bit lanes, then masked) */
        const __m256i high2 = c < 2 ? _mm256_slli_epi16(hb, 4 - 2 * c) : _mm256_srli_epi16(hb, 2 * c - 4);
        q[k] = _mm256_or_si256(_mm256_and_si256(c >> 1 ? _mm256_srli_epi16(l, 4) : l, nibble),
                               _mm256_and_si256(high2, top));
    }
}

/* One group's 8 weight rows of Q6_K against R activation rows from r: out[i * out_stride + 0..7].
   Each half's sum of (q - 32) p is sum q p - 32 P16 (lb_acts ps16), at most 16 * 32 * 32767 < 2^24,
   so its conversion to float is exact; it is then multiplied by d sc e in one fused multiply-add.
   Where the file's order (dot_super) multiplies the scales into the integers, this keeps them
   apart, so the two layouts round differently: both within the 16-bit activations' bound
   (test_kquant_blocks.py). */
static LB_INLINE void dot_group_q6(const int R, const lb_traits *t, const uint8_t *g, const lb_acts *a, int64_t r,
                                   float *out, int64_t out_stride, const int eight) {
    const int64_t bytes = LB_GROUP * t->bytes;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t sb = 0; sb < a->nb / 8; sb++) {
        const uint8_t *head = g + sb * bytes;
        prefetch_ahead(head, bytes);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i q[8];
            __m256 dsc0, dsc1;
            q6_group_block(t, head, j, q, &dsc0, &dsc1);
            for (int i = 0; i < R; i++) {
                const int64_t b = 8 * sb + j, at = (r + i) * a->k + b * LB_QK, ib = (r + i) * a->nb + b;
                const __m256 e = _mm256_broadcast_ss(a->es + 2 * ib);
                const int32_t p0 = a->ps16[ib], p1 = a->ps[ib] - p0;
                const __m256i s0 = _mm256_sub_epi32(chunk_sums(q, 4, 1, a->lo + at, a->hi + at, eight), _mm256_set1_epi32(32 * p0));
                const __m256i s1 = _mm256_sub_epi32(chunk_sums(q + 4, 4, 1, a->lo + at + 16, a->hi + at + 16, eight),
                                                    _mm256_set1_epi32(32 * p1));
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dsc0, e), _mm256_cvtepi32_ps(s0), acc[i]);
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dsc1, e), _mm256_cvtepi32_ps(s1), acc[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(out + i * out_stride, acc[i]);
}

#endif
