/* The block kernel's shared part: GGML's weight blocks, one table of their traits, the two
   layouts, the activations' 16-bit copy, and what every build defines.

   Why a kernel of our own: PyTorch's packed CPU matmuls (aten._weight_int4pack_mm_for_cpu,
   _weight_int8pack_mm) take their scales in the activations' dtype, and are fast only in
   bfloat16, so a file's float16 scales cannot run there unrounded. The scheme is llama.cpp's
   (ggml_vec_dot_q4_1_q8_1 and its kin, ggml-cpu quants.c): each row of x is quantized in blocks
   of 32 with a float32 scale, and each weight block meets its activation block in an integer dot
   product. Where llama.cpp quantizes x to 8 bits, x here takes 16 bits: 8 bits put an error of up
   to 1/254 of each block's largest value on every activation, 16 bits 1/65,534 (`llamablock
   perplexity --compare float32` measures the model's KL).

   Blocks, as GGUF stores them (ggml-common.h block_q4_0 ...), d, m and dmin float16, j in 0..15:
     Q4_0  18 bytes, 32 weights: d, qs[16]         w[j] = d ((qs[j] & 15) - 8), w[j + 16] = d ((qs[j] >> 4) - 8)
     Q4_1  20 bytes, 32 weights: d, m, qs[16]      w[j] = d (qs[j] & 15) + m,   w[j + 16] = d (qs[j] >> 4) + m
     Q5_0  22 bytes, 32 weights: d, qh[4], qs[16]  Q4_0's nibbles with bit j (j + 16) of the little-endian
                                                   qh as their fifth, w = d (q - 16)
     Q8_0  34 bytes, 32 weights: d, qs[32] int8    w[j] = d qs[j]
   and the K types (block_q4_K, block_q5_K, block_q6_K), super-blocks of 256 weights in groups:
     Q4_K  144 bytes: d, dmin, scales[12], qs[128]. Weight i (0..31) of group g (0..7) is
           q = qs[32 (g / 2) + i] >> 4 (g & 1) & 15; the group's 6-bit scale sc and min m are packed
           in `scales` (lb_k_scale, ggml-quants.c get_scale_min_k4); w = d sc q - dmin m
     Q5_K  176 bytes: d, dmin, scales[12], qh[32], qs[128]: Q4_K's nibbles, with bit g of qh[i] the
           fifth bit of weight i of group g; w = d sc q - dmin m, q 0..31
     Q6_K  210 bytes: ql[128], qh[64], scales[16] int8, d. Weight 32 c + i (c 0..3, i 0..31) of half
           h (0, 1) of 128 has q = ql[64 h + 32 (c & 1) + i] >> 4 (c >> 1) & 15 | (qh[32 h + i] >> 2 c
           & 3) << 4; groups of 16 weights, w = d scales[weight / 16] (q - 32)
   With activation block (e, p[32]) and P = sum p, a block of 32 weights meets one activation block:
     Q4_0: d e sum (q - 8) p    Q4_1: d e sum q p + m e P    Q5_0: d e sum (q - 16) p    Q8_0: d e sum q p
     Q4_K, Q5_K, group g: d e sum (sc q) p - dmin m e P      Q6_K: d e sum (sc (q - 32)) p
   where q are the stored integers and Q6_K's sc is that of each 16 weights. The integer sums are
   exact: in int32 lanes of a few products in the vector builds, in int64 per block in generic.c
   (a Q6_K block's scaled sum of 32 can pass 2^31, its sums of 16 cannot).

   Layouts (lb_linear's `layout`): LB_ROWS is the file's order, row after row of blocks. LB_GROUPS
   is groups of 8 rows (fast/kernels/file_blocks.py group_rows, done once at load), the same bytes
   reordered so that one vector holds the same weights of 8 rows: per block b of a group, 8 blocks'
   worth of bytes,
     [head of rows 0..7: d of each (float16), then m of each (Q4_1)][chunks of 32 bytes: chunk c is
     rows 0..7's qs bytes 4c..4c+3, row after row]
   so the per-block scalar work of the file's order (a horizontal sum and a scale conversion per
   row) is done for 8 rows in a few vector operations. The scheme is llama.cpp's repacked layouts'
   (ggml-cpu/repack.cpp, block_q4_0x8, block_q4_Kx8), with x in 16 bits as above. Q4_K and Q5_K
   group per super-block alike: their head (d, dmin, the 12 bytes of scales) moves as 8 fields of
   2 bytes, each field's 8 rows together, and their quants (Q5_K's qh, then the nibbles) in chunks
   of 4 bytes. Q6_K's head is its last 18 bytes (the 16 scales, then d): its grouped block is the
   file's block rotated to start there (the `lead` trait, 192), so the head's 9 fields come first
   (field f < 8 each row's scales 2f and 2f + 1, field 8 its d) and ql, then qh, in 48 chunks.
   Only the types with a `chunks` trait have it (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K); lb_linear
   answers LB_UNKNOWN for the others (Q5_0) in LB_GROUPS.

   Sources: this header; linear.c (the entry point), dequant.c (float32 rows for prefill's GEMM) and
   layout.c (the grouped layout, made at load), the same in every build; one kernel file per ISA,
   defining lb_quantize, lb_rows and lb_groups: x86.c (AVX2, AVX-512, AVX-512 VNNI, by the compiler's
   flags) or generic.c (portable C). fast/kernels/build.py compiles the three and the ISA's file. A new
   block type is a row of LB_TYPES, its case in each kernel file and in dequant.c, and its name in
   fast/kernels/ggml_kernel.py KEPT (and GROUPABLE where it has the grouped layout); Python takes the
   sizes from the gguf package and checks this table against them when it loads a library
   (lb_block_bytes, lb_block_weights; lb_block_groups answers for GROUPABLE). */

