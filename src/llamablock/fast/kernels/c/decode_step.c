/* lb_decode_layers: a decode step of one sequence, or of a server's rows together, through every
   layer of the LLaMA block in one call, for the eager engines' steps (fast/decode_step.py). The eager
   model pays a Python call and a dispatch for each of about a hundred ops a layer (`llamablock bench
   size` profiles the step, and what they cost beside the block kernel's products); here the same
   layer is a few C calls: RMSNorm, the block kernel (lb_linear) for each matrix, RoPE, the key and
   value written to the cache, the attention read in place (lb_cache_scores, a softmax,
   lb_cache_values), the gated feed-forward and the two residual adds. Rows together share each
   matrix's read (one lb_linear of all of them), which is what a batch is for at 1B, where a step
   is the weights' read; attention is each row's own, over its own slots.

   The maths is the eager layer's (llamablock.model.Block, attention.py, norm.py, ffn.py), in float32
   as it computes: RMSNorm's x / sqrt(mean(x^2) + eps) times its scale; RoPE on the first `rotary`
   features of each head in the model's pair layout (rope.py apply_rope); the cache rounds k and v
   to its dtype as torch's .to() does (nearest even); softmax(q k^T scale) over the row's slots times
   the reciprocal of its sum, as ATen's softmax; SiLU g / (1 + e^-g) or GELU's tanh form; each
   matrix's bias added after its product. The sums run in other orders than torch's kernels (the
   norm's sum of squares in double, exp by a polynomial), so logits agree with the eager step to
   float32 rounding grown through the layers, within the bound tests/fast/kernels/test_decode_step.py
   states; the block kernel's products are the eager layers' own call. */

#include <stdlib.h>
#include <time.h>

#include "blocks.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* e^x, branch-free so that loops over it vectorize: Cephes' expf (its Cody-Waite split of ln 2 and
   its degree-5 polynomial on [-ln2/2, ln2/2], relative error about 1e-7), x clamped to [-87, 88]
   (so e^x of a very negative x is about 1.6e-38, not 0: nothing a softmax's sum of at least 1 or
   SiLU's quotient can tell apart). n is rounded by adding and taking off 1.5 2^23. */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* out (d,) = w * (x / sqrt(mean(x^2) + eps)), in norm.py's order of roundings */
static void rms_norm(const float *x, const float *w, int64_t d, float eps, float *out) {
    double squares = 0.0;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < d; i++) squares += (double)x[i] * x[i];
    const float inv = 1.0f / sqrtf((float)(squares / (double)d) + eps);
    for (int64_t i = 0; i < d; i++) out[i] = w[i] * (x[i] * inv);
}

/* heads rows of hd features rotated in place: pairs (x_i, x_i+r/2) ("half") or (x_2i, x_2i+1) */
static void rope(float *x, int64_t heads, int64_t hd, int64_t r, int interleaved, const float *cos, const float *sin) {
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (int64_t i = 0; i < r / 2; i++) {
            const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + r / 2;
            const float x1 = v[a], x2 = v[b];
            v[a] = x1 * cos[i] - x2 * sin[i];
            v[b] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

/* float32 to float16 or bfloat16, to nearest even (as torch's .to()); NaN stays NaN */
static uint16_t to_half(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* 65520 and up round to infinity */
    if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)nearbyintf(fabsf(f) * 0x1p24f)); /* subnormal */
    return (uint16_t)(sign | ((a + 0xc8000fffu + ((a >> 13) & 1)) >> 13)); /* rebias 127 -> 15, round */
#endif
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* n values of src into a cache row of `dtype` at dst */
static void store(int dtype, const float *src, void *dst, int64_t n) {
    if (dtype == LB_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = dtype == LB_F16 ? to_half(src[i]) : to_bf16(src[i]);
}

/* rows of n scores each as softmax probabilities, in place: e^(s - max), times 1 / their sum. Threads
   split the rows only from 16,384 scores on (a few heads over a thousand slots), a guess, not a
   measurement: below it a parallel region's start would cost about what the rows' work does. */
static void softmax_rows(float *s, int64_t rows, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows * n >= 16384) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * n, top = row[0], sum = 0.0f;
        for (int64_t j = 1; j < n; j++) top = row[j] > top ? row[j] : top;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; j++) {
            row[j] = exp_poly(row[j] - top);
            sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
}

/* gate (n,) = act(gate) * up: SiLU, or GELU's tanh form 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) */
static void gated(float *gate, const float *up, int64_t n, int act) {
    if (act == 0) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], y = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        gate[i] = 0.5f * g * (1.0f + (1.0f - 2.0f / (exp_poly(2.0f * y) + 1.0f))) * up[i]; /* tanh y */
    }
}

/* Seconds on a monotonic clock, for lb_decoder's `seconds` (`llamablock bench size` profiles the step by them) */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ys[j] (rows, mats[j]->n) = x W_j^T (+ bias_j), x (rows, k), for matrices that read the same x: one
   lb_linear_many call, so each matrix is read once for all the rows and the matrices share one parallel
   region (q, k and v; gate and up) (a row's sums are the same as alone: linear.c splits weight rows,
   never a row) */
static int products(const lb_matrix *const *mats, int count, const float *x, int64_t k, int64_t rows,
                    float *const *ys, int threads) {
    const int status = lb_linear_many(mats, count, k, x, rows, ys, threads, 16);
    for (int j = 0; status == LB_OK && j < count; j++)
        if (mats[j]->bias)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < mats[j]->n; i++) ys[j][r * mats[j]->n + i] += mats[j]->bias[i];
    return status;
}

