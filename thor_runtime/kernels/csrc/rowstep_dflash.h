/* A DFlash drafter's forwards on the engine's pool and scratch (included by rowstep.c):
   speculative/dflash_model.py's math with its projections on the 8-bit blocks RowLinear uses.

   Why: a propose in torch is ~150 small operations and ~20 projection calls around 16 rows,
   each paying a framework's dispatch; here a block is one call and a window update another.
   Drafts only decide which tokens the target verifies, never which it commits.

   The window's K/V live as [L, 2, Hkv, S, Dh] (S = the window's W slots plus a block's B): the
   entries in slots 0..n-1 (any order: the block's attention is not causal and RoPE holds the
   positions), the block's own rows in slots n..n+B-1 while it runs. Laid out so, layer i's keys
   are "layer 2i" and its values "layer 2i" of an array Hkv S Dh further on, which is the cache
   layout the target's attention task reads: every block row attends keys 0..n+B-1. */
#ifndef ROWSTEP_DFLASH_H
#define ROWSTEP_DFLASH_H

typedef struct {
    const float *in_norm, *post_norm, *q_norm, *k_norm;      /* [D], [D], [Dh], [Dh] */
    const Proj *qkv, *kv, *o, *gu, *down;                    /* kv: k and v alone (window entries) */
} DLayer;

typedef struct {
    int L, D, H, Hkv, Dh, I;
    float eps;
    const Proj *fc;
    const float *hidden_norm, *final_norm;
    DLayer *layer;
} Drafter;

void *rowstep_dflash_new(int L, int D, int H, int Hkv, int Dh, int I, float eps, const void *fc,
                         const float *hidden_norm, const float *final_norm) {
    Drafter *d = calloc(1, sizeof(Drafter));
    if (!d) return NULL;
    d->layer = calloc(L, sizeof(DLayer));
    if (!d->layer) { free(d); return NULL; }
    d->L = L; d->D = D; d->H = H; d->Hkv = Hkv; d->Dh = Dh; d->I = I; d->eps = eps;
    d->fc = fc; d->hidden_norm = hidden_norm; d->final_norm = final_norm;
    return d;
}

void rowstep_dflash_set_layer(void *dd, int i, const float *in_norm, const float *post_norm, const float *q_norm,
                              const float *k_norm, const void *qkv, const void *kv, const void *o, const void *gu,
                              const void *down) {
    DLayer *l = &((Drafter *)dd)->layer[i];
    l->in_norm = in_norm; l->post_norm = post_norm; l->q_norm = q_norm; l->k_norm = k_norm;
    l->qkv = qkv; l->kv = kv; l->o = o; l->gu = gu; l->down = down;
}

void rowstep_dflash_free(void *dd) {
    Drafter *d = dd;
    if (d) free(d->layer);
    free(d);
}

/* whether the engine's scratch and attention take this drafter: the same head layout as the
   engine's model (the attention task reads H, Hkv and Dh from the engine), widths within a row */
int rowstep_dflash_fits(void *hd, void *dd) {
    Engine *e = hd;
    Drafter *d = dd;
    int wq = (d->H + 2 * d->Hkv) * d->Dh;
    return d->H == e->H && d->Hkv == e->Hkv && d->Dh == e->Dh && d->D <= e->wide && wq <= e->wide
           && 2 * d->I <= e->wide && d->fc->K <= e->wide;
}

/* k_norm (q_norm) per head and RoPE at position p, in place on nh heads of Dh */
static void dflash_heads(float *x, int nh, int Dh, const float *norm, float eps, const float *cos,
                         const float *sin, int p) {
    for (int h = 0; h < nh; h++) {
        rms_norm_row(x + h * Dh, norm, Dh, eps, x + h * Dh);
        rope(x + h * Dh, cos + (size_t)p * Dh, sin + (size_t)p * Dh, Dh);
    }
}

/* k [Hkv Dh] and v [Hkv Dh] of one row into slot s of layer i's window arrays */
static void dflash_store(const Drafter *d, float *kv, int S, int i, int s, const float *k, const float *v) {
    int Hkv = d->Hkv, Dh = d->Dh;
    for (int g = 0; g < Hkv; g++) {
        memcpy(kv + (((size_t)(2 * i) * Hkv + g) * S + s) * Dh, k + g * Dh, sizeof(float) * Dh);
        memcpy(kv + (((size_t)(2 * i + 1) * Hkv + g) * S + s) * Dh, v + g * Dh, sizeof(float) * Dh);
    }
}

/* New window entries: raw target taps [n, fc->K] of the tokens at positions pos[n] -> their
   features (fc, hidden_norm) into feats rows slots[r] ([*, D]) and every layer's K (k_norm,
   RoPE) and V into slots[r] of kv [L, 2, Hkv, S, Dh]. Returns 0, or -1 when n does not fit. */
