/* The attention's arithmetic for the row kernel (included by rowstep_simd.h): exp (and the MLP's
   activation, which shares it), the softmax's parts, the scores q . K of one head or of the
   query heads that share a KV head, and the weighed value sums, each with AVX-512 / AVX2 paths
   and a plain C one. Every (row, head)'s results are the same bits whichever path, block size or
   head grouping computes them. */
#ifndef ROWSTEP_ATTN_H
#define ROWSTEP_ATTN_H
/* x[i] = exp(x[i]) in place. One polynomial for every element (vector lanes and tail
   alike): exp(x) = 2^n exp(r), r = x - n ln2, |r| <= ln2 / 2, degree 6 (rel. error ~2e-7). Its
   constants live here once, so the vector forms stay element for element the scalar one. */
#define EXP_LO -87.3f
#define EXP_HI 88.3f
#define EXP_LOG2E 1.44269504f
#define EXP_LN2_HI -0.693145751953125f       /* -ln2 in two parts: r = x + n hi + n lo */
#define EXP_LN2_LO -1.428606765330187e-06f
static const float EXP_C[7] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};   /* Horner, highest first */

static inline float exp_poly(float x) {
    x = x < EXP_LO ? EXP_LO : x > EXP_HI ? EXP_HI : x;
    float n = nearbyintf(x * EXP_LOG2E), r = fmaf(n, EXP_LN2_LO, fmaf(n, EXP_LN2_HI, x)), p = EXP_C[0];
    for (int k = 1; k < 7; k++) p = fmaf(p, r, EXP_C[k]);
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)n << 23;
    return u.f;
}

#if defined(__AVX512F__)
/* exp_poly on 16 lanes: its operations, element for element */
static inline __m512 exp16(__m512 v) {
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(EXP_LN2_LO), _mm512_fmadd_ps(nn, _mm512_set1_ps(EXP_LN2_HI), v));
    __m512 p = _mm512_set1_ps(EXP_C[0]);
    for (int k = 1; k < 7; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C[k]));
    __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(nn), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}
#endif

static void vexp(float *x, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
#endif
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
        __m256 nn = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(EXP_LN2_LO), _mm256_fmadd_ps(nn, _mm256_set1_ps(EXP_LN2_HI), v));
        __m256 p = _mm256_set1_ps(EXP_C[0]);
        for (int k = 1; k < 7; k++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C[k]));
        __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(nn), 23);
        _mm256_storeu_ps(x + i, _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e)));
    }
#endif
    for (; i < n; i++) x[i] = exp_poly(x[i]);
}

/* a[j] = g[j] / (1 + exp(-g[j])) * up[j], j < n (SiLU(gate) times up): negate, vexp, add, divide,
   multiply, in that order for every element, so the 16-lane pass has the bits of the loops */
static void silu_mul(const float *g, const float *up, float *a, int n) {
    int j = 0;
#if defined(__AVX512F__)
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (; j + 16 <= n; j += 16) {
        __m512 gv = _mm512_loadu_ps(g + j);
        __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), sign)));
        _mm512_storeu_ps(a + j, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), e)),
                                              _mm512_loadu_ps(up + j)));
    }
#endif
    for (int i = j; i < n; i++) a[i] = -g[i];
    vexp(a + j, n - j);
    for (; j < n; j++) a[j] = g[j] / (1.f + a[j]) * up[j];
}


/* sc[p] = exp(sc[p] scale - max) in place -> their sum (the softmax's numerators and
   denominator). With AVX-512 the max and the sum run 16 lanes wide (the sum in another order
   than the loop's: every row, step or verify, runs this same code); an element's exp is
   exp_poly's bits whichever lanes compute it */
static float softmax_parts(float *sc, int n, float scale) {
    float mx = -INFINITY, sum = 0.f;
    int p = 0;
#if defined(__AVX512F__)
    __m512 vmx = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    for (; p + 16 <= n; p += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(sc + p), vs);
        _mm512_storeu_ps(sc + p, v);
        vmx = _mm512_max_ps(vmx, v);
    }
    mx = _mm512_reduce_max_ps(vmx);
#endif
    for (; p < n; p++) { sc[p] *= scale; mx = sc[p] > mx ? sc[p] : mx; }
    p = 0;
