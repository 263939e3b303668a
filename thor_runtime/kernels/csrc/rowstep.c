/* The decode and verify forward of a MatMulNBits llama-family model, rows computed one by one.

   Why: ONNX Runtime's step graph spends most of a decode step in per-node costs and in a
   GEMM path padded to two rows; a 1-row step here is a handful of memory-bound loops. Every
   row runs the same instruction sequence whatever the row count (rows never share a
   reduction), so a verify row gets a 1-row step's bits by construction; the model's load
   probe checks it anyway.

   Weights come as MatMulNBits blobs: 4-bit, byte j of a 32-block holding inputs 2j (low
   nibble) and 2j+1 (high); 8-bit (the head), a byte per input. With the codes q unsigned, a
   block is w = s q + m (m: Q4_1's minimum; -8 s for Q4_0, -128 s for the 8-bit head). Builds
   with AVX-512 VNNI or AVX2 read a regrouped copy (GROUP outputs side by side, see gtile in
   rowstep_group.h), the others (NEON, plain C) the blobs as they are. Activations are quantized to int8 per block of
   32 (absmax / 127), stored with the even inputs first so a block's nibbles unpack in place:
   y = sum_b s sx dot(q, qx) + m sx sum(qx). */
#include "rowstep_simd.h"

typedef struct {
    int L, D, H, Hkv, Dh, I, V, nth;
    float eps;
    const float **attn_norm, **mlp_norm, *final_norm;
    Proj *qkv, *o, *gu, *down, head;
    Pool pool;
    /* scratch, sized for MAXROWS rows */
    int maxrows, maxpos, wide;             /* wide: the longest row a scratch row holds */
    float *x, *y, *big, *att, *scores;     /* scores: [nth, SC_SLOT] */
    int8_t *qx;
    float *sx, *zs;
    int32_t *is;
} Engine;

/* a head's scores in a job's scratch: n floats, rounded up to whole lines and one more, so the
   heads' rows do not share a cache set at the same offset */
#define SC_LD(n) ((((size_t)(n) + 15) & ~(size_t)15) + 16)
#define SC_SLOT(e) ((size_t)((e)->H / (e)->Hkv) * (SC_LD((e)->maxpos) + 1))   /* a thread's scratch */

/* Rows x [M, K] -> int8 blocks, on the pool: a unit is QCHUNK blocks of one row, the units
   chunk by chunk so that two threads seldom write the same lines of the block-major arrays (a
   block's bits depend on its own 32 inputs, so any split gives the same). ``act``: x is [M, 2K], each
   row the MLP's gate then up, and the rows quantized are silu(gate) * up, formed chunk by chunk
   into scratch [M, K] (the same operations on each element whatever the split). */
#define QCHUNK 8
typedef struct { const float *x; float *scratch; int M, K, split, act; const QRows *q; Engine *e; } QuantTask;

static int quant_units(int M, int K) { return M * ((K / BLK + QCHUNK - 1) / QCHUNK); }

static void quant_task(void *arg, int part, int nparts, int slot) {
    const QuantTask *t = arg;
    int nb = t->K / BLK, lo, hi;
    (void)slot;
    share(quant_units(t->M, t->K), 1, part, nparts, &lo, &hi);
    for (int u = lo; u < hi; u++) {
        int r = u % t->M, b0 = u / t->M * QCHUNK, b1 = b0 + QCHUNK < nb ? b0 + QCHUNK : nb;
        int j0 = b0 * BLK, n = (b1 - b0) * BLK;
        const float *x;
        if (t->act) {
            const float *g = t->x + (size_t)r * 2 * t->K + j0, *up = g + t->K;
            float *a = t->scratch + (size_t)r * t->K + j0;
            silu_mul(g, up, a, n);
            x = a;
        } else {
            x = t->x + (size_t)r * t->K + j0;
        }
        size_t at = QS_AT(t->q, r, b0);
        quantize_row(x, n, t->split, t->e->qx + QX_OFF(t->q, r, b0), t->e->sx + at, t->e->zs + at, t->e->is + at,
                     QS_STEP(t->q));
    }
}

