/* lb_group_rows: the grouped layout (blocks.h, LB_GROUPS) made from the file's order of rows, in
   place, once per layer at load. fast/kernels/file_blocks.py group_rows computes the same in torch
   (the reference the tests hold this to, byte for byte); in C it is one pass over the bytes, where
   torch's reordering took several (a 1B file's load: `llamablock bench startup`). */

#include <stdlib.h>

#include "blocks.h"

/* Groups g0..g1-1 of w (rows of `row` bytes), each copied aside (8 rows) and written back grouped. */
static void group_range(const lb_traits *t, uint8_t *w, int64_t row, int64_t g0, int64_t g1, uint8_t *copy) {
    const int64_t nb = row / t->bytes;
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *group = w + g * LB_GROUP * row;
        memcpy(copy, group, (size_t)(LB_GROUP * row));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *rows[LB_GROUP];
            for (int r = 0; r < LB_GROUP; r++) rows[r] = copy + r * row + b * t->bytes;
            lb_group_block(t, rows, group + b * LB_GROUP * t->bytes);
        }
    }
}

int lb_group_rows(int type, uint8_t *w, int64_t n, int64_t k, int threads) {
    const lb_traits *t = lb_find(type);
    if (!t || !t->chunks) return LB_UNKNOWN;
    if (k % t->weights || n % LB_GROUP) return LB_BAD_SHAPE;
    const int64_t row = lb_row_bytes(t, k), groups = n / LB_GROUP;
    const int parts = threads > 1 ? threads : 1;
    /* each thread's copy of a group, allocated before any byte moves: without memory, w stays as it was */
    uint8_t *copies = malloc((size_t)(parts * LB_GROUP * row));
    if (!copies) return LB_NO_MEMORY;
#pragma omp parallel for num_threads(parts) if (parts > 1) schedule(static)
    for (int p = 0; p < parts; p++)
        group_range(t, w, row, groups * p / parts, groups * (p + 1) / parts, copies + (int64_t)p * LB_GROUP * row);
    free(copies);
    return LB_OK;
}
