/* The block kernel's entry point and its table, the same in every build (blocks.h says what the
   kernel computes): lb_linear checks its arguments, quantizes x once (lb_quantize), then walks the
   weight rows in tiles of x, handing ranges of weight rows to the build's kernel (lb_rows,
   lb_groups: x86.c or generic.c). Threads split the weight rows, never a row, so a row's sums come
   in the same order whatever the thread count. */

#include <stdlib.h>

#include "blocks.h"

int lb_block_bytes(int type) {
    const lb_traits *t = lb_find(type);
    return t ? t->bytes : 0;
}

int lb_block_weights(int type) {
    const lb_traits *t = lb_find(type);
    return t ? t->weights : 0;
}

int lb_block_groups(int type) {
    const lb_traits *t = lb_find(type);
    return t && t->chunks ? 1 : 0;
}

/* x is taken TILE rows at a time, and within a tile the weight rows are the outer loop: a weight
   row is read from memory once per tile and stays in the L1 cache for the tile's rows, whose 16-bit
   copy is TILE k 2 bytes (256 KiB at k 2048), meant to stay in L2. Each thread takes one contiguous share
   of the weight rows (a multiple of LB_GROUP rows), one kernel call a tile, as OpenMP's static
   schedule would share them. 64 rows, not 32: the AVX-512 VNNI panels (x86_panel.h) unpack weights
   once a tile, half as often (the commit that set it has the timings; the AVX2 build ran level). */
#define TILE 64
/* From how many rows of x the threads split its copy between them (inside the region, after a
   barrier); below it the calling thread copies it before the region, as a decode step's few rows
   cost less to copy than a barrier (measured at 32 rows, the tile's size then: baafe50). */
#define SPLIT_COPY_FROM 32

int lb_linear(int type, int layout, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
              int threads) {
    return lb_linear_bits(type, layout, w, n, k, x, m, y, threads, 16);
}

int lb_linear_bits(int type, int layout, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                   int threads, int bits) {
    const lb_matrix mat = {type, layout, w, n, 0};
    const lb_matrix *mats[1] = {&mat};
    float *ys[1] = {y};
    return lb_linear_many(mats, 1, k, x, m, ys, threads, bits);
}

int lb_linear_many(const lb_matrix *const *mats, int count, int64_t k, const float *x, int64_t m, float *const *ys,
                   int threads, int bits) {
    const lb_traits *ts[LB_MANY];
    if (count < 1 || count > LB_MANY || (bits != 8 && bits != 16)) return LB_UNKNOWN;
    for (int j = 0; j < count; j++) {
        const lb_matrix *mat = mats[j];
        const lb_traits *t = ts[j] = lb_find(mat->type);
        if (!t || (mat->layout != LB_ROWS && mat->layout != LB_GROUPS) || (mat->layout == LB_GROUPS && !t->chunks))
            return LB_UNKNOWN;
        if (k % t->weights || k % LB_QK || (mat->layout == LB_GROUPS && mat->n % LB_GROUP)) return LB_BAD_SHAPE;
    }
    /* one allocation for x's copies: p (int16), es (float pairs), ps and ps16 (int32), then lo and hi (bytes) */
    const size_t values = (size_t)(m * k), blocks = (size_t)(m * (k / LB_QK));
    char *scratch = malloc(values * 2 + blocks * 2 * sizeof(float) + blocks * 2 * sizeof(int32_t) + values * 2);
    if (!scratch) return LB_NO_MEMORY;
    lb_acts a;
    a.k = k;
    a.nb = k / LB_QK;
    a.bits = bits;
    a.p = (int16_t *)scratch;
    a.es = (float *)(scratch + values * 2);
    a.ps = (int32_t *)(a.es + blocks * 2);
    a.ps16 = a.ps + blocks;
    a.lo = (uint8_t *)(a.ps16 + blocks);
    a.hi = (int8_t *)(a.lo + values);
    const int parts = threads > 1 ? threads : 1;
    /* one parallel region a call: a prompt's x copied a slice of blocks a thread (the loop's barrier:
       all of it is made before any product), then each thread's share of every matrix's weight rows
       through every tile of x, the matrices one after another with no barrier between them (a decode
       step's q, k and v, or gate and up: one region, not one a matrix). A region a tile made a long
       prompt's threads meet at a barrier after every tile (py-spy showed the main thread waiting
       there), and one thread quantized all of x while the others waited. A decode step's few rows are
       copied before the region: a barrier would cost more than the copy. */
    const int64_t all = (int64_t)blocks, slice = m >= SPLIT_COPY_FROM ? (all + parts - 1) / parts : all;
    if (slice == all) lb_quantize(x, 0, all, &a);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        if (slice < all) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < all; b += slice) lb_quantize(x, b, b + slice < all ? b + slice : all, &a);
        }
#pragma omp for schedule(static)
        for (int part = 0; part < parts; part++)
            for (int j = 0; j < count; j++) { /* this part's share of matrix j: a multiple of LB_GROUP rows */
                const lb_matrix *mat = mats[j];
                const int64_t n = mat->n, share = ((n + parts - 1) / parts + LB_GROUP - 1) / LB_GROUP * LB_GROUP;
                const int64_t i = part * share, i1 = i + share < n ? i + share : n;
                for (int64_t r0 = 0; i < n && r0 < m; r0 += TILE) {
                    const int64_t r1 = r0 + TILE < m ? r0 + TILE : m;
                    if (mat->layout == LB_GROUPS)
                        lb_groups(ts[j], mat->w, i, i1, &a, r0, r1, ys[j], n);
                    else
                        lb_rows(ts[j], mat->w, i, i1, &a, r0, r1, ys[j], n);
                }
            }
    }
    free(scratch);
    return LB_OK;
}
