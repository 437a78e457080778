/* Matrix products over GGML's own weight blocks (Q4_0, Q4_1, Q8_0), for decode and prefill.

   Why a kernel of our own: PyTorch's packed CPU matmuls (aten._weight_int4pack_mm_for_cpu,
   _weight_int8pack_mm) take their scales in the activations' dtype, and are fast only in
   bfloat16, so a file's float16 scales cannot run there unrounded; and with AVX2 alone they run
   several times slower per call than with AVX-512 (`llamablock bench file_blocks` times them
   beside this kernel on each). The scheme is llama.cpp's (ggml_vec_dot_q4_1_q8_1 and its kin,
   ggml-cpu quants.c): each row of x is quantized in blocks of 32 with a float32 scale, and each
   weight block meets its activation block in an integer dot product. Where llama.cpp quantizes x
   to 8 bits (maddubs: 32 products per instruction), x here takes 16 bits (madd_epi16, 16 per
   instruction): 8 bits put an error of up to 1/254 of each block's largest value on every
   activation, 16 bits 1/65,534, and a decode call ran no slower (the commit that chose 16 bits
   compared both; `llamablock perplexity --compare float32` measures the model's KL).

   Blocks, as GGUF stores them (ggml-common.h), 32 weights each, d and m float16:
     Q4_0  18 bytes: d, qs[16]       w[j] = d * ((qs[j] & 15) - 8),  w[j + 16] = d * ((qs[j] >> 4) - 8)
     Q4_1  20 bytes: d, m, qs[16]    w[j] = d * (qs[j] & 15) + m,    w[j + 16] = d * (qs[j] >> 4) + m
     Q8_0  34 bytes: d, qs[32] int8  w[j] = d * qs[j]
   With activation block (e, p[32]) and P = sum p, a block's dot product is
     Q4_0: d e sum (q - 8) p       Q4_1: d e sum q p + m e P     Q8_0: d e sum q p
   where q are the stored integers; the integer sums are exact.

   Three builds (fast/kernels/ggml_kernel.py best_isa picks one per CPU): AVX-512 BW, AVX2 (with FMA, F16C),
   and portable C. Each computes the file's order of blocks and the groups of 8 rows below; the
   vector builds run the groups (ggml_kernel.GROUPING_ISAS), where the file's order leaves scalar
   work per block and row (`llamablock bench file_blocks` times both layouts in both builds). */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* GGML's type ids */
enum { GROUPED = 256 }; /* added to a type id: the weights are in groups of 8 rows (below) */

int lb_block_bytes(int type) {
    return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q8_0 ? 34 : 0;
}

/* Groups of 8 rows (fast/kernels/file_blocks.py group_rows, done once at load). The same bytes
   as the file's, reordered so that one vector holds the same weights of 8 rows: per block b of a
   group, 8 blocks' worth of bytes,
     [d of rows 0..7, float16][m of rows 0..7, Q4_1 only][chunks of 32 bytes: chunk c is rows 0..7's
     qs bytes 4c..4c+3, row after row]   (4 chunks for Q4_0/Q4_1, 8 for Q8_0)
   A chunk against the activations' 4 integers broadcast gives each row's partial sums in its own
   lanes (group_sums below), and the 8 rows' scales are one float16 vector: the per-block scalar
   work of the file's layout (a horizontal sum and a scale conversion per row) is done for 8 rows
   in a few vector operations. The scheme is llama.cpp's repacked layouts' (ggml-cpu/repack.cpp,
   block_q4_0x8), with x in 16 bits as above. */
enum { GROUP = 8 };
static inline int group_head(int type) { return type == Q4_1 ? 32 : 16; } /* d (and m) of 8 rows */
static inline int group_chunks(int type) { return type == Q8_0 ? 8 : 4; }

#if defined(__AVX2__)
static inline float hsum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* One block of quantize_rows below in AVX2, for its finite blocks (0 returned otherwise: the scalar
   code then does the block, NaN scale and all). The same values as the scalar code: amax and 1/e are
   computed alike, cvtps rounds to nearest even as lrintf does, and the clamp and byte split are
   exact. It runs before each call's parallel loop, on one thread, so it is worth vectorizing. */