#if defined(__AVX512F__)
    /* sc - max, its exp and the sum in one pass: the same bits as the passes below */
    __m512 acc = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
    for (; p + 16 <= n; p += 16) {
        __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + p), vm));
        _mm512_storeu_ps(sc + p, v);
        acc = _mm512_add_ps(acc, v);
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (int i = p; i < n; i++) sc[i] -= mx;
    vexp(sc + p, n - p);
    for (; p < n; p++) sum += sc[p];
    return sum;
}

/* softmax_parts of the nh heads' scores at sc + h ld -> sum[h]. Without AVX-512 the max and
   the sum are chains of scalar operations, one per head, in the order of p: run here side by
   side, up to 8 heads at a time (each chain its own operations, in its own order) */
static void softmax_group(float *sc, size_t ld, int nh, int n, float scale, float *sum) {
#if defined(__AVX512F__)
    for (int h = 0; h < nh; h++) sum[h] = softmax_parts(sc + h * ld, n, scale);
#else
    for (int h0 = 0; h0 < nh; h0 += 8) {
        int k = nh - h0 < 8 ? nh - h0 : 8;
        float mx[8], sm[8], *s = sc + h0 * ld;
        for (int h = 0; h < k; h++) { mx[h] = -INFINITY; sm[h] = 0.f; }
        for (int p = 0; p < n; p++)
            for (int h = 0; h < k; h++) {
                float x = s[h * ld + p] * scale;
                s[h * ld + p] = x;
                mx[h] = x > mx[h] ? x : mx[h];
            }
        for (int h = 0; h < k; h++) {
            for (int p = 0; p < n; p++) s[h * ld + p] -= mx[h];
            vexp(s + h * ld, n);
        }
        for (int p = 0; p < n; p++)
            for (int h = 0; h < k; h++) sm[h] += s[h * ld + p];
        for (int h = 0; h < k; h++) sum[h0 + h] = sm[h];
    }
#endif
}

#if defined(__AVX2__)
/* s[i] = the sum of a[i]'s 8 lanes, i < 8 */
static inline void sums8(const __m256 *a, float *s) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
}
#endif

/* s[i] = q . K[i] for the 8 keys of K (rows of Dh floats), where this build has a block path
   for Dh (score_blocks): 8 accumulators over the Dh chunks in order, then sums8 */
static inline int score_blocks(int Dh) {
#if defined(__AVX512F__)
    if (Dh % 16 == 0) return 1;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (Dh % 8 == 0) return 1;
#endif
    (void)Dh;
    return 0;
}

static inline __attribute__((always_inline)) void score_block8(const float *q, const float *K, int Dh, float *s) {
#if defined(__AVX512F__)
    if (Dh % 16 == 0) {
        __m512 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
        for (int c = 0; c < Dh; c += 16) {
            __m512 qv = _mm512_loadu_ps(q + c);
            for (int i = 0; i < 8; i++) a[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(K + (size_t)i * Dh + c), a[i]);
        }
        __m256 b[8];
        for (int i = 0; i < 8; i++) b[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
        sums8(b, s);
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int c = 0; c < Dh; c += 8) {
            __m256 qv = _mm256_loadu_ps(q + c);
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (size_t)i * Dh + c), a[i]);
        }
        sums8(a, s);
    }
#else
    (void)q; (void)K; (void)Dh; (void)s;
#endif
}

#if defined(__AVX512F__)
/* 16 scores at once, each the bits score_block8 gives: sa[i] = qa . ka[i], sb[i] = qb . kb[i],
   i < 8 (two heads on the same 8 keys, `shared`: kb == ka, each key row loaded once; or one
   head on 16 keys). Per accumulator the same FMAs over the Dh chunks, then the same sums:
   (lo 256 + hi 256), then sums8's tree (its hadd_ps pairs x0 + x1 as even + odd lanes, its last
   add the 0123 sums + the 4567 ones), 512 bits wide: 16 of them in the shuffles and adds that
   sums8 takes for 8 */
static inline __attribute__((always_inline)) void score_block16(const float *qa, const float *ka, const float *qb,
                                                                const float *kb, const int Dh, const int shared,
                                                                float *sa, float *sb) {
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (int c = 0; c < Dh; c += 16) {
        __m512 qva = _mm512_loadu_ps(qa + c), qvb = _mm512_loadu_ps(qb + c);
        for (int i = 0; i < 8; i++) {
            __m512 k = _mm512_loadu_ps(ka + (size_t)i * Dh + c);
            if (shared) __asm__("" : "+v"(k));      /* one load for both heads, not one each */
            a[i] = _mm512_fmadd_ps(qva, k, a[i]);
            a[8 + i] = _mm512_fmadd_ps(qvb, shared ? k : _mm512_loadu_ps(kb + (size_t)i * Dh + c), a[8 + i]);
        }
    }
    __m512 b[8];                         /* b[i] = [a[i] lo + hi, a[8 + i] lo + hi] */
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[8 + i], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[i], a[8 + i], _MM_SHUFFLE(3, 2, 3, 2)));
#define HADD512(x, y) _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)))
    __m512 u0 = HADD512(HADD512(b[0], b[1]), HADD512(b[2], b[3]));
    __m512 u1 = HADD512(HADD512(b[4], b[5]), HADD512(b[6], b[7]));