#ifndef LLAMABLOCK_BLOCKS_H
#define LLAMABLOCK_BLOCKS_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGML's type ids (ggml.h enum ggml_type) */
enum { LB_Q4_0 = 2, LB_Q4_1 = 3, LB_Q5_0 = 6, LB_Q8_0 = 8, LB_Q4_K = 12, LB_Q5_K = 13, LB_Q6_K = 14 };
enum { LB_ROWS = 0, LB_GROUPS = 1 };            /* lb_linear's layout */
enum { LB_GROUP = 8 };                          /* rows per group in LB_GROUPS */
enum { LB_QK = 32 };                            /* activations per block of x's 16-bit copy */
/* lb_linear's results: done; no memory for x's copy; a type or layout this library does not
   compute; k not whole blocks, or n not whole groups */
enum { LB_OK = 0, LB_NO_MEMORY = -1, LB_UNKNOWN = -2, LB_BAD_SHAPE = -3 };
enum { LB_F32 = 0, LB_F16 = 1, LB_BF16 = 2 }; /* a KV cache's element type (lb_cache_scores' dtype) */

typedef struct {
    int type;    /* GGML's type id */
    int bytes;   /* bytes per block (ggml-common.h: sizeof(block_q4_0), ...) */
    int weights; /* weights per block (QK4_0, QK5_0, QK8_0, QK_K, ...) */
    int head;    /* the head's bytes: d, then m (Q4_1); d, dmin and the scales (Q4_K, Q5_K); scales and d (Q6_K) */
    int chunks;  /* LB_GROUPS: chunks of 32 bytes (8 rows x 4 quant bytes) per block; 0: no grouped layout */
    int lead;    /* where the head starts in the file's block: 0, the quants after it; Q6_K 192, the quants before */
} lb_traits;

