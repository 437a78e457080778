/* The block kernel for x86 vector units: the "avx2" build (AVX2, FMA, F16C), the "avx512" build
   (AVX-512 BW) and the "avx512vnni" build (the same with VNNI's dpwssd), chosen by the compiler's
   flags (fast/kernels/build.py ISAS). The AVX-512 builds take a block's 32 products in one madd
   where AVX2 takes two; VNNI fuses a madd and the add after it into one instruction on the same
   integers, so its results are the plain AVX-512 build's bit for bit. Each build does both layouts
   (blocks.h) for Q4_0, Q4_1, Q8_0 and the K types, the groups of 8 rows the faster (`llamablock
   bench file_blocks`), and the file's order for every type, Q5_0's and the K types' blocks of 32
   unpacked to bytes (quant_bytes) to meet x as Q8_0's do. The K types go a super-block at a time
   (x86_super.h): its scales are decoded once for its 8 blocks, in either layout. In the VNNI build a
   prompt's tiles of rows take the grouped 4- to 6-bit types through panels (x86_panel.h). */

#include <immintrin.h>
#include <stdlib.h>

#include "blocks.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "x86.c needs at least -mavx2 -mfma -mf16c (fast/kernels/build.py ISAS); generic.c is the portable build"
#endif

/* The grouped kernels read their weights once per call, front to back, and the hardware's prefetch
   alone left a thread's stream short of a plain read: each block's bytes are asked for PREFETCH
   bytes ahead (prefetches never fault, so past the end is harmless). The distance was chosen by hand
   on one AVX2 thread against 1, 2 and 8 KiB (the commit that added it has the timings); no benchmark
   repeats that comparison, nor has it been timed on an AVX-512 CPU, whose builds run this code too.
   Always inlined: GCC finds a function of prefetches alone "looping const" (no effect it must keep)
   and deletes the calls it has not inlined by then: the K types' kernels lost theirs, and their
   super-blocks streamed well short of a plain read (the commit that made it inline has timings). */
enum { PREFETCH = 4096 };
static LB_INLINE void prefetch_ahead(const uint8_t *p, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch((const char *)(p + PREFETCH + at), _MM_HINT_T0);
}

/* acc + the pairwise sums of 16-bit products a b in int32 lanes: one instruction with VNNI */
#if defined(__AVX512VNNI__)
#define MADD_ADD512(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#elif defined(__AVX512BW__)
#define MADD_ADD512(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#endif

static inline float hsum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

static inline int32_t hsum_epi32(__m256i a) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
}

/* Block b of x's copy in AVX2, for its finite blocks (0 returned otherwise: blocks.h
   lb_quantize_block then does the block, NaN scale and all). The same values as that code: amax
   and 1/e are computed alike, cvtps rounds to nearest even as lrintf does, and the clamp and byte
   split are exact. A prefill's x is many blocks (linear.c splits them between the threads), so it
   is worth vectorizing. */