static inline int quantize_block(const float *v, float *es, int32_t *ps, int16_t *xq, uint8_t *xl, int8_t *xh) {
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
    const float e = amax / 32767.0f, inv = e > 0.0f && 1.0f / e <= FLT_MAX ? 1.0f / e : 0.0f; /* as below */
    const __m256 inv8 = _mm256_set1_ps(inv);
    const __m256i top = _mm256_set1_epi32(32767), bottom = _mm256_set1_epi32(-32767);
    __m256i q[4], sum8 = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], inv8));
        q[j] = _mm256_max_epi32(_mm256_min_epi32(q[j], top), bottom);
        sum8 = _mm256_add_epi32(sum8, q[j]);
    }
    /* int32 -> int16 (exact after the clamp); packs interleaves 128-bit lanes, the permute undoes it */
    const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);  /* values 0..15 */
    const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);  /* values 16..31 */
    _mm256_storeu_si256((__m256i *)xq, lo);
    _mm256_storeu_si256((__m256i *)(xq + 16), hi);
    const __m256i byte = _mm256_set1_epi16(255);
    const __m256i low_bytes = _mm256_packus_epi16(_mm256_and_si256(lo, byte), _mm256_and_si256(hi, byte));
    const __m256i high_bytes = _mm256_packs_epi16(_mm256_srai_epi16(lo, 8), _mm256_srai_epi16(hi, 8));
    _mm256_storeu_si256((__m256i *)xl, _mm256_permute4x64_epi64(low_bytes, 0xD8));
    _mm256_storeu_si256((__m256i *)xh, _mm256_permute4x64_epi64(high_bytes, 0xD8));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    const int32_t sum = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
    es[0] = e;
    es[1] = e * (float)sum;
    *ps = sum;
    return 1;
}
#endif

/* x (m, k) float32 -> xq (m, k) int16 and es (m, k/32, 2) float32: per block of 32, its scale e
   (amax / 32767) and e P, P the sum of its 32 integers (for Q4_1's m term). Also each integer's two
   bytes apart, p = 256 ph + pl with pl unsigned (xl, xh: (m, k)), and P itself (ps: (m, k/32)), for
   the AVX2 group kernel's 8-bit products. */
static void quantize_rows(const float *x, int64_t m, int64_t k, int16_t *xq, float *es, uint8_t *xl, int8_t *xh,
                          int32_t *ps) {
    int64_t nb = k / 32;
    for (int64_t b = 0; b < m * nb; b++) {
        const float *v = x + b * 32;
#if defined(__AVX2__)
        if (quantize_block(v, &es[2 * b], &ps[b], xq + b * 32, xl + b * 32, xh + b * 32)) continue;
#endif
        float amax = 0.0f, finite = 0.0f;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(v[i]));
            finite += v[i] - v[i]; /* 0, or NaN where a value is NaN or infinite */
        }
        /* a block whose largest |x| is under about 1e-34 has no finite 1/e: it counts as zeros, as a
           flush-to-zero unit would take it (its products are below float32's resolution of any others) */
        float e = amax / 32767.0f, inv = e > 0.0f && 1.0f / e <= FLT_MAX ? 1.0f / e : 0.0f;
        if (finite != 0.0f) e = NAN; /* the block's products are NaN, as a float matmul's would be */
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            int q = (int)lrintf(v[i] * inv);
            q = q > 32767 ? 32767 : q < -32767 ? -32767 : q;
            xq[b * 32 + i] = (int16_t)q;
            xl[b * 32 + i] = (uint8_t)(q & 255);
            xh[b * 32 + i] = (int8_t)((q - (q & 255)) / 256); /* exact: q - pl is a multiple of 256 */
            sum += q;
        }
        es[2 * b] = e;
        es[2 * b + 1] = e * (float)sum;
        ps[b] = sum;
    }
}