#undef HADD512
    /* 128-bit lanes: u0 [0123 sums of a0-3, 4567 sums of a0-3, the same of a8-11], u1 of a4-7, a12-15 */
    const __m512i lo = _mm512_set_epi32(27, 26, 25, 24, 11, 10, 9, 8, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 23, 22, 21, 20, 7, 6, 5, 4);
    __m512 r = _mm512_add_ps(_mm512_permutex2var_ps(u0, lo, u1), _mm512_permutex2var_ps(u0, hi, u1));
    _mm256_storeu_ps(sa, _mm512_castps512_ps256(r));
    _mm256_storeu_ps(sb, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
}
#endif

/* s[h ld + p] = q[h Dh ..] . K[p] for the nh query heads of one KV head (their q side by side),
   p < n (K rows of Dh floats). Per block of keys every head's scores while the block is in L1;
   each score the same operations as one head alone (score_block8's, then dot_f32 past the
   last whole block of 8) */
static inline __attribute__((always_inline)) void scores_heads(const float *q, int nh, const float *K, int n,
                                                               int Dh, float *s, size_t ld) {
    int p = 0;
#if defined(__AVX512F__)
    if (Dh % 16 == 0) {        /* heads in pairs on 8 keys; an odd one left on 16 keys */
        int odd = nh & 1, h;
        for (; p + 16 <= n; p += 16) {
            for (h = 0; h + 2 <= nh; h += 2)
                for (int k = p; k < p + 16; k += 8)
                    score_block16(q + (size_t)h * Dh, K + (size_t)k * Dh, q + (size_t)(h + 1) * Dh, K + (size_t)k * Dh, Dh, 1,
                                  s + h * ld + k, s + (h + 1) * ld + k);
            if (odd)
                score_block16(q + (size_t)h * Dh, K + (size_t)p * Dh, q + (size_t)h * Dh, K + (size_t)(p + 8) * Dh, Dh, 0,
                              s + h * ld + p, s + h * ld + p + 8);
        }
        if (p + 8 <= n) {
            for (h = 0; h + 2 <= nh; h += 2)
                score_block16(q + (size_t)h * Dh, K + (size_t)p * Dh, q + (size_t)(h + 1) * Dh, K + (size_t)p * Dh, Dh, 1,
                              s + h * ld + p, s + (h + 1) * ld + p);
            if (odd) score_block8(q + (size_t)h * Dh, K + (size_t)p * Dh, Dh, s + h * ld + p);
            p += 8;
        }
    }
#endif
    if (score_blocks(Dh))
        for (; p + 8 <= n; p += 8)
            for (int h = 0; h < nh; h++) score_block8(q + (size_t)h * Dh, K + (size_t)p * Dh, Dh, s + h * ld + p);
    for (int h = 0; h < nh; h++)
        for (int r = p; r < n; r++) s[h * ld + r] = dot_f32(q + (size_t)h * Dh, K + (size_t)r * Dh, Dh);
}

static void scores_group(const float *q, int nh, const float *K, int n, int Dh, float *s, size_t ld) {
    if (Dh == 64) scores_heads(q, nh, K, n, 64, s, ld);          /* constant: the chunk loop unrolled */
    else if (Dh == 128) scores_heads(q, nh, K, n, 128, s, ld);
    else scores_heads(q, nh, K, n, Dh, s, ld);
}