static void quantize_into(Engine *e, const float *x, float *scratch, int M, int K, int split, int act, QRows *out) {
    out->qx = e->qx; out->sx = e->sx; out->zs = e->zs; out->is = e->is; out->M = M; out->K = K;
    QuantTask t = {x, scratch, M, K, split, act, out, e};
    pool_run(&e->pool, quant_task, &t, pool_parts(&e->pool, quant_units(M, K)));
}

static void quantize_rows(Engine *e, const float *x, int M, int K, int split, QRows *out) {
    quantize_into(e, x, NULL, M, K, split, 0, out);
}

typedef struct {
    Engine *e; int T, layer;
    const int *pos;          /* [T] each row's position in its own sequence */
    float *const *k, *const *v;  /* [T] each row's cache [L, Hkv, S, Dh] */
    const int *S;            /* [T] each row's cache length */
    const float *qkv;        /* [T, (H + 2 Hkv) Dh], roped */
    float *out;              /* [T, H Dh] */
    int per;                 /* query heads a job (attn_split; < 1: all H / Hkv of a KV head) */
} AttnTask;

/* query heads a job: all of a KV head's, unless that leaves fewer jobs (T Hkv) than threads */
static int attn_split(Engine *e, int T) {
    int group = e->H / e->Hkv, jobs = T * e->Hkv, want = atomic_load(&e->pool.active);
    int split = jobs >= want ? 1 : (want + jobs - 1) / jobs;
    split = split < group ? split : group;
    return (group + split - 1) / split;
}

/* one part's jobs, each a row t and up to `per` query heads of one KV head g: their scores on
   each block of keys while it is in L1, their softmax parts, their weighed values with each V
   row loaded once. Each (t, query head)'s outputs are the operations of that head alone,
   whatever the job split */
static void attn_task(void *arg, int part, int nparts, int slot) {
    const AttnTask *a = arg;
    const Engine *e = a->e;
    int H = e->H, Hkv = e->Hkv, Dh = e->Dh, W = (e->H + 2 * e->Hkv) * Dh, group = e->H / e->Hkv, lo, hi;
    int per = a->per < 1 || a->per > group ? group : a->per, split = (group + per - 1) / per;
    float scale = 1.f / sqrtf((float)Dh), *sc = e->scores + (size_t)slot * SC_SLOT(e);
    share(a->T * Hkv * split, 1, part, nparts, &lo, &hi);
    for (int j = lo; j < hi; j++) {
        /* KV head major: the jobs of a part share its K and V (while in the core's L2) */
        int g = j / (a->T * split), t = j / split % a->T, h0 = j % split * per, n = a->pos[t] + 1;   /* keys 0..pos[t] */
        int nh = group - h0 < per ? group - h0 : per;
        size_t ld = SC_LD(n);
        const float *q = a->qkv + (size_t)t * W + (size_t)(g * group + h0) * Dh;
        size_t at = ((size_t)a->layer * Hkv + g) * a->S[t] * Dh;
        const float *K = a->k[t] + at, *Vv = a->v[t] + at;
        float *sum = sc + nh * ld, *o = a->out + (size_t)t * H * Dh + (size_t)(g * group + h0) * Dh;
        scores_group(q, nh, K, n, Dh, sc, ld);
        softmax_group(sc, ld, nh, n, scale, sum);
        weigh_group(sc, ld, Vv, n, Dh, nh, o);
        for (int h = 0; h < nh; h++) {
            float inv = 1.f / sum[h];
            for (int i = 0; i < Dh; i++) o[h * Dh + i] *= inv;
        }
    }
}

static void matmul(Engine *e, const Proj *w, const QRows *x, float *y) {
    MatmulTask t = {w, x, y, NULL, 0};
    pool_run(&e->pool, matmul_task, &t, pool_parts(&e->pool, (w->N + 15) / 16));
}

/* only the outputs of units[0..n) (UNIT outputs each; all when units is NULL), input row r to
   output row at[r] (at NULL: r); an output's bits are matmul's */