#if defined(__AVX512BW__)
/* AVX-512 (BW): a block's 32 integers q in one vector of 32 int16 (weights 0..15, then 16..31), and
   its 32 products in one madd. The AVX2 build below takes two of each. */
typedef __m512i block_ints;
typedef __m512 row_acc;
static inline block_ints unpack(int type, const uint8_t *qs) {
    if (type == Q8_0) return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)qs));
    __m128i raw = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(15); /* low nibbles first */
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, low)),
                                        _mm_and_si128(_mm_srli_epi16(raw, 4), low), 1);
    if (type == Q4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8)); /* 0..15 - 8 fits int8 */
    return type == Q4_0 ? _mm512_cvtepi8_epi16(q) : _mm512_cvtepu8_epi16(q);
}
/* sum q p over a block as 16 partial int32 sums (exact, as below), converted to float. */
static inline row_acc sums(block_ints q, const int16_t *p) {
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(q, _mm512_loadu_si512((const void *)p)));
}
#define ACC_ZERO _mm512_setzero_ps()
#define ACC_FMADD(s, v, acc) _mm512_fmadd_ps(_mm512_broadcastss_ps(s), v, acc)
#define ACC_TOTAL(acc) _mm512_reduce_add_ps(acc)
#elif defined(__AVX2__)
/* AVX2: a block's 32 integers q as two vectors of 16 int16 (lo: weights 0..15, hi: 16..31); Q4_0's
   offset of 8 taken off. */
typedef struct { __m256i lo, hi; } block_ints;
typedef __m256 row_acc;
static inline block_ints unpack(int type, const uint8_t *qs) {
    block_ints q;
    if (type == Q8_0) {
        q.lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
        q.hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
        return q;
    }
    __m128i raw = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(15); /* low nibbles first */
    q.lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, low));
    q.hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), low));
    if (type == Q4_0) {
        q.lo = _mm256_sub_epi16(q.lo, _mm256_set1_epi16(8));
        q.hi = _mm256_sub_epi16(q.hi, _mm256_set1_epi16(8));
    }
    return q;
}

/* sum q p over a block as 8 partial int32 sums, converted to float. Each pair's product sum is
   exact in int32 (|q| <= 128, |p| <= 32767), so is the block's (< 2^31); the float conversion
   rounds only past 2^24. */
