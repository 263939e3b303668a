/* The regrouped layout's tile (rowstep_layout() == GROUP > 0): GROUP outputs side by side in
   each vector, so a block's sums land in the lanes of the output vector with no horizontal
   sum. rowstep.c's proj() regroups the MatMulNBits blobs; CPUs without a gtile here (NEON,
   plain C) read the blobs as they are (GROUP 0, rowstep_simd.h's tile). */
#ifndef ROWSTEP_GROUP_H
#define ROWSTEP_GROUP_H

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GROUP 16
#elif defined(__AVX2__) && defined(__FMA__)
#define GROUP 8
#else
#define GROUP 0
#endif

/* where row r's block b of a QRows sits (QX_OFF: in qx, QS_AT: in the scales): the regrouped
   builds keep a block's rows together (block-major [K/32][M][32], scales [K/32][M]) so a
   tile's rows are fixed offsets from one pointer; the others row-major [M][K], [M][K/32] */
#if GROUP
#define QS_AT(x, r, b) ((size_t)(b) * (x)->M + (r))
#define QS_STEP(x) ((x)->M)
#else
#define QS_AT(x, r, b) ((size_t)(r) * ((x)->K / BLK) + (b))
#define QS_STEP(x) 1
#endif
#define QX_OFF(x, r, b) (QS_AT(x, r, b) * BLK)
#define QX_AT(x, r, b) ((x)->qx + QX_OFF(x, r, b))

#if GROUP == 16
/* ---- grouped layout (rowstep_layout() == GROUP): with a row's int8 block in registers as
   eight 4-byte words, one dpbusd against 16 outputs' matching words sums 4 inputs of each of
   16 outputs; eight of them finish a block with its sums already in the 16 lanes of the output
   vector. The interleaved layout (tile) needs 4 vector ops per 64 products and a horizontal sum
   per output; this one 12 per 512 and none (the verify and prefill rows are compute-bound).
   Per group g of 16 outputs and block b, 4-bit: four 64-byte vectors, vector i's word n the
   bytes 4i..4i+3 of output n's MatMulNBits block (low nibbles: split inputs 4i..4i+3, high:
   16 + 4i..), 8-bit: eight, vector k's word n the bytes 4k..4k+3; s and m [N/16, nb, 16]; N is
   padded to whole groups (zero weights), the padding never stored. */
#define GT 2          /* output groups per tile of up to RT rows */
#define GRT 8         /* rows per tile of one group: more accumulator chains in flight (gtiles) */
#define GPF 32        /* blocks ahead the first pass prefetches: 8 KB of 4-bit codes, a DRAM latency's worth at
                         the pace of an 8-row pass (8 left a 16-row verify 1.13x slower) */