static void matmul_units(Engine *e, const Proj *w, const QRows *x, float *y, const int32_t *units, int n,
                         const int64_t *at) {
    MatmulTask t = {w, x, y, units, n, at};
    pool_run(&e->pool, matmul_task, &t, pool_parts(&e->pool, units ? n : (w->N + 15) / 16));
}

#define SCRATCH_ROWS 64      /* rows a call: a verify's, several sequences', or a prompt chunk */

void *rowstep_new(int L, int D, int H, int Hkv, int Dh, int I, int V, float eps, int threads, int maxpos) {
    Engine *e = calloc(1, sizeof(Engine));
    if (!e) return NULL;
    e->L = L; e->D = D; e->H = H; e->Hkv = Hkv; e->Dh = Dh; e->I = I; e->V = V; e->eps = eps;
    e->nth = threads < 1 ? 1 : threads > MAXT ? MAXT : threads;
    e->maxrows = SCRATCH_ROWS; e->maxpos = maxpos;
    e->attn_norm = calloc(L, sizeof(float *)); e->mlp_norm = calloc(L, sizeof(float *));
    e->qkv = calloc(L, sizeof(Proj)); e->o = calloc(L, sizeof(Proj));
    e->gu = calloc(L, sizeof(Proj)); e->down = calloc(L, sizeof(Proj));
    int wide = (H + 2 * Hkv) * Dh;
    if (2 * I > wide) wide = 2 * I;
    if (D > wide) wide = D;
    e->wide = wide;
    e->x = malloc(sizeof(float) * SCRATCH_ROWS * wide);
    e->y = malloc(sizeof(float) * SCRATCH_ROWS * wide);
    e->big = malloc(sizeof(float) * SCRATCH_ROWS * wide);
    e->att = malloc(sizeof(float) * SCRATCH_ROWS * H * Dh);
    e->scores = malloc(sizeof(float) * (size_t)e->nth * SC_SLOT(e));
    e->qx = malloc(SCRATCH_ROWS * (size_t)wide);
    e->sx = malloc(sizeof(float) * SCRATCH_ROWS * wide / BLK);
    e->zs = malloc(sizeof(float) * SCRATCH_ROWS * wide / BLK);
    e->is = malloc(sizeof(int32_t) * SCRATCH_ROWS * wide / BLK);
    Pool *p = &e->pool;
    p->n = e->nth;
    atomic_store(&p->use, e->nth);
    p->pid = getpid();
    pthread_mutex_init(&p->mu, NULL); pthread_cond_init(&p->cv, NULL);
    for (int i = 1; i < p->n; i++) {
        p->args[i].p = p; p->args[i].tid = i;
        pthread_create(&p->th[i], NULL, worker, &p->args[i]);
    }
    return e;
}

void rowstep_free(void *h) {
    Engine *e = h;
    Pool *p = &e->pool;
    atomic_store(&p->stop, 1);
    pool_active(p, 0);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    for (int i = 0; i < e->L; i++) { free(e->qkv[i].own); free(e->o[i].own); free(e->gu[i].own); free(e->down[i].own); }
    free(e->head.own);
    free(e->attn_norm); free(e->mlp_norm); free(e->qkv); free(e->o); free(e->gu); free(e->down);
    free(e->x); free(e->y); free(e->big); free(e->att); free(e->scores); free(e->qx); free(e->sx); free(e->zs); free(e->is);
    free(e);
}

/* Outputs per weight group of the layout this build reads (rowstep_simd.h): 0, the
   MatMulNBits blobs as they are; GROUP, blocks of GROUP outputs interleaved by 4-byte words. */
int rowstep_layout(void) { return GROUP; }

/* Outputs per unit of a forward's ``units`` (the head's logits computed when only some are
   wanted): an output group of the regrouped layout, else a tile. */
int rowstep_unit(void) { return UNIT; }

/* Threads that take part in the coming forwards (1..threads given at rowstep_new); the
   results do not depend on it. -> the count now in use. */