static inline row_acc sums(block_ints q, const int16_t *p) {
    __m256i a = _mm256_madd_epi16(q.lo, _mm256_loadu_si256((const __m256i *)p));
    __m256i b = _mm256_madd_epi16(q.hi, _mm256_loadu_si256((const __m256i *)(p + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
}
#define ACC_ZERO _mm256_setzero_ps()
#define ACC_FMADD(s, v, acc) _mm256_fmadd_ps(_mm256_broadcastss_ps(s), v, acc)
#define ACC_TOTAL(acc) hsum(acc)
#endif

#if defined(__AVX2__)
/* (d, m) of one block as floats in the low lanes: its float16 d (and m) converted together. */
static inline __m128 halves(const uint8_t *blk) {
    int32_t dm;
    memcpy(&dm, blk, 4); /* d, then m (Q4_1) or the first quants (their lane is not used) */
    return _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
}

/* One weight row against R activation rows (R = 1 for decode, 4 in prefill): each block is unpacked
   once for all R, and every row's sums are made in the same order whatever R is, so a row's result
   does not depend on the rows computed beside it (tests/fast/kernels/test_file_blocks.py checks it bit for
   bit). R is a constant at each call, so the compiler unrolls the row loops and keeps acc and terms
   in registers. */
static inline void dot_rows(const int R, int type, const uint8_t *w, const int16_t *xq, const float *es, int64_t k,
                            int64_t nb, float *out, int64_t out_stride) {
    const int bytes = lb_block_bytes(type), skip = type == Q4_1 ? 4 : 2;
    row_acc acc[4] = {ACC_ZERO, ACC_ZERO, ACC_ZERO, ACC_ZERO};
    __m128 terms[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        const block_ints q = unpack(type, blk + skip);
        const __m128 dm = halves(blk);
        for (int r = 0; r < R; r++) {
            const float *e = es + r * 2 * nb + 2 * b;
            __m128 s = _mm_mul_ps(dm, _mm_castpd_ps(_mm_load_sd((const double *)e))); /* (d e, m e P) */
            terms[r] = _mm_add_ps(terms[r], s); /* lane 1 sums Q4_1's m e P */
            acc[r] = ACC_FMADD(s, sums(q, xq + r * k + b * 32), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float total = ACC_TOTAL(acc[r]);
        out[r * out_stride] = type == Q4_1 ? total + _mm_cvtss_f32(_mm_shuffle_ps(terms[r], terms[r], 1)) : total;
    }
}

#if defined(__AVX512BW__)
/* The 8 rows' integer sums of one block of a group, for one activation row p (its 32
   int16). A 64-byte load is two chunks; each 16-bit lane pair is (row, 2 weights), so after the
   madds the qword lanes are the rows, each as two int32 halves, added and narrowed to 8 int32. */
static inline __m256i group_sums(int type, const uint8_t *qs, const int16_t *p) {
    __m512i acc = _mm512_setzero_si512();
    const __m512i low = _mm512_set1_epi8(15);
    for (int c = 0; c < group_chunks(type); c += 2) {
        __m512i raw = _mm512_loadu_si512((const void *)(qs + 32 * c));
        if (type == Q8_0) {
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(raw)),
                                                          _mm512_set1_epi64(*(const int64_t *)(p + 4 * c))));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(raw, 1)),
                                                          _mm512_set1_epi64(*(const int64_t *)(p + 4 * c + 4))));
            continue;
        }
        for (int half = 0; half < 2; half++) { /* low nibbles: weights 0..15; high: 16..31 */
            __m512i q = _mm512_and_si512(half ? _mm512_srli_epi16(raw, 4) : raw, low);
            if (type == Q4_0) q = _mm512_sub_epi8(q, _mm512_set1_epi8(8));
            const int16_t *ph = p + 16 * half + 4 * c;
            __m512i q0 = type == Q4_0 ? _mm512_cvtepi8_epi16(_mm512_castsi512_si256(q))
                                      : _mm512_cvtepu8_epi16(_mm512_castsi512_si256(q));
            __m512i q1 = type == Q4_0 ? _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(q, 1))
                                      : _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(q, 1));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(q0, _mm512_set1_epi64(*(const int64_t *)ph)));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(q1, _mm512_set1_epi64(*(const int64_t *)(ph + 4))));
        }
    }
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(acc, _mm512_srli_epi64(acc, 32))); /* row r: qword r */
}
#else
/* Q8_0 as above with 32-byte vectors: a chunk's low 16 bytes are rows 0..3, its high ones rows 4..7,
   each row as two int32 lanes; one hadd adds the pairs (rows 0 1 4 5 | 2 3 6 7) and a permute orders
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

/* Q4_0 and Q4_1 without widening: maddubs multiplies bytes, so each activation is taken as its two
   bytes, sum q p = 256 sum q ph + sum q pl (pl 0..255, ph -128..127), q the unsigned nibble. A chunk
   of 8 rows x 4 nibbles against the 4 activations' bytes broadcast gives each row's pair sums in
   16-bit lanes (at most 2 * 15 * 128 for ph, 2 * 255 * 15 for pl), added in 16 bits while they
   cannot overflow (8 of the ph sums, 4 of the pl ones), then madd makes each row one int32 lane,
   in row order. Q4_0's offset is taken off as 8 P, P the activations' integer sum. Exact, as above. */
static inline __m256i group_sums_q4(int type, const uint8_t *qs, const uint8_t *xl, const int8_t *xh, int32_t p) {
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
            low_sums[half] = _mm256_add_epi16(low_sums[half], _mm256_maddubs_epi16(_mm256_set1_epi32(l), q));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(high_sum, _mm256_set1_epi16(256)),
                                 _mm256_add_epi32(_mm256_madd_epi16(low_sums[0], ones),
                                                  _mm256_madd_epi16(low_sums[1], ones)));
    return type == Q4_0 ? _mm256_sub_epi32(s, _mm256_set1_epi32(8 * p)) : s;
}
#endif