static inline int quantize_block(const float *v, const lb_acts *a, int64_t b) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], amax8 = _mm256_setzero_ps(), finite8 = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        x[j] = _mm256_loadu_ps(v + 8 * j);
        amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, x[j]));
        finite8 = _mm256_add_ps(finite8, _mm256_sub_ps(x[j], x[j]));
    }
    if (hsum(finite8) != 0.0f) return 0;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const int most = a->bits == 8 ? 127 : 32767, shift = a->bits == 8 ? 8 : 0; /* as blocks.h */
    const float e8 = amax / (float)most, inv = e8 > 0.0f && 1.0f / e8 <= FLT_MAX ? 1.0f / e8 : 0.0f;
    const float e = e8 / (float)(1 << shift);
    const __m256 inv8 = _mm256_set1_ps(inv);
    const __m256i top = _mm256_set1_epi32(most), bottom = _mm256_set1_epi32(-most);
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], inv8));
        q[j] = _mm256_sll_epi32(_mm256_max_epi32(_mm256_min_epi32(q[j], top), bottom), _mm_cvtsi32_si128(shift));
    }
    /* int32 -> int16 (exact after the clamp); packs interleaves 128-bit lanes, the permute undoes it */
    const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8); /* values 0..15 */
    const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8); /* values 16..31 */
    _mm256_storeu_si256((__m256i *)(a->p + b * LB_QK), lo);
    _mm256_storeu_si256((__m256i *)(a->p + b * LB_QK + 16), hi);
    const __m256i byte = _mm256_set1_epi16(255);
    const __m256i low_bytes = _mm256_packus_epi16(_mm256_and_si256(lo, byte), _mm256_and_si256(hi, byte));
    const __m256i high_bytes = _mm256_packs_epi16(_mm256_srai_epi16(lo, 8), _mm256_srai_epi16(hi, 8));
    _mm256_storeu_si256((__m256i *)(a->lo + b * LB_QK), _mm256_permute4x64_epi64(low_bytes, 0xD8));
    _mm256_storeu_si256((__m256i *)(a->hi + b * LB_QK), _mm256_permute4x64_epi64(high_bytes, 0xD8));
    const int32_t first = hsum_epi32(_mm256_add_epi32(q[0], q[1])), sum = first + hsum_epi32(_mm256_add_epi32(q[2], q[3]));
    a->es[2 * b] = e;
    a->es[2 * b + 1] = e * (float)sum;
    a->ps[b] = sum;
    a->ps16[b] = first;
    return 1;
}

void lb_quantize(const float *x, int64_t b0, int64_t b1, const lb_acts *a) {
    for (int64_t b = b0; b < b1; b++)
        if (!quantize_block(x + b * LB_QK, a, b)) lb_quantize_block(x + b * LB_QK, a, b);
}

/* 32 bytes, byte i 16 where bit i of the little-endian qh4 is set, else 0: qh's byte i / 8, then its bit */
static inline __m256i fifth_bits(const uint8_t *qh4) {
    int32_t qh;
    memcpy(&qh, qh4, 4);
    const __m256i which = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), which);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* The 32 bytes at p, their 16-bit lanes shifted right by `shift` (a variable), `mask` of each byte kept */
static inline __m256i bits_at(const uint8_t *p, int shift, int mask) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8((char)mask));
}

/* Block j (of 32 weights) of the weight block blk as 32 int8 in the order of its weights, less the
   type's offset (Q4_0 8, Q5_0 16, Q6_K 32): every type's q fits a byte (layouts: blocks.h). The
   high bits shift left within 16-bit lanes, where no byte's bits reach the next byte's. */
static inline __m256i quant_bytes(const lb_traits *t, const uint8_t *blk, int j) {
    const uint8_t *qs = blk + t->head;
    if (t->type == LB_Q8_0) return _mm256_loadu_si256((const __m256i *)qs);
    if (t->type == LB_Q4_K || t->type == LB_Q5_K) { /* Q5_K: qh[32], then Q4_K's nibbles */
        const __m256i q = bits_at(qs + (t->type == LB_Q5_K ? 32 : 0) + 32 * (j / 2), 4 * (j & 1), 15);
        return t->type == LB_Q4_K ? q : _mm256_or_si256(q, _mm256_slli_epi16(bits_at(qs, j, 1), 4));
    }
    if (t->type == LB_Q6_K) { /* block j: quarter c of half h */
        const int h = j / 4, c = j % 4;
        const __m256i q = _mm256_or_si256(bits_at(blk + 64 * h + 32 * (c & 1), 4 * (c >> 1), 15),
                                          _mm256_slli_epi16(bits_at(blk + 128 + 32 * h, 2 * c, 3), 4));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    }
    /* Q4_0, Q4_1, Q5_0: 16 bytes of nibbles, the low ones weights 0..15, the high ones 16..31 */
    const __m128i raw = _mm_loadu_si128((const __m128i *)(qs + (t->type == LB_Q5_0 ? 4 : 0))), l = _mm_set1_epi8(15);
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, l)),
                                        _mm_and_si128(_mm_srli_epi16(raw, 4), l), 1);
    if (t->type == LB_Q5_0) q = _mm256_sub_epi8(_mm256_or_si256(q, fifth_bits(qs)), _mm256_set1_epi8(16));
    if (t->type == LB_Q4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    return q;
}