int rowstep_set_threads(void *h, int n) {
    Engine *e = h;
    n = n < 1 ? 1 : n > e->nth ? e->nth : n;
    atomic_store(&e->pool.use, n);
    return n;
}

/* A projection as this build reads it: the caller's arrays, or with GROUP a regrouped copy
   the engine owns (rowstep_simd.h, gtile: 4-byte words of GROUP outputs side by side, the last
   group padded with zero weights). */
static Proj proj(const void *blob, const float *s, const float *m, const float *bias, int N, int K, int bits) {
    Proj p = {blob, s, m, bias, N, K, bits, NULL};
#if GROUP
    int nb = K / BLK, words = BLK * bits / 32, G = (N + GROUP - 1) / GROUP;
    size_t wbytes = (size_t)G * nb * words * GROUP * 4, fl = (size_t)G * nb * GROUP;
    char *own = aligned_alloc(64, wbytes + 2 * fl * sizeof(float));
    if (!own) return p;         /* the caller sees own == NULL */
    uint32_t *dw = (uint32_t *)own;
    float *ds = (float *)(own + wbytes), *dm = ds + fl;
    const uint32_t *sw = blob;
    memset(own, 0, wbytes + 2 * fl * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int b = 0; b < nb; b++) {
            size_t at = ((size_t)(n / GROUP) * nb + b) * words;
            for (int k = 0; k < words; k++) dw[(at + k) * GROUP + n % GROUP] = sw[((size_t)n * nb + b) * words + k];
            ds[((size_t)(n / GROUP) * nb + b) * GROUP + n % GROUP] = s[(size_t)n * nb + b];
            dm[((size_t)(n / GROUP) * nb + b) * GROUP + n % GROUP] = m[(size_t)n * nb + b];
        }
    p.blob = (const uint8_t *)dw; p.s = ds; p.m = dm; p.own = own;
#endif
    return p;
}

/* -> 0, or -1 when a regrouped copy found no memory (the engine must not run) */
static int set_proj(Proj *to, Proj p) {
    free(to->own);
    *to = p;
    return GROUP && !p.own ? -1 : 0;
}

int rowstep_set_layer(void *h, int i, const float *attn_norm, const float *mlp_norm,
                      const void *qkv_b, const float *qkv_s, const float *qkv_m, const float *qkv_bias,
                      const void *o_b, const float *o_s, const float *o_m, const void *gu_b, const float *gu_s,
                      const float *gu_m, const void *d_b, const float *d_s, const float *d_m) {
    Engine *e = h;
    e->attn_norm[i] = attn_norm; e->mlp_norm[i] = mlp_norm;
    return set_proj(&e->qkv[i], proj(qkv_b, qkv_s, qkv_m, qkv_bias, (e->H + 2 * e->Hkv) * e->Dh, e->D, 4))
         | set_proj(&e->o[i], proj(o_b, o_s, o_m, NULL, e->D, e->H * e->Dh, 4))
         | set_proj(&e->gu[i], proj(gu_b, gu_s, gu_m, NULL, 2 * e->I, e->D, 4))
         | set_proj(&e->down[i], proj(d_b, d_s, d_m, NULL, e->D, e->I, 4));
}

int rowstep_set_head(void *h, const float *final_norm, const void *blob, const float *s, const float *m, int bits) {
    Engine *e = h;
    e->final_norm = final_norm;
    return set_proj(&e->head, proj(blob, s, m, NULL, e->V, e->D, bits));
}

/* the final norm and the head for rows [R] of h: logits [R, V], or row r to logits row at[r]
   (units: see below) */
static void head_rows(Engine *e, const float *h, const int64_t *rows, int R, float *logits, const int64_t *at,
                      const int32_t *units, int U) {
    QRows qr;
    int D = e->D;
    if (R <= 0) return;
    for (int r = 0; r < R; r++) rms_norm_row(h + (size_t)rows[r] * D, e->final_norm, D, e->eps, e->x + (size_t)r * D);
    quantize_rows(e, e->x, R, D, e->head.bits == 4, &qr);
    matmul_units(e, &e->head, &qr, logits, U > 0 ? units : NULL, U, at);           /* [R, V] */
}