/* The one table of the blocks this kernel computes, a row per type: X(type id, bytes, weights,
   head, chunks, lead). It makes LB_TYPES below, and each kernel file's switch over the types, which
   compiles its kernels once per type with the traits as constants (an LB_INLINE function called
   with &(const lb_traits){...}): the compiler then unrolls the loops over a block's chunks and
   drops the other types' branches. */
#define LB_TYPE_TABLE(X)            \
    X(LB_Q4_0, 18, 32, 2, 4, 0)      \
    X(LB_Q4_1, 20, 32, 4, 4, 0)      \
    X(LB_Q5_0, 22, 32, 2, 0, 0)      \
    X(LB_Q8_0, 34, 32, 2, 8, 0)      \
    X(LB_Q4_K, 144, 256, 16, 32, 0)  \
    X(LB_Q5_K, 176, 256, 16, 40, 0)  \
    X(LB_Q6_K, 210, 256, 18, 48, 192)

#define LB_TRAITS_ROW(id, bytes, weights, head, chunks, lead) {id, bytes, weights, head, chunks, lead},
static const lb_traits LB_TYPES[] = {LB_TYPE_TABLE(LB_TRAITS_ROW)};

static inline const lb_traits *lb_find(int type) {
    for (unsigned i = 0; i < sizeof LB_TYPES / sizeof LB_TYPES[0]; i++)
        if (LB_TYPES[i].type == type) return &LB_TYPES[i];
    return 0;
}

/* Bytes of a row of k weights in the file's order (a group of 8 rows is 8 such). */
static inline int64_t lb_row_bytes(const lb_traits *t, int64_t k) { return k / t->weights * t->bytes; }

/* x (m, k) quantized per block of 32: p = its integers, es its (e, e P) per block, ps its P, ps16
   the P of its first 16 (Q6_K's scales are per 16 weights: x86_super.h dot_group_q6), and
   each integer's two bytes apart, p = 256 hi + lo with lo unsigned (for the AVX2 group kernel's
   8-bit products). Row r's values start at r k, its blocks at r nb. */
typedef struct {
    int64_t k, nb; /* values and blocks of 32 per row */
    int bits;      /* 16, or 8: p = 256 q with q of 8 bits, so lo is 0 (the kernels may skip it) */
    int16_t *p;    /* (m, k) */
    float *es;     /* (m, nb, 2): e = amax / 32767, and e P for Q4_1's m term */
    int32_t *ps;   /* (m, nb) */
    int32_t *ps16; /* (m, nb) */
    uint8_t *lo;   /* (m, k) */
    int8_t *hi;    /* (m, k) */
} lb_acts;

/* y (m, n) = x (m, k) W^T for W (n, k) in blocks of `type` laid out as `layout`, x float32;
   `threads` > 1 splits the weight rows (OpenMP, where the build has it). Returns an LB_ result;
   y is written only on LB_OK. */
int lb_linear(int type, int layout, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
              int threads);
/* The same with x's activations in `bits`: 16 (lb_linear's), or 8 (llama.cpp's q8_0 activations: the
   grouped AVX2 kernels, and every x86 build's K types, skip half their byte products; the AVX-512
   builds' Q4_0, Q4_1 and Q8_0 compute 8-bit x at 16-bit cost), at a cost in accuracy that `llamablock
   bench activations` measures beside the speed. LB_UNKNOWN for other bits. */
int lb_linear_bits(int type, int layout, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                   int threads, int bits);
/* Rows i0..i1-1 of W (n, k) as float32 into out (i1 - i0, k): each weight's exact value (dequant.c), for a
   float GEMM; `threads` split the rows. An LB_ result; out is written only on LB_OK. */
int lb_dequantize(int type, int layout, const uint8_t *w, int64_t n, int64_t k, int64_t i0, int64_t i1, float *out,
                  int threads);
/* W (n, k) in the file's order reordered in place into groups of 8 rows (LB_GROUPS; n a multiple of 8):
   layout.c, what fast/kernels/file_blocks.py group_rows computes in torch. An LB_ result. */
