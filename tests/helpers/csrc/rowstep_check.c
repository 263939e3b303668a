/* A self-check of csrc/rowstep.c on a random tiny model, for any CPU the kernel compiles for
   (tests/thor_runtime/kernels/test_rowstep.py runs it natively and, where a cross compiler and
   qemu are installed, as aarch64 code). Verifies rows against 1-row steps bit for bit, then prints the logits of
   the last step and a projection's outputs (rowstep_linear), one per line, for the test to
   compare across builds. Exit 0: rows equal, a verify asked for some units of the head's
   outputs writes those with the same bits and leaves every other logit as it was, a head
   through a row map writes each row's logits where the map says with the same bits, and a
   projection's rows have the same bits alone and together. I = 288: the MLP's activations
   quantized in chunks of 8 blocks, the last one short; T = 10: a verify past one 8-row tile. */
#include <stdio.h>
#include "../../../thor_runtime/kernels/csrc/rowstep.c"

enum { L = 2, D = 64, H = 4, HKV = 2, DH = 64, I = 288, V = 80, S = 32, START = 3, T = 10, W = (H + 2 * HKV) * DH };

static uint32_t rng = 12345;
static float urand(void) { rng = rng * 1664525u + 1013904223u; return (float)(rng >> 8) / 16777216.f - 0.5f; }

static void fill_proj(uint8_t *blob, float *s, float *m, int N, int K, int bits) {
    for (int i = 0; i < N * K * bits / 8; i++) { rng = rng * 1664525u + 1013904223u; blob[i] = (uint8_t)(rng >> 13); }
    for (int i = 0; i < N * K / 32; i++) { s[i] = 0.02f + 0.01f * urand(); m[i] = bits == 4 ? -8 * s[i] + 0.01f * urand() : -128 * s[i]; }
}

