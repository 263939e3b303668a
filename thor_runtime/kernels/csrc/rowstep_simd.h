/* The row kernel's building blocks (included by rowstep.c): a fork-join thread pool and the
   per-row SIMD kernels (dot products, the attention's arithmetic in rowstep_attn.h, int8
   activation blocks and the low-bit matmul tiles), each with AVX-512 VNNI / AVX2 / NEON paths
   and a plain C one. */
#ifndef ROWSTEP_SIMD_H
#define ROWSTEP_SIMD_H
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#elif defined(__aarch64__)
#include <arm_neon.h>
#define PAUSE() __asm__ __volatile__("yield")
#else
#define PAUSE() ((void)0)
#endif

#define MAXT 64
#define BLK 32

/* ---------------------------------------------------------------- a fork-join pool
   A region is cut into parts that threads claim one at a time (a ticket: generation, part
   count, next part in one word), so a thread the scheduler takes off its core holds back at
   most the part it has claimed, never a fixed share of the region. A part's outputs are the
   same bits whichever thread computes it, so neither the claiming order nor the number of
   threads in use changes a result. `use` (1..n) threads take part in a forward; the others sleep. */
typedef void (*task_fn)(void *arg, int part, int nparts, int slot);
typedef struct Pool Pool;
typedef struct { Pool *p; int tid; } WorkerArg;
struct Pool {
    int n;
    pid_t pid;              /* the process whose threads these are */
    pthread_t th[MAXT];
    WorkerArg args[MAXT];
    _Atomic uint64_t ticket;   /* generation << 40 | parts << 24 | next part */
    atomic_int done, active, stop, use;
    task_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

#define TK_NEXT(t) ((int)((t) & 0xffffff))
#define TK_PARTS(t) ((int)(((t) >> 24) & 0xffff))
#define TK_GEN(t) ((t) >> 40)

/* claim and run parts of the current region until none is left */
static void pool_claim(Pool *p, int slot) {
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    while (TK_NEXT(t) < TK_PARTS(t)) {
        if (atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            /* the region cannot end (nor fn/arg change) before this part is done */
            p->fn(p->arg, TK_NEXT(t), TK_PARTS(t), slot);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
            t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        }
    }
}

static void *worker(void *a) {
    Pool *p = ((WorkerArg *)a)->p;
    int tid = ((WorkerArg *)a)->tid;
    for (;;) {
        if (atomic_load(&p->stop)) return NULL;
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if (TK_NEXT(t) < TK_PARTS(t) && tid < atomic_load(&p->active)) {
            pool_claim(p, tid);
        } else if (tid < atomic_load(&p->active)) {
            PAUSE();            /* spin while a forward runs (many short regions) */
        } else {                /* sleep between forwards, and when not in use */
            pthread_mutex_lock(&p->mu);
            while (tid >= atomic_load(&p->active) && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* on: `use` threads take part in the coming regions; off: every worker sleeps */
static void pool_active(Pool *p, int on) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->active, on ? atomic_load(&p->use) : 0);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* run fn over `nparts` parts (at most 65535) on the threads in use; returns when all are done */
static void pool_run(Pool *p, task_fn fn, void *arg, int nparts) {
    if (nparts < 1) return;
    if (atomic_load(&p->active) <= 1 || getpid() != p->pid) {
        /* alone, or a forked child (which has no workers): every part here, in order */
        for (int i = 0; i < nparts; i++) fn(arg, i, nparts, 0);
        return;
    }
    p->fn = fn; p->arg = arg;
    atomic_store(&p->done, 0);
    uint64_t gen = TK_GEN(atomic_load(&p->ticket)) + 1;
    atomic_store_explicit(&p->ticket, gen << 40 | (uint64_t)nparts << 24, memory_order_release);
    pool_claim(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < nparts) PAUSE();
}

/* parts per region: a few per thread in use, so one descheduled thread holds back little */
static int pool_parts(Pool *p, int items) {
    int want = 4 * atomic_load(&p->active);
    return items < want ? (items > 0 ? items : 1) : want;
}

/* [lo, hi) of n items for part `part` of `nparts`, in chunks of `align` */
static void share(int n, int align, int part, int nparts, int *lo, int *hi) {
    int chunks = (n + align - 1) / align, per = chunks / nparts, rem = chunks % nparts;
    int c0 = part * per + (part < rem ? part : rem), c1 = c0 + per + (part < rem);
    *lo = c0 * align < n ? c0 * align : n;
    *hi = c1 * align < n ? c1 * align : n;
}

/* ---------------------------------------------------------------- kernels */
static inline float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#elif defined(__aarch64__)
    float32x4_t acc = vdupq_n_f32(0.f);
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    s = vaddvq_f32(acc);
#endif
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static inline void axpy(float *y, float a, const float *x, int n) {   /* y += a x */
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#elif defined(__aarch64__)
    float32x4_t va = vdupq_n_f32(a);
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i)));
#endif
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

#include "rowstep_attn.h"      /* exp, softmax, attention scores and value sums */

/* one row x [K] -> qx [K] int8 (4-bit weights: per block the even inputs, then the odd, as a
   block's nibbles unpack), sx [K/32] = absmax / 127, zs [K/32] = sx * sum(qx) */
static void quantize_row(const float *x, int K, int split, int8_t *qx, float *sx, float *zs, int32_t *is, int step) {
    int b = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    /* the same bits as the loop below (a max is exact; the products and their rounding to
       nearest even are the same operations), 16 lanes at a time */
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (; b < K / BLK; b++) {
        const float *p = x + b * BLK;
        __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        if (split) {
            __m512i e = _mm512_permutex2var_epi32(i0, even, i1), o = _mm512_permutex2var_epi32(i0, odd, i1);
            i0 = e; i1 = o;
        }
        _mm_storeu_si128((__m128i *)(qx + (size_t)b * step * BLK), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qx + (size_t)b * step * BLK + 16), _mm512_cvtepi32_epi8(i1));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        sx[(size_t)b * step] = d; zs[(size_t)b * step] = d * (float)sum; is[(size_t)b * step] = sum;
    }
#endif
    for (; b < K / BLK; b++) {
        const float *p = x + b * BLK;
        float amax = 0.f;
        for (int i = 0; i < BLK; i++) { float a = fabsf(p[i]); amax = a > amax ? a : amax; }   /* no libm call */
        float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        int s = 0;
        int8_t *q = qx + (size_t)b * step * BLK;
        for (int j = 0; j < BLK / 2; j++) {
            int e = (int)nearbyintf(p[2 * j] * id), o = (int)nearbyintf(p[2 * j + 1] * id);
            if (split) { q[j] = (int8_t)e; q[j + BLK / 2] = (int8_t)o; }
            else { q[2 * j] = (int8_t)e; q[2 * j + 1] = (int8_t)o; }
            s += e + o;
        }
        sx[(size_t)b * step] = d; zs[(size_t)b * step] = d * (float)s; is[(size_t)b * step] = s;
    }
}

/* sum_i w_i qx_i over one block, for the portable path */
static inline int32_t block_dot(const uint8_t *w, const int8_t *qx, int bits) {
    int32_t s = 0;
    if (bits == 4)
        for (int j = 0; j < BLK / 2; j++) s += (w[j] & 15) * qx[j] + (w[j] >> 4) * qx[j + BLK / 2];
    else
        for (int j = 0; j < BLK; j++) s += w[j] * qx[j];
    return s;
}

typedef struct {            /* one projection */
    const uint8_t *blob;    /* [N, K/32, 32 bits / 8] */
    const float *s, *m;     /* [N, K/32] each: w = s q + m */
    const float *bias;      /* [N] or NULL */
    int N, K, bits;
    void *own;              /* the engine's own copy of blob, s and m (a regrouped layout), or NULL */
} Proj;

typedef struct {            /* the quantized rows of one input */
    const int8_t *qx; const float *sx, *zs;
    const int32_t *is;
    int M, K;
} QRows;

/* units: NULL, every output; else the nunits output units (UNIT outputs each, in order) whose
   outputs are wanted, the others left as they are (a head's logits the grammar allows).
   at: NULL, input row r writes output row r; else output row at[r] (a head's rows placed among
   rows another head call fills) */
typedef struct { const Proj *w; const QRows *x; float *y; const int32_t *units; int nunits; const int64_t *at; } MatmulTask;

/* where row r of a tile writes: y is row 0's (at NULL) or the whole output's (at: the tile's
   part of the row map) */
#define OUT_ROW(y, at, r, ldy) ((y) + (size_t)((at) ? (at)[r] : (r)) * (ldy))

/* outputs per tile (independent accumulation chains) and rows per pass: a weight block is
   unpacked once for up to RT rows (the interleaved layout: NEON and plain C) */
#if defined(__aarch64__)
#define NT 4
#else
#define NT 2
#endif
#define RT 4
#define PREFETCH_TILES 3

/* y[r0 + r, n0 + j] for R rows and NT outputs. Each (row, output) sum runs over the blocks in
   order with the same operations whatever R is: a row's bits do not depend on the others. */
static inline __attribute__((always_inline)) void tile(const Proj *w, const QRows *x, int r0, const int R, int n0, float *y, int ldy,
                                                        const int64_t *at) {
    int nb = w->K / BLK, bytes = BLK * w->bits / 8;
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    /* signed dot products: 4-bit codes are 0..15 as they are; 8-bit codes q + 128 become q,
       and 128 sum(qx) goes back in as 32 sum(qx) on each of the 4 lanes */
    float32x4_t acc[NT][RT];
    for (int j = 0; j < NT; j++) for (int r = 0; r < R; r++) acc[j][r] = vdupq_n_f32(0.f);
    for (int b = 0; b < nb; b++) {
        int8x16_t xl[RT], xh[RT];
        float32x4_t sx[RT];
        int32x4_t top[RT];
        for (int r = 0; r < R; r++) {
            const int8_t *q = x->qx + (size_t)(r0 + r) * x->K + b * BLK;
            xl[r] = vld1q_s8(q); xh[r] = vld1q_s8(q + 16);
            sx[r] = vdupq_n_f32(x->sx[(size_t)(r0 + r) * nb + b]);
            top[r] = vdupq_n_s32(w->bits == 8 ? 32 * x->is[(size_t)(r0 + r) * nb + b] : 0);
        }
        for (int j = 0; j < NT; j++) {
            size_t at = (size_t)(n0 + j) * nb + b;
            const uint8_t *wb = w->blob + at * bytes;
            int8x16_t wl, wh;
            if (w->bits == 4) {
                uint8x16_t by = vld1q_u8(wb);
                wl = vreinterpretq_s8_u8(vandq_u8(by, vdupq_n_u8(0x0F)));
                wh = vreinterpretq_s8_u8(vshrq_n_u8(by, 4));
            } else {
                wl = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb), vdupq_n_u8(0x80)));
                wh = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + 16), vdupq_n_u8(0x80)));
            }
            float32x4_t s = vdupq_n_f32(w->s[at]);
            for (int r = 0; r < R; r++) {
                int32x4_t p = vdotq_s32(vdotq_s32(top[r], wl, xl[r]), wh, xh[r]);
                acc[j][r] = vfmaq_f32(acc[j][r], vmulq_f32(vcvtq_f32_s32(p), sx[r]), s);
            }
        }
    }
    for (int j = 0; j < NT; j++)
        for (int r = 0; r < R; r++)
            OUT_ROW(y, at, r, ldy)[j] = vaddvq_f32(acc[j][r]) + dot_f32(w->m + (size_t)(n0 + j) * nb, x->zs + (size_t)(r0 + r) * nb, nb);