int lb_group_rows(int type, uint8_t *w, int64_t n, int64_t k, int threads);
/* A decode step's attention over one sequence's KV cache buffer (dtype 0 float32, 1 float16, 2
   bfloat16; head kv's slot j at kv head_stride + j hd), its first n slots: scores (n_kv g, n) =
   (q . k) scale, then out (n_kv g, hd) = sum_j p_j v_j (cache_attention.c). LB_ results. */
int lb_cache_scores(int dtype, const float *q, const void *k, int64_t n_kv, int64_t g, int64_t hd,
                    int64_t head_stride, int64_t n, float scale, float *scores, int threads);
int lb_cache_values(int dtype, const float *p, const void *v, int64_t n_kv, int64_t g, int64_t hd,
                    int64_t head_stride, int64_t n, float *out, int threads);
/* A decode step of one or more sequences through every layer of a LLaMA block (decode_step.c): the
   model as the eager one holds it, each matrix its file's blocks (lb_linear's type, layout, rows;
   bias or 0), each layer's norms' scales (D,) and its KV cache buffers (P, n_kv, L, hd) of kv_dtype
   (as lb_cache_scores' dtype), P >= the rows stepped. fast/decode_step.py fills these once per cache. */
typedef struct {
    int type, layout;
    const uint8_t *w;
    int64_t n;         /* output rows; the input is the matrix's place in the layer (D, h hd or ffn) */
    const float *bias; /* (n,) float32, or 0 */
} lb_matrix;
/* Several matrices against one x, y_j (m, n_j) = x (m, k) W_j^T, in one parallel region (linear.c): each
   thread takes its share of every matrix, as lb_linear would, with no barrier between the matrices, so
   each y_j is lb_linear's bit for bit. At most LB_MANY matrices; their biases are the caller's. */
enum { LB_MANY = 4 };
int lb_linear_many(const lb_matrix *const *mats, int count, int64_t k, const float *x, int64_t m, float *const *ys,
                   int threads, int bits);
typedef struct {
    lb_matrix q, k, v, o, gate, up, down;
    const float *norm1, *norm2; /* (D,) float32: RMSNorm's scale (Gemma's 1 + w already added) */
    void *keys, *values;        /* (P, n_kv, L, hd) */
} lb_layer;
typedef struct {
    int64_t dim, heads, kv_heads, head_dim, rotary, ffn, length; /* rotary: features rotated (<= hd); length: L */
    float eps, scale;                                            /* RMSNorm's eps; the scores' scale */
    int interleaved, act, kv_dtype, n_layers;                    /* RoPE pairs (x0, x1) or (x_i, x_i+r/2); act 0
                                                                    SiLU (SwiGLU), 1 GELU tanh (GeGLU) */
    const lb_layer *layers;
    double *seconds; /* 0, or 2 sums a call adds to: seconds in the block kernel's products, in attention */
} lb_decoder;
/* x (rows, D) float32, the residual streams of one new token per cache row 0..rows-1, through every
   layer in place, as runtime/batch.py lays the rows out (left-padded): each row's key and value
   written to slot `front`, row r's attention over slots front - pos[r] .. front (pos[r] its tokens
   before this one, its position), its slots before them padding no step reads; one sequence is
   rows 1, pos[0] = front. cos, sin (L, rotary / 2) the angles of every position (with any attention
   factor in them); `work` lb_decode_work(m, rows) floats. Each matrix is read once for all the rows.
   An LB_ result. */
int lb_decode_layers(const lb_decoder *m, float *x, int64_t rows, int64_t front, const int64_t *pos, const float *cos,
                     const float *sin, float *work, int threads);
int64_t lb_decode_work(const lb_decoder *m, int64_t rows);
int lb_block_bytes(int type);   /* LB_TYPES' bytes per block, 0 for a type not computed here */
int lb_block_weights(int type); /* LB_TYPES' weights per block, 0 likewise */
int lb_block_groups(int type);  /* 1 where the type has the grouped layout (LB_GROUPS), else 0 */