/* A block of 32's (d, m) in a float vector's low lanes: its weights are d q + m (m Q4_1's; lane 1
   is not read for the others, lb_has_min). The K types' scales are x86_super.h's. */
static inline __m128 block_scales(const uint8_t *blk) {
    int32_t dm = 0;
    memcpy(&dm, blk, 4); /* d, then m or the first quants */
    return _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
}

/* The vector primitives of each width: `unpack` a block of 32's integers q (the file's order) in 16
   bits, `k_ints` block j of a K-type super-block's (x86_super.h), `sums` of q p over a block as
   partial int32 sums (at most 4 products a lane, exact) converted to float, which rounds only past
   2^24 (Q6_K's scaled lanes can reach it), and `group_sums`, the 8 rows' exact integer sums of one
   block of a group for activation row r. */
#if defined(__AVX512BW__)
/* AVX-512: q in one vector of 32 int16 (weights 0..15, then 16..31), its 32 products in one madd. */
typedef __m512i block_ints;
typedef __m512 row_acc;
static inline block_ints unpack(const lb_traits *t, const uint8_t *blk, __m128 *dm) {
    *dm = block_scales(blk);
    return _mm512_cvtepi8_epi16(quant_bytes(t, blk, 0));
}
/* A Q6_K super-block's 16 scales in int16 lanes 0..15, read once for its 8 blocks (dot_super) */
typedef __m512i q6_scales;
static inline q6_scales q6_scales_of(const uint8_t *blk) {
    return _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))));
}
/* Block j of a K-type super-block as 32 int16, Q6_K's scales of 16 weights multiplied in (dot_super):
   scales 2j and 2j + 1 spread over the halves by one permute (j a constant: the index is too) */
static inline block_ints k_ints(const lb_traits *t, const uint8_t *blk, int j, q6_scales sc) {
    const block_ints q = _mm512_cvtepi8_epi16(quant_bytes(t, blk, j));
    if (t->type != LB_Q6_K) return q;
    const __m512i which = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * j)),
                                                  _mm512_set1_epi16((short)(2 * j + 1)));
    return _mm512_mullo_epi16(q, _mm512_permutexvar_epi16(which, sc));
}
static inline row_acc sums(block_ints q, const int16_t *p) {
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(q, _mm512_loadu_si512((const void *)p)));
}
#define ACC_ZERO _mm512_setzero_ps()
#define ACC_FMADD(s, v, acc) _mm512_fmadd_ps(_mm512_broadcastss_ps(s), v, acc)
#define ACC_FMADD1(f, v, acc) _mm512_fmadd_ps(_mm512_set1_ps(f), v, acc)
#define ACC_TOTAL(acc) _mm512_reduce_add_ps(acc)
#define ACC_ADD(a, b) _mm512_add_ps(a, b)

/* A 64-byte load is two chunks; each 16-bit lane pair is (row, 2 weights), so after the madds the
   qword lanes are the rows, each as two int32 halves, added and narrowed to 8 int32. */