int rowstep_dflash_append(void *hd, void *dd, const float *raw, int n, const int *pos, const int *slots,
                          float *kv, int S, float *feats, const float *cos, const float *sin) {
    Engine *e = hd;
    Drafter *d = dd;
    if (n < 1 || n > e->maxrows) return -1;
    int D = d->D, Dh = d->Dh, Hkv = d->Hkv, wkv = 2 * Hkv * Dh;
    QRows qr;
    pool_active(&e->pool, 1);
    quantize_rows(e, raw, n, d->fc->K, 0, &qr);
    matmul(e, d->fc, &qr, e->y);                                                   /* [n, D] */
    for (int r = 0; r < n; r++) {
        rms_norm_row(e->y + (size_t)r * D, d->hidden_norm, D, d->eps, e->x + (size_t)r * D);
        memcpy(feats + (size_t)slots[r] * D, e->x + (size_t)r * D, sizeof(float) * D);
    }
    quantize_rows(e, e->x, n, D, 0, &qr);                 /* every layer's K/V read these features */
    for (int i = 0; i < d->L; i++) {
        const DLayer *l = &d->layer[i];
        matmul(e, l->kv, &qr, e->big);                                             /* [n, 2 Hkv Dh] */
        for (int r = 0; r < n; r++) {
            float *row = e->big + (size_t)r * wkv;
            dflash_heads(row, Hkv, Dh, l->k_norm, d->eps, cos, sin, pos[r]);
            dflash_store(d, kv, S, i, slots[r], row, row + Hkv * Dh);
        }
    }
    pool_active(&e->pool, 0);
    return 0;
}

/* One block: h [B, D] (the anchor's and the mask token's embeddings) at positions p0..p0+B-1
   over the window's n entries -> h, final-normed, in place. Returns 0, or -1 when B or the
   window does not fit. */
int rowstep_dflash_block(void *hd, void *dd, float *h, int B, int p0, float *kv, int S, int n,
                         const float *cos, const float *sin) {
    Engine *e = hd;
    Drafter *d = dd;
    if (B < 1 || B > e->maxrows || B > SCRATCH_ROWS || n < 0 || n + B > S || n + B > e->maxpos) return -1;
    int D = d->D, H = d->H, Hkv = d->Hkv, Dh = d->Dh, I = d->I, W = (H + 2 * Hkv) * Dh;
    int last[SCRATCH_ROWS], Ss[SCRATCH_ROWS];
    float *ks[SCRATCH_ROWS], *vs[SCRATCH_ROWS];
    for (int t = 0; t < B; t++) {
        last[t] = n + B - 1;                          /* not causal: every row reads every key */
        ks[t] = kv; vs[t] = kv + (size_t)Hkv * S * Dh; Ss[t] = S;
    }
    QRows qr;
    pool_active(&e->pool, 1);
    for (int i = 0; i < d->L; i++) {
        const DLayer *l = &d->layer[i];
        for (int t = 0; t < B; t++) rms_norm_row(h + (size_t)t * D, l->in_norm, D, d->eps, e->x + (size_t)t * D);
        quantize_rows(e, e->x, B, D, 0, &qr);
        matmul(e, l->qkv, &qr, e->y);                                              /* [B, W] */
        for (int t = 0; t < B; t++) {
            float *row = e->y + (size_t)t * W;
            dflash_heads(row, H, Dh, l->q_norm, d->eps, cos, sin, p0 + t);
            dflash_heads(row + H * Dh, Hkv, Dh, l->k_norm, d->eps, cos, sin, p0 + t);
            dflash_store(d, kv, S, i, n + t, row + H * Dh, row + (H + Hkv) * Dh);
        }
        AttnTask at = {e, B, 2 * i, last, ks, vs, Ss, e->y, e->att, attn_split(e, B)};
        int jobs = B * Hkv * ((H / Hkv + at.per - 1) / at.per);
        pool_run(&e->pool, attn_task, &at, pool_parts(&e->pool, jobs));           /* [B, H Dh] */
        quantize_rows(e, e->att, B, H * Dh, 0, &qr);
        matmul(e, l->o, &qr, e->y);                                                /* [B, D] */
        for (size_t j = 0; j < (size_t)B * D; j++) h[j] += e->y[j];
        mlp_rows(e, h, B, D, l->post_norm, d->eps, l->gu, l->down, I);
    }
    for (int t = 0; t < B; t++) rms_norm_row(h + (size_t)t * D, d->final_norm, D, d->eps, h + (size_t)t * D);
    pool_active(&e->pool, 0);
    return 0;
}

#endif