#else
    for (int j = 0; j < NT; j++)
        for (int r = 0; r < R; r++) {
            const int8_t *q = x->qx + (size_t)(r0 + r) * x->K;
            float acc = 0.f;
            for (int b = 0; b < nb; b++) {
                size_t at = (size_t)(n0 + j) * nb + b;
                acc = fmaf((float)block_dot(w->blob + at * bytes, q + b * BLK, w->bits) * x->sx[(size_t)(r0 + r) * nb + b],
                           w->s[at], acc);
            }
            OUT_ROW(y, at, r, ldy)[j] = acc + dot_f32(w->m + (size_t)(n0 + j) * nb, x->zs + (size_t)(r0 + r) * nb, nb);
        }
#endif
}

#include "rowstep_group.h"   /* GROUP: the regrouped layout's gtile, where the CPU has one */

#if GROUP
/* every row of G (1 or GT) output groups from g. Past RT rows, where the build has wider
   tiles (GRT), the groups go one at a time GRT rows deep: with GT groups of RT rows a block's
   integer sums formed too few independent chains to keep the dot-product unit busy (8 and 12
   rows 1.09x faster, 16 rows 1.05x; docs/performance.md). Fewer rows keep GT groups: a lone
   row needs the second group's chain. */
static inline __attribute__((always_inline)) void gtiles(const MatmulTask *t, int g, const int G) {
    const Proj *w = t->w;
    int M = t->x->M;
    for (int r = 0; r < M;) {
        const int64_t *at = t->at ? t->at + r : NULL;
        float *y = t->y + (at ? 0 : (size_t)r * w->N) + (size_t)g * GROUP;
        int R = M - r;
        /* constant shapes: unrolled, in registers; a lane's operations are the same in each */
#if GRT > RT
        if (R > RT) {
            R = R < GRT ? R : GRT;
            for (int k = 0; k < G; k++)
                switch (R) {
                    case 5: gtile(w, t->x, r, 5, g + k, 1, y + k * GROUP, w->N, at); break;
                    case 6: gtile(w, t->x, r, 6, g + k, 1, y + k * GROUP, w->N, at); break;
                    case 7: gtile(w, t->x, r, 7, g + k, 1, y + k * GROUP, w->N, at); break;
                    default: gtile(w, t->x, r, 8, g + k, 1, y + k * GROUP, w->N, at); break;
                }
            r += R;
            continue;
        }
#endif
        R = R < RT ? R : RT;
        switch (R) {
            case 1: gtile(w, t->x, r, 1, g, G, y, w->N, at); break;
            case 2: gtile(w, t->x, r, 2, g, G, y, w->N, at); break;
            case 3: gtile(w, t->x, r, 3, g, G, y, w->N, at); break;
            default: gtile(w, t->x, r, 4, g, G, y, w->N, at); break;
        }
        r += R;
    }
}