/* 8 weight rows (one group, nb blocks) against R activation rows: out[r * out_stride + 0..7].
   Each block's 8 integer sums are exact; the float work per block is one product of scales and a
   fused multiply-add (and Q4_1's m e P), the same sequence for a row whatever R is. */
static inline void dot_group(const int R, int type, const uint8_t *g, const int16_t *xq, const float *es,
                             const uint8_t *xl, const int8_t *xh, const int32_t *ps, int64_t k, int64_t nb, float *out,
                             int64_t out_stride) {
    const int bytes = GROUP * lb_block_bytes(type), head = group_head(type);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * bytes;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        for (int r = 0; r < R; r++) {
            const float *e = es + r * 2 * nb + 2 * b;
#if defined(__AVX512BW__)
            const __m256i sums = group_sums(type, blk + head, xq + r * k + b * 32);
#else
            const __m256i sums = type == Q8_0 ? group_sums_q8(blk + head, xq + r * k + b * 32)
                                              : group_sums_q4(type, blk + head, xl + r * k + b * 32,
                                                              xh + r * k + b * 32, ps[r * nb + b]);
#endif
            const __m256 s = _mm256_cvtepi32_ps(sums);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(e)), s, acc[r]);
            if (type == Q4_1)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))),
                                         _mm256_broadcast_ss(e + 1), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * out_stride, acc[r]);
}

#endif

#if !defined(__AVX2__)
static float half_to_float(const uint8_t *p) { /* exact: every float16 is a float32 */
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t exp = (h >> 10) & 31, man = h & 1023, bits;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* zero or subnormal: man * 2^-24, exact */
    } else {
        bits = (exp == 31 ? 0x7f800000u : (exp + 112) << 23) | (man << 13);
        memcpy(&f, &bits, 4);
    }
    return (h & 0x8000) ? -f : f;
}

/* One weight row (nb blocks) against one quantized activation row, in portable C. */
static float dot_row(int type, const uint8_t *w, const int16_t *xq, const float *es, int64_t nb) {
    const int bytes = lb_block_bytes(type), skip = type == Q4_1 ? 4 : 2;
    float total = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        const int16_t *p = xq + b * 32;
        int32_t s = 0;
        if (type == Q8_0) {
            for (int i = 0; i < 32; i++) s += (int32_t)(int8_t)blk[skip + i] * p[i];
        } else {
            const int off = type == Q4_0 ? 8 : 0;
            for (int i = 0; i < 16; i++) s += ((blk[skip + i] & 15) - off) * p[i] + ((blk[skip + i] >> 4) - off) * p[i + 16];
        }
        total += half_to_float(blk) * es[2 * b] * (float)s;
        if (type == Q4_1) total += half_to_float(blk + 2) * es[2 * b + 1];
    }
    return total;
}

/* One group's 8 rows against one activation row, in portable C: out[0..7]. */
static void dot_group_portable(int type, const uint8_t *g, const int16_t *xq, const float *es, int64_t nb,
                               float *out) {
    const int bytes = GROUP * lb_block_bytes(type), head = group_head(type);
    for (int row = 0; row < GROUP; row++) {
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = g + b * bytes, *qs = blk + head;
            const int16_t *p = xq + b * 32;
            int32_t s = 0;
            for (int c = 0; c < group_chunks(type); c++) {
                for (int i = 0; i < 4; i++) {
                    const uint8_t v = qs[32 * c + 4 * row + i];
                    if (type == Q8_0) {
                        s += (int32_t)(int8_t)v * p[4 * c + i];
                    } else {
                        const int off = type == Q4_0 ? 8 : 0;
                        s += ((v & 15) - off) * p[4 * c + i] + ((v >> 4) - off) * p[16 + 4 * c + i];
                    }
                }
            }
            total += half_to_float(blk + 2 * row) * es[2 * b] * (float)s;
            if (type == Q4_1) total += half_to_float(blk + 16 + 2 * row) * es[2 * b + 1];
        }
        out[row] = total;
    }
}
#endif

