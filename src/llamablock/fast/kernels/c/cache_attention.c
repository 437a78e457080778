/* lb_cache_scores and lb_cache_values: a decode step's attention (one new token, one sequence) read
   straight from a layer's KV cache in float16, bfloat16 or float32, for the eager engine
   (fast/kernels/cache_attention.py). torch's float32 attention needs a 16-bit cache upcast first: a
   float32 copy of every filled slot, in every layer, at every step, written and read again, which
   at a few thousand tokens costs more than the attention's own reads (`llamablock bench
   cache_attention`). Here each key and value is converted as it is read, into a tile's buffer that
   stays in L1; the conversion is exact (every float16 and bfloat16 is a float32), and the maths is
   float32 as torch's: scores = (q . k) scale, torch's softmax between the two calls, then
   out = sum_j p_j v_j. The sums run in another order than MKL's, so the output agrees with the
   upcast path to float32 rounding, not bit for bit (tests/fast/kernels/test_cache_attention.py
   states the bound against a float64 reference).

   Layout (grouped-query attention, g = h / n_kv query heads per key-value head): q and out are
   (n_kv g, hd) float32, query head kv g + i reading key-value head kv; k and v are one sequence's
   layer buffer, head kv's slot j at element kv head_stride + j hd (a cache of any length L, its
   first n slots read); scores and p are (n_kv g, n) float32. Threads split (head, 64 slots) tiles,
   which read their rows front to back, and every query of a group meets a row while it is in
   cache; the values' tiles sum apart and are then added in order (lb_cache_values). The x86 builds
   (AVX2, FMA, F16C) compute 8 keys' scores, or 16 columns of 4 queries' outputs, in registers at a
   time; the portable build the same sums one at a time. */

#include <stdlib.h>

#include "blocks.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { KEYS = 64, SLICE = 16, MAX_HD = 512, MAX_G = 64 }; /* tile sizes; the widest head and group taken */