/* Defined once per build by its ISA's kernel file, called by linear.c. lb_rows: weight rows
   i0..i1-1 of w (the file's order, n rows) against rows r0..r1-1 of x, y[r n + i] for each.
   lb_groups: the same over groups of 8 rows (i0 and i1 multiples of 8). A call takes a range of
   weight rows so that the calls from linear.c stay few beside the work. Hidden: only the
   lb_linear family above is the library's interface. */
#if defined(__GNUC__)
#define LB_HIDDEN __attribute__((visibility("hidden")))
#define LB_INLINE inline __attribute__((always_inline))
#else
#define LB_HIDDEN
#define LB_INLINE inline
#endif
LB_HIDDEN void lb_quantize(const float *x, int64_t b0, int64_t b1, const lb_acts *a); /* blocks b0..b1-1 of x */
LB_HIDDEN void lb_rows(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0,
                       int64_t r1, float *y, int64_t n);
LB_HIDDEN void lb_groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0,
                         int64_t r1, float *y, int64_t n);

/* lb_rows and lb_groups for an ISA file that defines static rows() and groups() of lb_rows'
   signature: each type's kernels are compiled with its traits as constants (LB_TYPE_TABLE), so
   the compiler unrolls each block's loops for that type. */
#define LB_ROWS_OF(id, ...) \
    case id: rows(&(const lb_traits){id, __VA_ARGS__}, w, i0, i1, a, r0, r1, y, n); break;
#define LB_GROUPS_OF(id, ...)                                                            \
    case id:                                                                             \
        if ((const lb_traits){id, __VA_ARGS__}.chunks) /* a constant: others compile none */ \
            groups(&(const lb_traits){id, __VA_ARGS__}, w, i0, i1, a, r0, r1, y, n);       \
        break;
#define LB_ENTRY_POINTS                                                                                      \
    void lb_rows(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0, \
                 int64_t r1, float *y, int64_t n) {                                                          \
        switch (t->type) { LB_TYPE_TABLE(LB_ROWS_OF) }                                                       \
    }                                                                                                        \
    void lb_groups(const lb_traits *t, const uint8_t *w, int64_t i0, int64_t i1, const lb_acts *a, int64_t r0, \
                   int64_t r1, float *y, int64_t n) {                                                          \
        switch (t->type) { LB_TYPE_TABLE(LB_GROUPS_OF) }                                                       \
    }

/* Row `row`'s weight block (t->bytes, the file's order) out of a group's block g of the grouped layout:
   its head as 2-byte fields, each field's 8 rows together, then its quants in chunks of 4 bytes,
   each chunk's 8 rows together, the whole the file's block rotated to start at `lead` (the inverse
   of fast/kernels/file_blocks.py group_rows). */
static inline void lb_ungroup_block(const lb_traits *t, const uint8_t *g, int row, uint8_t *out) {
    uint8_t rotated[256]; /* a block: at most 210 bytes (Q6_K) */
    for (int f = 0; f < t->head / 2; f++) memcpy(rotated + 2 * f, g + 2 * LB_GROUP * f + 2 * row, 2);
    for (int c = 0; c < t->chunks; c++) memcpy(rotated + t->head + 4 * c, g + LB_GROUP * t->head + 32 * c + 4 * row, 4);
    memcpy(out + t->lead, rotated, t->bytes - t->lead);
    memcpy(out, rotated + t->bytes - t->lead, t->lead);
}