static int product(const lb_matrix *mat, const float *x, int64_t k, int64_t rows, float *y, int threads) {
    return products(&mat, 1, x, k, rows, &y, threads);
}

int64_t lb_decode_work(const lb_decoder *m, int64_t rows) {
    return rows * (2 * m->dim + (2 * m->heads + 2 * m->kv_heads) * m->head_dim + 2 * m->ffn + m->heads * m->length);
}

/* Row r's attention in layer l: RoPE on its q (h, hd) and k (n_kv, hd) at position pos, its k and v
   written to slot `front` of its cache row, then its output att (h, hd) over its slots
   front - pos .. front (its padding before them unread), scores (h, L) its scratch. An LB_ result. */
static int attend(const lb_decoder *m, const lb_layer *l, int64_t r, float *q, float *k, const float *v, float *att,
                  float *scores, int64_t front, int64_t pos, const float *cos, const float *sin, int threads) {
    const int64_t h = m->heads, n_kv = m->kv_heads, hd = m->head_dim, half = m->rotary / 2;
    const int64_t size = m->kv_dtype == LB_F32 ? 4 : 2, stride = m->length * hd, row_bytes = n_kv * stride * size;
    char *keys = (char *)l->keys + r * row_bytes, *values = (char *)l->values + r * row_bytes;
    rope(q, h, hd, m->rotary, m->interleaved, cos + pos * half, sin + pos * half);
    rope(k, n_kv, hd, m->rotary, m->interleaved, cos + pos * half, sin + pos * half);
    for (int64_t j = 0; j < n_kv; j++) { /* slot `front` of each key-value head */
        store(m->kv_dtype, k + j * hd, keys + (j * m->length + front) * hd * size, hd);
        store(m->kv_dtype, v + j * hd, values + (j * m->length + front) * hd * size, hd);
    }
    const int64_t first = (front - pos) * hd * size, n = pos + 1;
    const int status = lb_cache_scores(m->kv_dtype, q, keys + first, n_kv, h / n_kv, hd, stride, n, m->scale, scores,
                                       threads);
    if (status) return status;
    softmax_rows(scores, h, n, threads);
    return lb_cache_values(m->kv_dtype, scores, values + first, n_kv, h / n_kv, hd, stride, n, att, threads);
}

int lb_decode_layers(const lb_decoder *m, float *x, int64_t rows, int64_t front, const int64_t *pos, const float *cos,
                     const float *sin, float *work, int threads) {
    const int64_t d = m->dim, h = m->heads, n_kv = m->kv_heads, hd = m->head_dim;
    if (rows < 1 || front < 0 || front >= m->length || h % n_kv || m->rotary > hd || m->rotary % 2 ||
        (m->act != 0 && m->act != 1))
        return LB_BAD_SHAPE;
    for (int64_t r = 0; r < rows; r++)
        if (pos[r] < 0 || pos[r] > front) return LB_BAD_SHAPE;
    if (m->kv_dtype != LB_F32 && m->kv_dtype != LB_F16 && m->kv_dtype != LB_BF16) return LB_UNKNOWN;
    float *xn = work, *q = xn + rows * d, *k = q + rows * h * hd, *v = k + rows * n_kv * hd, *att = v + rows * n_kv * hd;
    float *out = att + rows * h * hd, *gate = out + rows * d, *up = gate + rows * m->ffn;
    float *scores = up + rows * m->ffn; /* (rows, h, L): each row's (h, n) */
    int status = LB_OK;
    double *clock = m->seconds, t = 0.0;
#define START do { if (clock) t = now(); } while (0)
#define STOP(part) do { if (clock) clock[part] += now() - t; } while (0)
    for (int layer = 0; layer < m->n_layers && status == LB_OK; layer++) {
        const lb_layer *l = m->layers + layer;
        for (int64_t r = 0; r < rows; r++) rms_norm(x + r * d, l->norm1, d, m->eps, xn + r * d);
        START;
        const lb_matrix *qkv[3] = {&l->q, &l->k, &l->v}, *gate_up[2] = {&l->gate, &l->up};
        float *qkv_out[3] = {q, k, v}, *gate_up_out[2] = {gate, up};
        if ((status = products(qkv, 3, xn, d, rows, qkv_out, threads))) break;
        STOP(0);
        START;
        if (rows == 1) /* one sequence: its heads split over the threads */
            status = attend(m, l, 0, q, k, v, att, scores, front, pos[0], cos, sin, threads);
        else { /* rows together: a row a thread, one parallel region for all of them, not three a row */
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) reduction(min : status)
            for (int64_t r = 0; r < rows; r++) {
                const int s = attend(m, l, r, q + r * h * hd, k + r * n_kv * hd, v + r * n_kv * hd, att + r * h * hd,
                                     scores + r * h * m->length, front, pos[r], cos, sin, 1);
                status = s < status ? s : status;
            }
        }
        STOP(1);
        if (status) break;
        START;
        if ((status = product(&l->o, att, h * hd, rows, out, threads))) break;
        STOP(0);
        for (int64_t i = 0; i < rows * d; i++) x[i] += out[i];
        for (int64_t r = 0; r < rows; r++) rms_norm(x + r * d, l->norm2, d, m->eps, xn + r * d);
        START;
        if ((status = products(gate_up, 2, xn, d, rows, gate_up_out, threads))) break;
        STOP(0);
        gated(gate, up, rows * m->ffn, m->act);
        START;
        if ((status = product(&l->down, gate, m->ffn, rows, out, threads))) break;
        STOP(0);
        for (int64_t i = 0; i < rows * d; i++) x[i] += out[i];
    }
#undef START
#undef STOP
    return status;
}