/* o = sum_p w[p] V[p] (V rows of Dh floats), each element summed over p in order */
#if defined(__AVX2__) && defined(__FMA__)
static inline __attribute__((always_inline)) void weigh_chunks(const float *w, const float *V, int n, int Dh, const int C, float *o) {
    __m256 acc[16];                       /* one register per 8 of the head's dimensions */
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int p = 0; p < n; p++) {
        __m256 wp = _mm256_broadcast_ss(w + p);
        for (int c = 0; c < C; c++) acc[c] = _mm256_fmadd_ps(wp, _mm256_loadu_ps(V + (size_t)p * Dh + 8 * c), acc[c]);
    }
    for (int c = 0; c < C; c++) _mm256_storeu_ps(o + 8 * c, acc[c]);
}
#endif

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void weigh_chunks16(const float *w, const float *V, int n, int Dh, const int C, float *o) {
    __m512 acc[8];                        /* one register per 16 of the head's dimensions */
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int p = 0; p < n; p++) {
        __m512 wp = _mm512_set1_ps(w[p]);
        for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(wp, _mm512_loadu_ps(V + (size_t)p * Dh + 16 * c), acc[c]);
    }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
#endif

static void weigh_values(const float *w, const float *V, int n, int Dh, float *o) {
#if defined(__AVX512F__)
    if (Dh == 64) { weigh_chunks16(w, V, n, Dh, 4, o); return; }
    if (Dh == 128) { weigh_chunks16(w, V, n, Dh, 8, o); return; }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (Dh == 64) { weigh_chunks(w, V, n, Dh, 8, o); return; }
    if (Dh == 128) { weigh_chunks(w, V, n, Dh, 16, o); return; }
#endif
    memset(o, 0, sizeof(float) * Dh);
    for (int p = 0; p < n; p++) axpy(o, w[p], V + (size_t)p * Dh, Dh);
}

/* o[h Dh ..] = sum_p w[h ld + p] V[p] for the nh query heads of one KV head: each V row is
   loaded once for all of them (each head's elements summed over p in order, the FMAs
   weigh_values runs: an element's bits are the same whichever path computes them) */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void weigh_heads16(const float *w, size_t ld, const float *V, int n,
                                                                const int Dh, const int NH, float *o) {
    __m512 acc[7][8];                     /* [NH][Dh / 16], in registers once inlined */
    for (int h = 0; h < NH; h++) for (int c = 0; c < Dh / 16; c++) acc[h][c] = _mm512_setzero_ps();
    for (int p = 0; p < n; p++) {
        __m512 v[8];
        for (int c = 0; c < Dh / 16; c++) v[c] = _mm512_loadu_ps(V + (size_t)p * Dh + 16 * c);
        for (int h = 0; h < NH; h++) {
            __m512 wp = _mm512_set1_ps(w[h * ld + p]);
            for (int c = 0; c < Dh / 16; c++) acc[h][c] = _mm512_fmadd_ps(wp, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++) for (int c = 0; c < Dh / 16; c++) _mm512_storeu_ps(o + h * Dh + 16 * c, acc[h][c]);
}
#endif

static void weigh_group(const float *w, size_t ld, const float *V, int n, int Dh, int nh, float *o) {
    int h = 0;
#if defined(__AVX512F__)
    if (Dh == 64)           /* up to 7 heads x 4 registers at a time */
        for (; h < nh; ) {
            int k = nh - h > 7 ? (nh - h == 8 ? 4 : 7) : nh - h;
            switch (k) {
                case 1: weigh_heads16(w + h * ld, ld, V, n, 64, 1, o + h * Dh); break;
                case 2: weigh_heads16(w + h * ld, ld, V, n, 64, 2, o + h * Dh); break;
                case 3: weigh_heads16(w + h * ld, ld, V, n, 64, 3, o + h * Dh); break;
                case 4: weigh_heads16(w + h * ld, ld, V, n, 64, 4, o + h * Dh); break;
                case 5: weigh_heads16(w + h * ld, ld, V, n, 64, 5, o + h * Dh); break;
                case 6: weigh_heads16(w + h * ld, ld, V, n, 64, 6, o + h * Dh); break;
                default: weigh_heads16(w + h * ld, ld, V, n, 64, 7, o + h * Dh); break;
            }
            h += k;
        }
    if (Dh == 128)          /* up to 3 heads x 8 registers */
        for (; h < nh; ) {
            int k = nh - h > 3 ? 3 : nh - h;
            switch (k) {
                case 1: weigh_heads16(w + h * ld, ld, V, n, 128, 1, o + h * Dh); break;
                case 2: weigh_heads16(w + h * ld, ld, V, n, 128, 2, o + h * Dh); break;
                default: weigh_heads16(w + h * ld, ld, V, n, 128, 3, o + h * Dh); break;
            }
            h += k;
        }
#endif
    for (; h < nh; h++) weigh_values(w + h * ld, V, n, Dh, o + h * Dh);
}

#endif