/* The inverse: the 8 file-order blocks `rows[r]` (t->bytes each) as a group's block g. */
static inline void lb_group_block(const lb_traits *t, const uint8_t *const *rows, uint8_t *g) {
    for (int row = 0; row < LB_GROUP; row++) {
        uint8_t rotated[256];
        memcpy(rotated, rows[row] + t->lead, t->bytes - t->lead);
        memcpy(rotated + t->bytes - t->lead, rows[row], t->lead);
        for (int f = 0; f < t->head / 2; f++) memcpy(g + 2 * LB_GROUP * f + 2 * row, rotated + 2 * f, 2);
        for (int c = 0; c < t->chunks; c++) memcpy(g + LB_GROUP * t->head + 32 * c + 4 * row, rotated + t->head + 4 * c, 4);
    }
}

/* A float16 as float32, exact: every float16 is a float32. */
static inline float lb_half(const uint8_t *h2) {
    uint16_t h;
    memcpy(&h, h2, 2);
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

/* Whether a type's weights have a term per block beside d q (Q4_1's m, Q4_K's and Q5_K's -dmin m),
   which meets the activations' e P. */
static inline int lb_has_min(int type) { return type == LB_Q4_1 || type == LB_Q4_K || type == LB_Q5_K; }

/* Group g's 6-bit scale and min of a Q4_K or Q5_K super-block's 12 bytes `s` (ggml-quants.c
   get_scale_min_k4): groups 0..3 in the low 6 bits of s[g] and s[g + 4], groups 4..7 in a nibble
   of s[g + 4] with the top 2 bits of s[g - 4] and s[g]. */
static inline void lb_k_scale(const uint8_t *s, int g, int *sc, int *m) {
    if (g < 4) {
        *sc = s[g] & 63;
        *m = s[g + 4] & 63;
    } else {
        *sc = (s[g + 4] & 15) | (s[g - 4] >> 6) << 4;
        *m = (s[g + 4] >> 4) | (s[g] >> 6) << 4;
    }
}

/* Block b of x's copy from its 32 values v, in portable C: the reference that a vector version
   must equal (x86.c quantize_block). In 8 bits (llama.cpp's q8_0 activations: ggml-quants.c
   quantize_row_q8_0) the integers are q = round(x / e8), e8 = amax / 127, stored as p = 256 q with
   e = e8 / 256: the same products e p = e8 q, so every kernel computes them unchanged and exactly,
   and one that knows the low bytes are 0 skips their half of the work (x86_super.h). */
static inline void lb_quantize_block(const float *v, const lb_acts *a, int64_t b) {
    float amax = 0.0f, finite = 0.0f;
    for (int i = 0; i < LB_QK; i++) {
        amax = fmaxf(amax, fabsf(v[i]));
        finite += v[i] - v[i]; /* 0, or NaN where a value is NaN or infinite */
    }
    /* a block whose largest |x| is under about 1e-34 has no finite 1/e: it counts as zeros, as a
       flush-to-zero unit would take it (its products are below float32's resolution of any others) */
    const int top = a->bits == 8 ? 127 : 32767, scale = a->bits == 8 ? 256 : 1;
    float e = amax / (float)top, inv = e > 0.0f && 1.0f / e <= FLT_MAX ? 1.0f / e : 0.0f;
    e /= (float)scale;
    if (finite != 0.0f) e = NAN; /* the block's products are NaN, as a float matmul's would be */
    int32_t sum = 0, first = 0;
    for (int i = 0; i < LB_QK; i++) {
        int q = (int)lrintf(v[i] * inv);
        q = (q > top ? top : q < -top ? -top : q) * scale;
        a->p[b * LB_QK + i] = (int16_t)q;
        a->lo[b * LB_QK + i] = (uint8_t)(q & 255);
        a->hi[b * LB_QK + i] = (int8_t)((q - (q & 255)) / 256); /* exact: q - lo is a multiple of 256 */
        sum += q;
        if (i == LB_QK / 2 - 1) first = sum;
    }
    a->es[2 * b] = e;
    a->es[2 * b + 1] = e * (float)sum;
    a->ps[b] = sum;
    a->ps16[b] = first;
}

#ifdef __cplusplus
}
#endif

#endif