#define UNIT GROUP

static void matmul_task(void *arg, int part, int nparts, int slot) {
    const MatmulTask *t = arg;
    int lo, hi;
    (void)slot;
    if (t->units) {         /* a group's lanes run the same operations whatever G is */
        share(t->nunits, 1, part, nparts, &lo, &hi);
        for (int u = lo; u < hi; u++) gtiles(t, t->units[u], 1);
        return;
    }
    share((t->w->N + GROUP - 1) / GROUP, 1, part, nparts, &lo, &hi);
    for (int g = lo; g < hi; g += GT) {
        if (hi - g >= GT) gtiles(t, g, GT);
        else gtiles(t, g, 1);
    }
}

#else

/* every row of the NT outputs from n */
static inline void ntiles(const MatmulTask *t, int n) {
    const Proj *w = t->w;
    int M = t->x->M;
    for (int r = 0; r < M; r += RT) {
        const int64_t *at = t->at ? t->at + r : NULL;
        float *y = t->y + (at ? 0 : (size_t)r * w->N) + n;
        switch (M - r < RT ? M - r : RT) {     /* constant row counts: unrolled, in registers */
            case 1: tile(w, t->x, r, 1, n, y, w->N, at); break;
            case 2: tile(w, t->x, r, 2, n, y, w->N, at); break;
            case 3: tile(w, t->x, r, 3, n, y, w->N, at); break;
            default: tile(w, t->x, r, 4, n, y, w->N, at); break;
        }
        if (w->bias)
            for (int rr = 0; rr < RT && r + rr < M; rr++)
                for (int j = 0; j < NT; j++) OUT_ROW(y, at, rr, w->N)[j] += w->bias[n + j];
    }
}