static inline __m256i group_sums(const lb_traits *t, const uint8_t *qs, const lb_acts *a, int64_t r, int64_t b,
                                 const int eight) {
    (void)eight; /* 16-bit products: 8-bit x (p = 256 q) gives the same sums, at the same cost */
    const int16_t *p = a->p + r * a->k + b * LB_QK;
    __m512i acc = _mm512_setzero_si512();
    const __m512i low = _mm512_set1_epi8(15);
    for (int c = 0; c < t->chunks; c += 2) {
        __m512i raw = _mm512_loadu_si512((const void *)(qs + 32 * c));
        if (t->type == LB_Q8_0) {
            acc = MADD_ADD512(acc, _mm512_cvtepi8_epi16(_mm512_castsi512_si256(raw)),
                              _mm512_set1_epi64(*(const int64_t *)(p + 4 * c)));
            acc = MADD_ADD512(acc, _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(raw, 1)),
                              _mm512_set1_epi64(*(const int64_t *)(p + 4 * c + 4)));
            continue;
        }
        for (int half = 0; half < 2; half++) { /* low nibbles: weights 0..15; high: 16..31 */
            __m512i q = _mm512_and_si512(half ? _mm512_srli_epi16(raw, 4) : raw, low);
            if (t->type == LB_Q4_0) q = _mm512_sub_epi8(q, _mm512_set1_epi8(8));
            const int16_t *ph = p + 16 * half + 4 * c;
            __m512i q0 = t->type == LB_Q4_0 ? _mm512_cvtepi8_epi16(_mm512_castsi512_si256(q))
                                            : _mm512_cvtepu8_epi16(_mm512_castsi512_si256(q));
            __m512i q1 = t->type == LB_Q4_0 ? _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(q, 1))
                                            : _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(q, 1));
            acc = MADD_ADD512(acc, q0, _mm512_set1_epi64(*(const int64_t *)ph));
            acc = MADD_ADD512(acc, q1, _mm512_set1_epi64(*(const int64_t *)(ph + 4)));
        }
    }
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(acc, _mm512_srli_epi64(acc, 32))); /* row r: qword r */
}
#else
/* AVX2: q as two vectors of 16 int16 (lo: weights 0..15, hi: 16..31), Q4_0's offset of 8 taken off. */
typedef struct {
    __m256i lo, hi;
} block_ints;
typedef __m256 row_acc;
static inline block_ints unpack(const lb_traits *t, const uint8_t *blk, __m128 *dm) {
    *dm = block_scales(blk);
    const __m256i bytes = quant_bytes(t, blk, 0);
    return (block_ints){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)),
                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1))};
}
typedef const uint8_t *q6_scales; /* AVX2 reads Q6_K's scales a block at a time */
static inline q6_scales q6_scales_of(const uint8_t *blk) { return blk; }
static inline block_ints k_ints(const lb_traits *t, const uint8_t *blk, int j, q6_scales sc) {
    (void)sc;
    const __m256i bytes = quant_bytes(t, blk, j);
    block_ints q = {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1))};
    if (t->type != LB_Q6_K) return q;
    q.lo = _mm256_mullo_epi16(q.lo, _mm256_set1_epi16((int8_t)blk[192 + 2 * j]));
    q.hi = _mm256_mullo_epi16(q.hi, _mm256_set1_epi16((int8_t)blk[193 + 2 * j]));
    return q;
}
static inline row_acc sums(block_ints q, const int16_t *p) {
    __m256i a = _mm256_madd_epi16(q.lo, _mm256_loadu_si256((const __m256i *)p));
    __m256i b = _mm256_madd_epi16(q.hi, _mm256_loadu_si256((const __m256i *)(p + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
}
#define ACC_ZERO _mm256_setzero_ps()
#define ACC_FMADD(s, v, acc) _mm256_fmadd_ps(_mm256_broadcastss_ps(s), v, acc)
#define ACC_FMADD1(f, v, acc) _mm256_fmadd_ps(_mm256_set1_ps(f), v, acc)
#define ACC_TOTAL(acc) hsum(acc)
#define ACC_ADD(a, b) _mm256_add_ps(a, b)

/* Q8_0 with 32-byte vectors: a chunk's low 16 bytes are rows 0..3, its high ones rows 4..7, each
   row as two int32 lanes; one hadd adds the pairs (rows 0 1 4 5 | 2 3 6 7) and a permute orders
   them. Widening bytes to 16 bits takes AVX2 a shuffle each, so the 4-bit types go below instead. */
static inline __m256i group_sums_q8(const uint8_t *qs, const int16_t *p) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        const __m256i pv = _mm256_set1_epi64x(*(const int64_t *)(p + 4 * c));
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), pv));
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), pv));
    }
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8);
}

/* The same for 8-bit x (lb_acts bits 8: hi = q, lo = 0), its bytes against the weights' bytes:
   maddubs takes one operand unsigned, so |w| meets q with w's sign (llama.cpp's mul_sum_i8_pairs),
   pairs at most 2 * 128 * 127, widened at once; each chunk's lane r is row r. Times 256: p = 256 q. */