int main(void) {
    static uint8_t bq[L][W * D / 2], bo[L][D * H * DH / 2], bg[L][2 * I * D / 2], bd[L][D * I / 2], bh[V * D];
    static float sq[L][2][W * D / 32], so[L][2][D * H * DH / 32], sg[L][2][2 * I * D / 32], sd[L][2][D * I / 32], sh[2][V * D / 32];
    static float norm[D], bias[W], cosv[S * DH], sinv[S * DH], k1[L * HKV * S * DH], v1[L * HKV * S * DH];
    static float k2[L * HKV * S * DH], v2[L * HKV * S * DH], h0[START + T][D], hs[D * T], ls[T][V], lv[T][V];
    static float k3[L * HKV * S * DH], v3[L * HKV * S * DH], lu[T][V];
    void *e = rowstep_new(L, D, H, HKV, DH, I, V, 1e-6f, 2, S);
    for (int i = 0; i < D; i++) norm[i] = 1.f + 0.1f * urand();
    for (int i = 0; i < W; i++) bias[i] = 0.1f * urand();
    for (int p = 0; p < S; p++)
        for (int j = 0; j < DH; j++) {
            float a = p * powf(10000.f, -(float)(2 * (j % (DH / 2))) / DH);
            cosv[p * DH + j] = cosf(a); sinv[p * DH + j] = sinf(a);
        }
    for (int l = 0; l < L; l++) {
        fill_proj(bq[l], sq[l][0], sq[l][1], W, D, 4); fill_proj(bo[l], so[l][0], so[l][1], D, H * DH, 4);
        fill_proj(bg[l], sg[l][0], sg[l][1], 2 * I, D, 4); fill_proj(bd[l], sd[l][0], sd[l][1], D, I, 4);
        rowstep_set_layer(e, l, norm, norm, bq[l], sq[l][0], sq[l][1], bias, bo[l], so[l][0], so[l][1],
                          bg[l], sg[l][0], sg[l][1], bd[l], sd[l][0], sd[l][1]);
    }
    fill_proj(bh, sh[0], sh[1], V, D, 8);
    rowstep_set_head(e, norm, bh, sh[0], sh[1], 8);
    for (int t = 0; t < START + T; t++) for (int i = 0; i < D; i++) h0[t][i] = urand();
    int64_t all[T], zero = 0;
    for (int t = 0; t < T; t++) all[t] = t;
    static float start_rows[START * D];
    memcpy(start_rows, h0, sizeof start_rows);
    rowstep_forward(e, start_rows, START, 0, k1, v1, S, cosv, sinv, NULL, NULL, 0, NULL, NULL, 0);
    memcpy(start_rows, h0, sizeof start_rows);
    rowstep_forward(e, start_rows, START, 0, k2, v2, S, cosv, sinv, NULL, NULL, 0, NULL, NULL, 0);
    memcpy(start_rows, h0, sizeof start_rows);
    rowstep_forward(e, start_rows, START, 0, k3, v3, S, cosv, sinv, NULL, NULL, 0, NULL, NULL, 0);
    for (int t = 0; t < T; t++) {                                   /* 1-row steps */
        float row[D];
        memcpy(row, h0[START + t], sizeof row);
        if (rowstep_forward(e, row, 1, START + t, k1, v1, S, cosv, sinv, NULL, &zero, 1, ls[t], NULL, 0)) return 2;
    }
    memcpy(hs, h0[START], sizeof(float) * D * T);                    /* one verify of T rows */
    if (rowstep_forward(e, hs, T, START, k2, v2, S, cosv, sinv, NULL, all, T, &lv[0][0], NULL, 0)) return 2;
    int same = !memcmp(ls, lv, sizeof ls);
    int32_t units[2] = {1, V / rowstep_unit() - 1};                  /* the second and the last unit */
    for (int t = 0; t < T; t++) for (int i = 0; i < V; i++) lu[t][i] = -1e30f;
    memcpy(hs, h0[START], sizeof(float) * D * T);
    if (rowstep_forward(e, hs, T, START, k3, v3, S, cosv, sinv, NULL, all, T, &lu[0][0], units, 2)) return 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < V; i++) {
            int u = i / rowstep_unit(), read = u == units[0] || u == units[1];
            same &= read ? !memcmp(&lu[t][i], &lv[t][i], sizeof(float)) : lu[t][i] == -1e30f;
        }
    for (int l = 0; l < L; l++)
        for (int g = 0; g < HKV; g++) {
            size_t at = ((size_t)(l * HKV + g) * S) * DH;
            same &= !memcmp(k1 + at, k2 + at, sizeof(float) * (START + T) * DH);
            same &= !memcmp(v1 + at, v2 + at, sizeof(float) * (START + T) * DH);
        }
    /* the head again on rows {5, 0, 3} the forward left in hs, into logits rows {2, 6, 0} */
    static float lm[T][V];
    int64_t from[3] = {5, 0, 3}, to[3] = {2, 6, 0};
    for (int t = 0; t < T; t++) for (int i = 0; i < V; i++) lm[t][i] = -1e30f;
    if (rowstep_head_at(e, hs, from, 3, &lm[0][0], to, NULL, 0)) return 2;
    for (int t = 0; t < T; t++) {
        int r = t == 2 ? 5 : t == 6 ? 0 : t == 0 ? 3 : -1;
        for (int i = 0; i < V; i++) same &= r >= 0 ? !memcmp(&lm[t][i], &lv[r][i], sizeof(float)) : lm[t][i] == -1e30f;
    }
    /* a projection outside the layers: 5 rows together, then each alone */
    enum { PN = 48, PK = 64, PM = 5 };
    static uint8_t pb[PN * PK];
    static float ps[PN * PK / 32], pm[PN * PK / 32], px[PM][PK], py[PM][PN], p1[PN];
    fill_proj(pb, ps, pm, PN, PK, 8);
    for (int r = 0; r < PM; r++) for (int i = 0; i < PK; i++) px[r][i] = urand();
    void *pj = rowstep_proj_new(pb, ps, pm, PN, PK, 8);
    if (!pj || rowstep_linear(e, pj, &px[0][0], PM, &py[0][0])) return 2;
    for (int r = 0; r < PM; r++) {
        if (rowstep_linear(e, pj, px[r], 1, p1)) return 2;
        same &= !memcmp(p1, py[r], sizeof p1);
    }
    rowstep_proj_free(pj);
    for (int i = 0; i < V; i++) printf("%.7g\n", ls[T - 1][i]);
    for (int i = 0; i < PN; i++) printf("%.7g\n", py[PM - 1][i]);
    rowstep_free(e);
    fprintf(stderr, same ? "rows equal steps\n" : "rows differ from steps\n");
    return same ? 0 : 1;
}