/* n (a multiple of 8) elements of a cache row at src as float32 into dst, exactly */
static inline void to_float(int dtype, const void *src, float *dst, int64_t n) {
    if (dtype == LB_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    const uint16_t *h = src;
    if (dtype == LB_BF16) { /* a bfloat16 is a float32's top 16 bits */
        for (int64_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(dst + i, &bits, 4);
        }
        return;
    }
#if defined(__F16C__)
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#else
    for (int64_t i = 0; i < n; i++) dst[i] = lb_half((const uint8_t *)(h + i));
#endif
}

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

static int check(int dtype, int64_t n_kv, int64_t g, int64_t hd, int64_t n) {
    if (dtype != LB_F32 && dtype != LB_F16 && dtype != LB_BF16) return LB_UNKNOWN;
    if (n_kv < 1 || g < 1 || g > MAX_G || hd < SLICE || hd > MAX_HD || hd % SLICE || n < 1) return LB_BAD_SHAPE;
    return LB_OK;
}

/* The scores of keys j0..j1-1 of head kv (at most KEYS), for its g queries. */
static void scores_tile(int dtype, const float *q, const char *k, int64_t kv, int64_t g, int64_t hd, int64_t n,
                        int64_t j0, int64_t j1, float scale, float *scores, int64_t size) {
    float rows[KEYS * MAX_HD / 4]; /* the tile's keys as float32 (at most 64 KiB: hd 512 takes 32 keys a pass) */
    const int64_t fit = KEYS * MAX_HD / 4 / hd;
    for (int64_t a = j0; a < j1; a += fit) {
        const int64_t b = a + fit < j1 ? a + fit : j1;
        for (int64_t j = a; j < b; j++) to_float(dtype, k + j * hd * size, rows + (j - a) * hd, hd);
        for (int64_t i = 0; i < g; i++) {
            const float *qi = q + (kv * g + i) * hd;
            float *out = scores + (kv * g + i) * n;
            int64_t j = a;
#if defined(__AVX2__) && defined(__FMA__)
            for (; j + 8 <= b; j += 8) { /* 8 keys' dot products in 8 registers, then summed across together */
                __m256 acc[8];
                for (int m = 0; m < 8; m++) acc[m] = _mm256_setzero_ps();
                for (int64_t c = 0; c < hd; c += 8) {
                    const __m256 qc = _mm256_loadu_ps(qi + c);
                    for (int m = 0; m < 8; m++)
                        acc[m] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(rows + (j - a + m) * hd + c), acc[m]);
                }
                const __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
                const __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
                const __m256 lo = _mm256_hadd_ps(s01, s23), hi = _mm256_hadd_ps(s45, s67); /* per 128 bits */
                const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
                _mm256_storeu_ps(out + j, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
            }
#endif
            for (; j < b; j++) out[j] = dot(qi, rows + (j - a) * hd, hd) * scale;
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* Q queries' (1 to 4: a constant at each call, so their 2 Q sums stay in registers) 16 columns from c0,
   over `count` rows of the tile from slot j0: out (Q rows of hd) += sum_j p_j v_j. */
static LB_INLINE void values_queries(const int Q, const float *pi, int64_t n, const float *rows, int64_t hd,
                                     int64_t count, int64_t j0, int64_t c0, float *out) {
    __m256 acc[4][2];
    for (int i = 0; i < Q; i++) acc[i][0] = _mm256_loadu_ps(out + i * hd), acc[i][1] = _mm256_loadu_ps(out + i * hd + 8);
    for (int64_t j = 0; j < count; j++) {
        const __m256 v0 = _mm256_loadu_ps(rows + j * hd + c0), v1 = _mm256_loadu_ps(rows + j * hd + c0 + 8);
        for (int i = 0; i < Q; i++) {
            const __m256 w = _mm256_broadcast_ss(pi + i * n + j0 + j);
            acc[i][0] = _mm256_fmadd_ps(w, v0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(w, v1, acc[i][1]);
        }
    }
    for (int i = 0; i < Q; i++) _mm256_storeu_ps(out + i * hd, acc[i][0]), _mm256_storeu_ps(out + i * hd + 8, acc[i][1]);
}
#endif

/* Slots j0..j1-1 of head kv (at most KEYS) against its g queries' weights: part (g, hd) = sum_j p_j v_j.
   The slots are converted once into `rows`; then 16 columns of up to 4 queries at a time sum in registers. */
static void values_tile(int dtype, const float *p, const char *v, int64_t kv, int64_t g, int64_t hd, int64_t n,
                        int64_t j0, int64_t j1, float *part, int64_t size) {
    float rows[KEYS * MAX_HD / 4];
    memset(part, 0, sizeof(float) * (size_t)(g * hd));
    const int64_t fit = KEYS * MAX_HD / 4 / hd;
    for (int64_t a = j0; a < j1; a += fit) {
        const int64_t b = a + fit < j1 ? a + fit : j1;
        for (int64_t j = a; j < b; j++) to_float(dtype, v + j * hd * size, rows + (j - a) * hd, hd);
        for (int64_t c0 = 0; c0 < hd; c0 += SLICE) {
#if defined(__AVX2__) && defined(__FMA__)
            for (int64_t i0 = 0; i0 < g; i0 += 4) { /* 4 queries at a time, the rest (3, 2 or 1) together */
                const float *pi = p + (kv * g + i0) * n;
                float *out = part + i0 * hd + c0;
                switch (g - i0 < 4 ? g - i0 : 4) {
                    case 4: values_queries(4, pi, n, rows, hd, b - a, a, c0, out); break;
                    case 3: values_queries(3, pi, n, rows, hd, b - a, a, c0, out); break;
                    case 2: values_queries(2, pi, n, rows, hd, b - a, a, c0, out); break;
                    default: values_queries(1, pi, n, rows, hd, b - a, a, c0, out);
                }
            }
#else
            for (int64_t i = 0; i < g; i++) {
                const float *pi = p + (kv * g + i) * n;
                float *acc = part + i * hd + c0;
                for (int64_t j = a; j < b; j++)
                    for (int d = 0; d < SLICE; d++) acc[d] += pi[j] * rows[(j - a) * hd + c0 + d];
            }
#endif
        }
    }
}

int lb_cache_scores(int dtype, const float *q, const void *k, int64_t n_kv, int64_t g, int64_t hd,
                    int64_t head_stride, int64_t n, float scale, float *scores, int threads) {
    const int status = check(dtype, n_kv, g, hd, n);
    if (status) return status;
    const int64_t chunks = (n + KEYS - 1) / KEYS, size = dtype == LB_F32 ? 4 : 2;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t item = 0; item < n_kv * chunks; item++) {
        const int64_t kv = item / chunks, j0 = item % chunks * KEYS, j1 = j0 + KEYS < n ? j0 + KEYS : n;
        scores_tile(dtype, q, (const char *)k + kv * head_stride * size, kv, g, hd, n, j0, j1, scale, scores, size);
    }
    return LB_OK;
}

int lb_cache_values(int dtype, const float *p, const void *v, int64_t n_kv, int64_t g, int64_t hd,
                    int64_t head_stride, int64_t n, float *out, int threads) {
    const int status = check(dtype, n_kv, g, hd, n);
    if (status) return status;
    /* each tile's (g, hd) sum apart, then the tiles' sums added in order: a long context's rounding grows
       by the tiles, not by every slot (as a blocked GEMM's does), and the same whatever the threads */
    const int64_t tiles = (n + KEYS - 1) / KEYS, size = dtype == LB_F32 ? 4 : 2;
    float *parts = malloc(sizeof(float) * (size_t)(n_kv * tiles * g * hd));
    if (!parts) return LB_NO_MEMORY;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t item = 0; item < n_kv * tiles; item++) {
        const int64_t kv = item / tiles, j0 = item % tiles * KEYS, j1 = j0 + KEYS < n ? j0 + KEYS : n;
        values_tile(dtype, p, (const char *)v + kv * head_stride * size, kv, g, hd, n, j0, j1, parts + item * g * hd, size);
    }
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int64_t kv = 0; kv < n_kv; kv++) {
        float *o = out + kv * g * hd;
        memcpy(o, parts + kv * tiles * g * hd, sizeof(float) * (size_t)(g * hd));
        for (int64_t t = 1; t < tiles; t++)
            for (int64_t e = 0; e < g * hd; e++) o[e] += parts[(kv * tiles + t) * g * hd + e];
    }
    free(parts);
    return LB_OK;
}