/* h [T, D] += down(silu(gate) * up) of each row's norm (the gate's I outputs, then the up's, in
   gu): a layer's MLP with its residual, the drafter's too. Inputs are split for 4-bit weights. */
static void mlp_rows(Engine *e, float *h, int T, int D, const float *norm, float eps, const Proj *gu,
                     const Proj *down, int I) {
    QRows qr;
    for (int t = 0; t < T; t++) rms_norm_row(h + (size_t)t * D, norm, D, eps, e->x + (size_t)t * D);
    quantize_rows(e, e->x, T, D, gu->bits == 4, &qr);
    matmul(e, gu, &qr, e->big);                                                    /* [T, 2I] */
    quantize_into(e, e->big, e->x, T, I, down->bits == 4, 1, &qr);                /* silu(gate) * up */
    matmul(e, down, &qr, e->y);                                                    /* [T, D] */
    for (size_t j = 0; j < (size_t)T * D; j++) h[j] += e->y[j];
}

/* h [T, D] (embedded rows, overwritten with the last layer's output); row t sits at position
   pos[t] of its own sequence, whose cache k[t]/v[t] is [L, Hkv, S[t], Dh]: rows of several
   sequences share the projections, each attends only its own keys 0..pos[t]. A sequence's rows
   come in order. Every row runs the instructions a 1-row forward runs, so its bits do not
   depend on the rows beside it. cos/sin [> max pos, Dh]. taps [L] of output pointers (NULL: not
   wanted), each [T, D]; rows [R] of rows whose logits go to logits [R, V] (R = 0: none);
   units [U] (U > 0), ascending: only the logits of these units of rowstep_unit() ids are
   written, each with the bits a whole head gives it (the others are left as they are).
   Returns 0, or -1 when T or a position does not fit the scratch or its cache. */
int rowstep_forward_rows(void *hd, float *h, int T, const int *pos, float *const *k, float *const *v,
                         const int *S, const float *cos, const float *sin, float **taps, const int64_t *rows,
                         int R, float *logits, const int32_t *units, int U) {
    Engine *e = hd;
    if (T < 1 || T > e->maxrows) return -1;
    for (int t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= S[t] || pos[t] >= e->maxpos) return -1;
    int D = e->D, H = e->H, Hkv = e->Hkv, Dh = e->Dh, I = e->I, W = (H + 2 * Hkv) * Dh;
    QRows qr;
    pool_active(&e->pool, 1);
    for (int i = 0; i < e->L; i++) {
        for (int t = 0; t < T; t++) rms_norm_row(h + (size_t)t * D, e->attn_norm[i], D, e->eps, e->x + (size_t)t * D);
        quantize_rows(e, e->x, T, D, 1, &qr);
        matmul(e, &e->qkv[i], &qr, e->y);                                          /* [T, W] */
        for (int t = 0; t < T; t++) {
            float *row = e->y + (size_t)t * W;
            float *kc = k[t] + (size_t)i * Hkv * S[t] * Dh, *vc = v[t] + (size_t)i * Hkv * S[t] * Dh;
            int p = pos[t];
            for (int hh = 0; hh < H + Hkv; hh++) rope(row + hh * Dh, cos + (size_t)p * Dh, sin + (size_t)p * Dh, Dh);
            for (int g = 0; g < Hkv; g++) {
                memcpy(kc + ((size_t)g * S[t] + p) * Dh, row + (H + g) * Dh, sizeof(float) * Dh);
                memcpy(vc + ((size_t)g * S[t] + p) * Dh, row + (H + Hkv + g) * Dh, sizeof(float) * Dh);
            }
        }
        AttnTask at = {e, T, i, pos, k, v, S, e->y, e->att, attn_split(e, T)};
        int jobs = T * Hkv * ((H / Hkv + at.per - 1) / at.per);
        pool_run(&e->pool, attn_task, &at, pool_parts(&e->pool, jobs));           /* [T, H Dh] */
        quantize_rows(e, e->att, T, H * Dh, 1, &qr);
        matmul(e, &e->o[i], &qr, e->y);                                            /* [T, D] */
        for (size_t j = 0; j < (size_t)T * D; j++) h[j] += e->y[j];
        mlp_rows(e, h, T, D, e->mlp_norm[i], e->eps, &e->gu[i], &e->down[i], I);
        if (taps && taps[i]) memcpy(taps[i], h, sizeof(float) * T * D);
    }
    head_rows(e, h, rows, R, logits, NULL, units, U);
    pool_active(&e->pool, 0);
    return 0;
}