static inline __m256i group_sums_q8_eight(const uint8_t *qs, const int8_t *xh) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        int32_t h;
        memcpy(&h, xh + 4 * c, 4);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(h), w));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
    }
    return _mm256_slli_epi32(acc, 8);
}

/* Q4_0 and Q4_1 without widening: maddubs multiplies bytes, so each activation is taken as its two
   bytes, sum q p = 256 sum q hi + sum q lo (lo 0..255, hi -128..127), q the unsigned nibble. A chunk
   of 8 rows x 4 nibbles against the 4 activations' bytes broadcast gives each row's pair sums in
   16-bit lanes (at most 2 * 15 * 128 for hi, 2 * 255 * 15 for lo), added in 16 bits while they
   cannot overflow (8 of the hi sums, 4 of the lo ones), then madd makes each row one int32 lane,
   in row order. Q4_0's offset is taken off as 8 P, P the activations' integer sum. Exact, as above. */
static inline __m256i group_sums_q4(int type, const uint8_t *qs, const uint8_t *xl, const int8_t *xh, int32_t p,
                                    const int eight) { /* eight: lo is 0 (8-bit x), its products skipped */
    const __m256i low = _mm256_set1_epi8(15);
    __m256i high_sum = _mm256_setzero_si256(), low_sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        for (int half = 0; half < 2; half++) { /* low nibbles: weights 0..15; high: 16..31 */
            const __m256i q = _mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw, low);
            int32_t l, h;
            memcpy(&l, xl + 16 * half + 4 * c, 4);
            memcpy(&h, xh + 16 * half + 4 * c, 4);
            high_sum = _mm256_add_epi16(high_sum, _mm256_maddubs_epi16(q, _mm256_set1_epi32(h)));
            if (!eight) low_sums[half] = _mm256_add_epi16(low_sums[half], _mm256_maddubs_epi16(_mm256_set1_epi32(l), q));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_madd_epi16(high_sum, _mm256_set1_epi16(256));
    if (!eight)
        s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(low_sums[0], ones), _mm256_madd_epi16(low_sums[1], ones)));
    return type == LB_Q4_0 ? _mm256_sub_epi32(s, _mm256_set1_epi32(8 * p)) : s;
}

static inline __m256i group_sums(const lb_traits *t, const uint8_t *qs, const lb_acts *a, int64_t r, int64_t b,
                                 const int eight) {
    const int64_t at = r * a->k + b * LB_QK;
    if (t->type == LB_Q8_0) return eight ? group_sums_q8_eight(qs, a->hi + at) : group_sums_q8(qs, a->p + at);
    return group_sums_q4(t->type, qs, a->lo + at, a->hi + at, a->ps[r * a->nb + b], eight);
}
#endif

/* One weight row of blocks of 32 against R activation rows from r (R = 1 for decode, 4 in prefill):
   each block is unpacked once for all R, and a row's sums come in the same order whatever R is, so
   its result does not depend on the rows beside it (test_file_blocks.py checks it bit for bit). */
static inline void dot_rows(const int R, const lb_traits *t, const uint8_t *w, const lb_acts *a, int64_t r, float *out,
                            int64_t out_stride) {
    row_acc acc[4] = {ACC_ZERO, ACC_ZERO, ACC_ZERO, ACC_ZERO};
    __m128 terms[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < a->nb; b++) {
        __m128 dm;
        const block_ints q = unpack(t, w + b * t->bytes, &dm);
        for (int i = 0; i < R; i++) {
            const float *e = a->es + (r + i) * 2 * a->nb + 2 * b;
            __m128 s = _mm_mul_ps(dm, _mm_castpd_ps(_mm_load_sd((const double *)e))); /* (d e, m e P) */
            terms[i] = _mm_add_ps(terms[i], s); /* lane 1 sums Q4_1's m e P */
            acc[i] = ACC_FMADD(s, sums(q, a->p + (r + i) * a->k + b * LB_QK), acc[i]);
        }
    }
    for (int i = 0; i < R; i++) {
        float total = ACC_TOTAL(acc[i]);
        out[i * out_stride] = lb_has_min(t->type) ? total + _mm_cvtss_f32(_mm_movehdup_ps(terms[i])) : total;
    }
}