#define UNIT NT

static void matmul_task(void *arg, int part, int nparts, int slot) {
    const MatmulTask *t = arg;
    const Proj *w = t->w;
    int lo, hi;
    (void)slot;
    if (t->units) {         /* an output's operations do not depend on the tile around it */
        share(t->nunits, 1, part, nparts, &lo, &hi);
        for (int u = lo; u < hi; u++) ntiles(t, t->units[u] * NT);
        return;
    }
    share(w->N, 16, part, nparts, &lo, &hi);
    size_t row_bytes = (size_t)w->K * w->bits / 8, nb = w->K / BLK;
    for (int n = lo; n < hi; n += NT) {
        /* A core streaming blocks is latency-bound: the hardware prefetcher does not run far
           enough ahead of NT interleaved rows. The weights, scales and minimums PREFETCH_TILES
           tiles ahead are asked for now (measured on the planner model: steps 1.36x faster
           on AVX-512, 1.61x on AVX2; docs/performance.md). */
        if (n + (PREFETCH_TILES + 1) * NT <= hi) {
            size_t ahead = (size_t)(n + PREFETCH_TILES * NT);
            const char *wa = (const char *)w->blob + ahead * row_bytes;
            const char *sa = (const char *)(w->s + ahead * nb), *ma = (const char *)(w->m + ahead * nb);
            for (size_t o = 0; o < NT * row_bytes; o += 64) __builtin_prefetch(wa + o, 0, 0);
            for (size_t o = 0; o < NT * nb * sizeof(float); o += 64) {
                __builtin_prefetch(sa + o, 0, 0);
                __builtin_prefetch(ma + o, 0, 0);
            }
        }
        ntiles(t, n);
    }
}

#endif

/* y = x / rms(x) * w, per row; the sum of squares in one fixed order */
static void rms_norm_row(const float *x, const float *w, int D, float eps, float *y) {
    float ss = dot_f32(x, x, D);
    float r = 1.f / sqrtf(ss / (float)D + eps);
    for (int i = 0; i < D; i++) y[i] = x[i] * r * w[i];
}

/* HF rotate-half RoPE on one head vector at position p (cos/sin [P, Dh], halves repeated) */
static void rope(float *v, const float *cos, const float *sin, int Dh) {
    int h = Dh / 2;
    for (int j = 0; j < h; j++) {
        float a = v[j], b = v[j + h];
        v[j] = a * cos[j] - b * sin[j];
        v[j + h] = b * cos[j + h] + a * sin[j + h];
    }
}

#endif