/* The head alone, on rows of h [*, D] that a forward above left: rows [R] -> logits [R, V],
   units as above. The operations rowstep_forward_rows runs for them, so the same bits: a
   shared forward gives each sequence's rows the head (all ids, or only its own) it would get
   alone. at [R] (or NULL: r): the logits row that row r's go to, so heads over different ids
   (a verify's rows inside a string read every id, the others a few) fill one [*, V] array.
   Returns 0, or -1 when R does not fit the scratch. */
int rowstep_head_at(void *hd, const float *h, const int64_t *rows, int R, float *logits, const int64_t *at,
                    const int32_t *units, int U) {
    Engine *e = hd;
    if (R < 0 || R > e->maxrows) return -1;
    pool_active(&e->pool, 1);
    head_rows(e, h, rows, R, logits, at, units, U);
    pool_active(&e->pool, 0);
    return 0;
}

/* One sequence: rows at positions start..start + T - 1 of the cache k/v [L, Hkv, S, Dh]. */
int rowstep_forward(void *hd, float *h, int T, int start, float *k, float *v, int S,
                    const float *cos, const float *sin, float **taps, const int64_t *rows, int R, float *logits,
                    const int32_t *units, int U) {
    int pos[SCRATCH_ROWS], Ss[SCRATCH_ROWS];
    float *ks[SCRATCH_ROWS], *vs[SCRATCH_ROWS];
    if (T < 1 || T > SCRATCH_ROWS) return -1;
    for (int t = 0; t < T; t++) { pos[t] = start + t; ks[t] = k; vs[t] = v; Ss[t] = S; }
    return rowstep_forward_rows(hd, h, T, pos, ks, vs, Ss, cos, sin, taps, rows, R, logits, units, U);
}

/* ---- projections outside the model's layers (a drafter's), on the engine's pool and scratch:
   the same int8 blocks and kernels as a layer's, so a 16-row call runs compute-bound on the
   integer dot products where a framework's small float matmul does not */

/* W [N, K] as MatMulNBits blocks (bits 4 or 8) -> a handle for rowstep_linear, or NULL (no
   memory, or K not whole blocks). The arrays must outlive the handle unless regrouped. */
void *rowstep_proj_new(const void *blob, const float *s, const float *m, int N, int K, int bits) {
    if (N < 1 || K < BLK || K % BLK || (bits != 4 && bits != 8)) return NULL;
    Proj *p = malloc(sizeof(Proj));
    if (!p) return NULL;
    *p = proj(blob, s, m, NULL, N, K, bits);
    if (GROUP && !p->own) { free(p); return NULL; }
    return p;
}

void rowstep_proj_free(void *p) {
    if (p) free(((Proj *)p)->own);
    free(p);
}

/* y [M, N] = x [M, K] W^T for a rowstep_proj_new handle. Returns 0, or -1 when M or K does
   not fit the scratch. */
int rowstep_linear(void *hd, const void *pp, const float *x, int M, float *y) {
    Engine *e = hd;
    const Proj *w = pp;
    if (M < 1 || M > e->maxrows || w->K > e->wide) return -1;
    QRows qr;
    pool_active(&e->pool, 1);
    quantize_rows(e, x, M, w->K, w->bits == 4, &qr);
    matmul(e, w, &qr, y);
    pool_active(&e->pool, 0);
    return 0;
}

#include "rowstep_dflash.h"   /* a DFlash drafter's block and window updates on this engine */