/* y (m, n) = x W^T for W (n, k) in blocks of `type` (rows of k/32 blocks), x given quantized by
   quantize_rows. x is taken TILE rows at a time, and within a tile the weight rows are the outer
   loop: a weight row is read from memory once per tile and stays in the L1 cache for the tile's
   rows, whose 16-bit copy (TILE k 2 bytes) stays in L2. `threads` > 1 splits the weight rows
   (OpenMP). */
#define TILE 32
static void matmul(int type, const uint8_t *w, int64_t n, int64_t k, const int16_t *xq, const float *es,
                   const uint8_t *xl, const int8_t *xh, const int32_t *ps, int64_t m, float *y, int threads) {
    const int64_t nb = k / 32, row = nb * lb_block_bytes(type & ~GROUPED);
    if (type & GROUPED) { /* groups of 8 rows (n a multiple of 8: the loader checks) */
        type &= ~GROUPED;
        for (int64_t r0 = 0; r0 < m; r0 += TILE) {
            const int64_t r1 = r0 + TILE < m ? r0 + TILE : m;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
            for (int64_t i = 0; i < n; i += GROUP) {
                int64_t r = r0;
#if defined(__AVX2__)
                for (; r + 4 <= r1; r += 4)
                    dot_group(4, type, w + i * row, xq + r * k, es + r * 2 * nb, xl + r * k, xh + r * k, ps + r * nb, k,
                              nb, y + r * n + i, n);
                for (; r < r1; r++)
                    dot_group(1, type, w + i * row, xq + r * k, es + r * 2 * nb, xl + r * k, xh + r * k, ps + r * nb, k,
                              nb, y + r * n + i, n);
#else
                for (; r < r1; r++) dot_group_portable(type, w + i * row, xq + r * k, es + r * 2 * nb, nb, y + r * n + i);
#endif
            }
        }
        return;
    }
    for (int64_t r0 = 0; r0 < m; r0 += TILE) {
        const int64_t r1 = r0 + TILE < m ? r0 + TILE : m;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            int64_t r = r0;
#if defined(__AVX2__)
            for (; r + 4 <= r1; r += 4) dot_rows(4, type, w + i * row, xq + r * k, es + r * 2 * nb, k, nb, y + r * n + i, n);
            for (; r < r1; r++) dot_rows(1, type, w + i * row, xq + r * k, es + r * 2 * nb, k, nb, y + r * n + i, n);
#else
            for (; r < r1; r++) y[r * n + i] = dot_row(type, w + i * row, xq + r * k, es + r * 2 * nb, nb);
#endif
        }
    }
}

/* y (m, n) = x (m, k) W^T: quantize x, then multiply. One call per layer from Python (ctypes). Returns
   0, or -1 where the scratch for x could not be allocated (y is then not written). */
int lb_linear(int type, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y, int threads) {
    /* one allocation for x's copies: xq (int16), es (float pairs), ps (int32), then xl and xh (bytes) */
    const size_t values = (size_t)(m * k), blocks = (size_t)(m * (k / 32));
    char *scratch = malloc(values * 2 + blocks * 2 * sizeof(float) + blocks * sizeof(int32_t) + values * 2);
    if (!scratch) return -1;
    int16_t *xq = (int16_t *)scratch;
    float *es = (float *)(scratch + values * 2);
    int32_t *ps = (int32_t *)(es + blocks * 2);
    uint8_t *xl = (uint8_t *)(ps + blocks);
    int8_t *xh = (int8_t *)(xl + values);
    quantize_rows(x, m, k, xq, es, xl, xh, ps);
    matmul(type, w, n, k, xq, es, xl, xh, ps, m, y, threads);
    free(scratch);
    return 0;
}