static inline __attribute__((always_inline)) void gtile(const Proj *w, const QRows *x, int r0, const int R,
                                                         int g0, const int G, float *y, int ldy, const int64_t *at) {
    int nb = w->K / BLK, words = BLK * w->bits / 32, M = x->M;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    /* one group deep: each row's block in two chains (low and high nibbles), so 2R chains hide
       the dot product's latency; their integer sum is exact */
    const int TWO = G == 1 && w->bits == 4;
    __m512 acc[GT][GRT];
    for (int g = 0; g < G; g++) for (int r = 0; r < R; r++) acc[g][r] = _mm512_setzero_ps();
    const int32_t *xq = (const int32_t *)QX_AT(x, r0, 0);     /* the tile's rows of block b: xq + b M BLK/4 */
    const float *sx = x->sx + QS_AT(x, r0, 0), *zs = x->zs + QS_AT(x, r0, 0);
    for (int b = 0; b < nb; b++, xq += (size_t)M * BLK / 4, sx += QS_STEP(x), zs += QS_STEP(x)) {
        __m512i d[GT][GRT], e2[GT][GRT];
        for (int g = 0; g < G; g++) for (int r = 0; r < R; r++) d[g][r] = e2[g][r] = _mm512_setzero_si512();
        if (r0 == 0 && M > 1)   /* the first pass over the weights streams them: GPF blocks ahead */
            for (int g = 0; g < G; g++) {
                const char *ahead = (const char *)w->blob + (((size_t)(g0 + g) * nb + b + GPF) * words) * 64;
                for (int c = 0; c < words * 64; c += 64) __builtin_prefetch(ahead + c, 0, 0);
                __builtin_prefetch(w->s + ((size_t)(g0 + g) * nb + b + GPF) * GROUP, 0, 0);
                __builtin_prefetch(w->m + ((size_t)(g0 + g) * nb + b + GPF) * GROUP, 0, 0);
            }
        if (w->bits == 4) {
            for (int i = 0; i < 4; i++)
                for (int g = 0; g < G; g++) {
                    __m512i v = _mm512_loadu_si512(w->blob + (((size_t)(g0 + g) * nb + b) * words + i) * 64);
                    __m512i wl = _mm512_and_si512(v, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                    for (int r = 0; r < R; r++) {
                        d[g][r] = _mm512_dpbusd_epi32(d[g][r], wl, _mm512_set1_epi32(xq[r * BLK / 4 + i]));
                        if (TWO) e2[g][r] = _mm512_dpbusd_epi32(e2[g][r], wh, _mm512_set1_epi32(xq[r * BLK / 4 + 4 + i]));
                        else d[g][r] = _mm512_dpbusd_epi32(d[g][r], wh, _mm512_set1_epi32(xq[r * BLK / 4 + 4 + i]));
                    }
                }
            if (TWO) for (int r = 0; r < R; r++) d[0][r] = _mm512_add_epi32(d[0][r], e2[0][r]);
        } else {
            for (int k = 0; k < 8; k++)
                for (int g = 0; g < G; g++) {
                    __m512i v = _mm512_loadu_si512(w->blob + (((size_t)(g0 + g) * nb + b) * words + k) * 64);
                    for (int r = 0; r < R; r++) d[g][r] = _mm512_dpbusd_epi32(d[g][r], v, _mm512_set1_epi32(xq[r * BLK / 4 + k]));
                }
        }
        for (int g = 0; g < G; g++) {
            size_t at = ((size_t)(g0 + g) * nb + b) * GROUP;
            __m512 sw = _mm512_loadu_ps(w->s + at), mw = _mm512_loadu_ps(w->m + at);
            for (int r = 0; r < R; r++) {
                acc[g][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[g][r]), _mm512_mul_ps(sw, _mm512_set1_ps(sx[r])), acc[g][r]);
                acc[g][r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(zs[r]), acc[g][r]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        int left = w->N - (g0 + g) * GROUP;        /* the last group may be cut short */
        __mmask16 keep = left >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        for (int r = 0; r < R; r++) {
            __m512 o = acc[g][r];
            if (w->bias) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(keep, w->bias + (size_t)(g0 + g) * GROUP));
            _mm512_mask_storeu_ps(OUT_ROW(y, at, r, ldy) + (size_t)g * GROUP, keep, o);
        }
    }
}

#elif GROUP == 8
/* ---- the same regrouped words on AVX2, 8 outputs a group (one 256-bit vector). AVX2 has no
   dpbusd: maddubs sums pairs of u8 x s8 products into int16 lanes. With 4-bit codes (0..15) and
   |qx| <= 127 a pair is at most 3810, so a block's eight pair vectors add up in int16 (at most
   30480) and one madd against ones widens them: 21 ops per 8 outputs x 32 inputs, where the
   interleaved layout took 40 and a horizontal sum per output. 8-bit codes (the head) reach 255,
   which a pair cannot hold: their top bit goes apart (as 128 times the inputs where it is set),
   each vector widened on its own. Integer sums are exact, and every (row, group) runs the same
   float operations whatever R and G are. */
#define GT 1          /* 16 vector registers: one group of up to RT rows at a time */
#define GRT RT
#define GPF 8

static inline __attribute__((always_inline)) void gtile(const Proj *w, const QRows *x, int r0, const int R,
                                                         int g0, const int G, float *y, int ldy, const int64_t *at) {
    int nb = w->K / BLK, words = BLK * w->bits / 32;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[GT][RT];
    for (int g = 0; g < G; g++) for (int r = 0; r < R; r++) acc[g][r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int32_t *xw[RT];
        for (int r = 0; r < R; r++) xw[r] = (const int32_t *)QX_AT(x, r0 + r, b);
        for (int g = 0; g < G; g++) {
            const uint8_t *wb = w->blob + ((size_t)(g0 + g) * nb + b) * words * GROUP * 4;
            if (r0 == 0 && x->M > 1) {   /* the first pass over the weights streams them: GPF blocks ahead */
                const char *ahead = (const char *)wb + (size_t)GPF * words * GROUP * 4;
                for (int c = 0; c < words * GROUP * 4; c += 64) __builtin_prefetch(ahead + c, 0, 0);
                __builtin_prefetch(w->s + ((size_t)(g0 + g) * nb + b + GPF) * GROUP, 0, 0);
                __builtin_prefetch(w->m + ((size_t)(g0 + g) * nb + b + GPF) * GROUP, 0, 0);
            }
            __m256i d[RT];
            if (w->bits == 4) {
                __m256i p[RT];
                for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
                for (int i = 0; i < 4; i++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(wb + i * GROUP * 4));
                    __m256i wl = _mm256_and_si256(v, lo4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                    for (int r = 0; r < R; r++) {
                        p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(wl, _mm256_set1_epi32(xw[r][i])));
                        p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(wh, _mm256_set1_epi32(xw[r][4 + i])));
                    }
                }
                for (int r = 0; r < R; r++) d[r] = _mm256_madd_epi16(p[r], ones);
            } else {
                const __m256i low7 = _mm256_set1_epi8(0x7F), top = _mm256_set1_epi8((char)0x80);
                const __m256i w128 = _mm256_set1_epi16(128);
                for (int r = 0; r < R; r++) d[r] = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(wb + k * GROUP * 4));
                    __m256i lo = _mm256_and_si256(v, low7), hi = _mm256_srli_epi16(_mm256_and_si256(v, top), 7);
                    for (int r = 0; r < R; r++) {
                        __m256i xv = _mm256_set1_epi32(xw[r][k]);
                        d[r] = _mm256_add_epi32(d[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xv), ones));
                        d[r] = _mm256_add_epi32(d[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xv), w128));
                    }
                }
            }
            size_t at = ((size_t)(g0 + g) * nb + b) * GROUP;
            __m256 sw = _mm256_loadu_ps(w->s + at), mw = _mm256_loadu_ps(w->m + at);
            for (int r = 0; r < R; r++) {
                size_t xb = QS_AT(x, r0 + r, b);
                acc[g][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r]), _mm256_mul_ps(sw, _mm256_set1_ps(x->sx[xb])), acc[g][r]);
                acc[g][r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->zs[xb]), acc[g][r]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        int left = w->N - (g0 + g) * GROUP;        /* the last group may be cut short */
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r = 0; r < R; r++) {
            __m256 o = acc[g][r];
            if (w->bias) o = _mm256_add_ps(o, _mm256_maskload_ps(w->bias + (size_t)(g0 + g) * GROUP, keep));
            _mm256_maskstore_ps(OUT_ROW(y, at, r, ldy) + (size_t)g * GROUP, keep, o);
        }
    }
}

#endif

#endif
