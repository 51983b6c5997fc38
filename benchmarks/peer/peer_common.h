/* Shared by the two peer harnesses (ggml_moe_peer.c: upstream ggml; ik_moe_peer.c: ik_llama.cpp):
 * the random weight fill and the reference check of a peer's output.  Header-only, included once
 * per harness after ggml.h; never part of the package.
 *
 * The check: the first KS_CHECK_EXPERTS experts of layer 0 are copied as filled (before any
 * repack); peer_check routes token t to experts (t + k) % KS_CHECK_EXPERTS, runs the peer's
 * graph, and compares its per-(token, k) outputs with w * down_e(silu(gate_e x) * up_e x)
 * computed in double from the copies dequantised by the type's to_float.  It returns the relative
 * L2 error over the first min(T, 2) tokens.
 */
#ifndef KS_PEER_COMMON_H
#define KS_PEER_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KS_CHECK_EXPERTS 4
#define KS_CHECK_TOKENS 2

static uint32_t ks_rnd(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

/* Random but well-formed blocks of `type` (n bytes at h): scales in realistic ranges, codes
 * uniform (Q8_0 codes in [-127, 127]: ik_llama.cpp's kernels assume no -128). */
static void ks_fill_bytes(uint64_t *s, enum ggml_type type, uint8_t *h, size_t n) {
    for (size_t i = 0; i < n; ++i) h[i] = (uint8_t)ks_rnd(s);
    if (type == GGML_TYPE_MXFP4)            /* 17 B: E8M0 scale, 16 B codes */
        for (size_t b = 0; b < n; b += 17) h[b] = (uint8_t)(118 + ks_rnd(s) % 5);
#ifdef KS_PEER_HAS_NVFP4
    else if (type == GGML_TYPE_NVFP4)       /* 36 B: 4 UE4M3 scales, 32 B codes */
        for (size_t b = 0; b < n; b += 36) for (int j = 0; j < 4; ++j) h[b + j] = (uint8_t)(0x30 + ks_rnd(s) % 24);
#endif
    else if (type == GGML_TYPE_Q8_0)        /* 34 B: fp16 scale, 32 int8 */
        for (size_t b = 0; b < n; b += 34) {
            h[b] = 0x1F; h[b + 1] = 0x21;
            for (int j = 2; j < 34; ++j) if (h[b + j] == 0x80) h[b + j] = 0x81;
        }
    else if (type == GGML_TYPE_IQ4_NL)      /* 18 B: fp16 scale, 16 B codes */
        for (size_t b = 0; b < n; b += 18) { h[b] = 0x1F; h[b + 1] = 0x1D; }
    else if (type == GGML_TYPE_BF16)        /* small normal values */
        for (size_t i = 0; i < n; i += 2) {
            uint16_t v = (uint16_t)((ks_rnd(s) & 0x807F) | ((115 + ks_rnd(s) % 8) << 7));
            memcpy(h + i, &v, 2);
        }
}

/* One weight matrix of the check: row r of expert e is raw + e * expert_bytes + (row0 + r) * row_bytes. */
typedef struct {
    uint8_t *raw;
    size_t expert_bytes, row_bytes;
    int64_t row0;
} ks_check_mat;

typedef void (*ks_to_float_fn)(const void *x, float *y, int64_t k);

/* Copy the first KS_CHECK_EXPERTS experts of t from `host` (t's bytes as filled). */
static void ks_check_copy(ks_check_mat *m, const uint8_t *host, const struct ggml_tensor *t, int64_t row0) {
    m->expert_bytes = t->nb[2];
    m->row_bytes = t->nb[1];
    m->row0 = row0;
    m->raw = malloc(m->expert_bytes * KS_CHECK_EXPERTS);
    if (m->raw) memcpy(m->raw, host, m->expert_bytes * KS_CHECK_EXPERTS);
}

/* y = M_e x (rows outputs, K inputs), dequantising each row. */
static void ks_ref_matvec(const ks_check_mat *m, ks_to_float_fn tf, int e, int64_t rows, int64_t K,
                          const double *x, double *y, float *tmp) {
    for (int64_t r = 0; r < rows; ++r) {
        tf(m->raw + (size_t)e * m->expert_bytes + (size_t)(m->row0 + r) * m->row_bytes, tmp, K);
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += (double)tmp[j] * x[j];
        y[r] = acc;
    }
}

/* Relative L2 error of the peer's outputs y (H floats per (token, k), k fastest) against the
 * reference, for tokens t < nt routed to experts (t + k) % KS_CHECK_EXPERTS with weights w. */
static double ks_check_error(const ks_check_mat *gate, const ks_check_mat *up, const ks_check_mat *down,
                             ks_to_float_fn tf_gu, ks_to_float_fn tf_dn, int H, int I, int K, int nt,
                             const float *x, const float *w, const float *y) {
    double *xd = malloc(sizeof(double) * H), *g = malloc(sizeof(double) * I), *u = malloc(sizeof(double) * I);
    double *out = malloc(sizeof(double) * H);
    float *tmp = malloc(sizeof(float) * (H > I ? H : I));
    double num = 0, den = 0;
    for (int t = 0; t < nt; ++t) {
        for (int j = 0; j < H; ++j) xd[j] = x[(size_t)t * H + j];
        for (int k = 0; k < K; ++k) {
            const int e = (t + k) % KS_CHECK_EXPERTS;
            ks_ref_matvec(gate, tf_gu, e, I, H, xd, g, tmp);
            ks_ref_matvec(up, tf_gu, e, I, H, xd, u, tmp);
            for (int i = 0; i < I; ++i) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ks_ref_matvec(down, tf_dn, e, H, I, g, out, tmp);
            const float *yy = y + ((size_t)t * K + k) * H;
            const double c = w[t * K + k];
            for (int h = 0; h < H; ++h) {
                const double d = yy[h] - c * out[h];
                num += d * d;
                den += c * out[h] * c * out[h];
            }
        }
    }
    free(xd); free(g); free(u); free(out); free(tmp);
    return den > 0 ? sqrt(num / den) : INFINITY;
}

/* The routing of the check call. */
static void ks_check_routing(int T, int K, int32_t *ids, float *w) {
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) { ids[t * K + k] = (t + k) % KS_CHECK_EXPERTS; w[t * K + k] = 0.5f + 0.125f * k; }
}

static double ks_seconds(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}
#endif