#include "x86_super.h" /* dot_super: the K types, a super-block at a time */
#include "x86_panel.h" /* panels: prefill in the AVX-512 VNNI build */

/* One group's 8 weight rows against R activation rows from r: out[i * out_stride + 0..7]. Each
   block's 8 integer sums are exact; the float work per block is one product of scales and a fused
   multiply-add (and Q4_1's m e P), the same sequence for a row whatever R is. */
static inline void dot_group(const int R, const lb_traits *t, const uint8_t *g, const lb_acts *a, int64_t r,
                             float *out, int64_t out_stride, const int eight) {
    const int64_t bytes = LB_GROUP * t->bytes, head = LB_GROUP * t->head;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < a->nb; b++) {
        const uint8_t *blk = g + b * bytes;
        prefetch_ahead(blk, bytes);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        for (int i = 0; i < R; i++) {
            const float *e = a->es + (r + i) * 2 * a->nb + 2 * b;
            const __m256 s = _mm256_cvtepi32_ps(group_sums(t, blk + head, a, r + i, b, eight));
            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(e)), s, acc[i]);
            if (t->type == LB_Q4_1)
                acc[i] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * LB_GROUP))),
                                         _mm256_broadcast_ss(e + 1), acc[i]);
        }
    }
    for (int i = 0; i < R; i++) _mm256_storeu_ps(out + i * out_stride, acc[i]);
}

static LB_INLINE void rows(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0,
                           int64_t r1, float *y, int64_t n) {
    const int64_t row = lb_row_bytes(t, a->k);
    for (int64_t i = i0; i < i1; i++) {
        int64_t r = r0;
        if (t->weights != LB_QK) { /* the K types */
            for (; r + 4 <= r1; r += 4) dot_super(4, t, w + i * row, a, r, y + r * n + i, n);
            for (; r < r1; r++) dot_super(1, t, w + i * row, a, r, y + r * n + i, n);
            continue;
        }
        for (; r + 4 <= r1; r += 4) dot_rows(4, t, w + i * row, a, r, y + r * n + i, n);
        for (; r < r1; r++) dot_rows(1, t, w + i * row, a, r, y + r * n + i, n);
    }
}

static LB_INLINE void groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a,
                             int64_t r0, int64_t r1, float *y, int64_t n) {
#if defined(__AVX512VNNI__)
    if (panel_type(t) && r1 - r0 >= panel_from(t) && panels(t, w, i0, i1, a, r0, r1, y, n)) return;
#endif
    const int64_t row = lb_row_bytes(t, a->k);
    /* each kernel compiled twice, for 16-bit x and for 8-bit x (eight a constant: lo's work dropped) */
#define GROUP_CALLS(kernel)                                                                           \
    do {                                                                                              \
        for (; r + 4 <= r1; r += 4)                                                                   \
            a->bits == 8 ? kernel(4, t, w + i * row, a, r, y + r * n + i, n, 1)                       \
                         : kernel(4, t, w + i * row, a, r, y + r * n + i, n, 0);                      \
        for (; r < r1; r++)                                                                           \
            a->bits == 8 ? kernel(1, t, w + i * row, a, r, y + r * n + i, n, 1)                       \
                         : kernel(1, t, w + i * row, a, r, y + r * n + i, n, 0);                      \
    } while (0)
    for (int64_t i = i0; i < i1; i += LB_GROUP) {
        int64_t r = r0;
        if (t->type == LB_Q6_K)
            GROUP_CALLS(dot_group_q6);
        else if (t->weights != LB_QK) /* Q4_K, Q5_K */
            GROUP_CALLS(dot_group_super);
        else
            GROUP_CALLS(dot_group);
    }
#undef GROUP_CALLS
}

LB_ENTRY_POINTS /* lb_rows and lb_groups over rows() and groups() above, per type (blocks.h) */
