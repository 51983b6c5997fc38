/* The peer of benchmarks/moe_decode.py: the routed-expert MLP of one decode step on ggml's CPU
 * backend, as llama.cpp runs it (MUL_MAT_ID gate/up, SwiGLU, MUL_MAT_ID down, affinity scale;
 * the final sum over the K experts, a few adds, is left out).  Weights live in the CPU
 * backend's "extra" (repacked) buffer type when it has one for the type (MXFP4 on AVX2), else
 * in a plain CPU buffer; one persistent ggml threadpool.  Built by benchmarks/peer_moe.sh
 * against a ggml build outside this repository and loaded with ctypes; never part of the
 * package.
 *
 * API: peer_new(type, E, H, I, layers, threads, seed) -> handle; peer_tokens(h, T, K) builds
 * the graphs for T tokens; peer_run(h, layer, ids (T*K int32), weights (T*K f32)) -> seconds;
 * peer_expert_bytes(h) -> bytes of one expert's gate/up + down as ggml stores them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#define MAXL 16

typedef struct {
    int E, H, I, L, K, T;
    enum ggml_type type;
    ggml_backend_t be;
    struct ggml_threadpool *tp;
    struct ggml_context *wctx, *gctx;
    ggml_backend_buffer_t wbuf, gbuf;
    struct ggml_tensor *gu[MAXL], *dn[MAXL], *x, *ids, *w;
    struct ggml_cgraph *gf[MAXL];
    uint64_t rng;
} peer;

static uint32_t rnd(peer *p) {
    p->rng ^= p->rng << 13; p->rng ^= p->rng >> 7; p->rng ^= p->rng << 17;
    return (uint32_t)(p->rng >> 16);
}

/* Random but well-formed blocks: scales in realistic ranges, codes uniform. */
static void fill(peer *p, struct ggml_tensor *t) {
    const size_t n = ggml_nbytes(t);
    uint8_t *h = malloc(n);
    for (size_t i = 0; i < n; ++i) h[i] = (uint8_t)rnd(p);
    if (t->type == GGML_TYPE_MXFP4)      /* 17 B: E8M0 scale, 16 B codes */
        for (size_t b = 0; b < n; b += 17) h[b] = (uint8_t)(118 + rnd(p) % 5);
    else if (t->type == GGML_TYPE_NVFP4) /* 36 B: 4 UE4M3 scales, 32 B codes */
        for (size_t b = 0; b < n; b += 36) for (int j = 0; j < 4; ++j) h[b + j] = (uint8_t)(0x30 + rnd(p) % 24);
    else if (t->type == GGML_TYPE_Q8_0)  /* 34 B: fp16 scale, 32 int8 */
        for (size_t b = 0; b < n; b += 34) { h[b] = 0x1F; h[b + 1] = 0x21; }
    else if (t->type == GGML_TYPE_BF16)  /* small normal values */
        for (size_t i = 0; i < n; i += 2) { uint16_t v = (uint16_t)((rnd(p) & 0x807F) | ((115 + rnd(p) % 8) << 7)); memcpy(h + i, &v, 2); }
    ggml_backend_tensor_set(t, h, 0, n);
    free(h);
}

static ggml_backend_buffer_type_t weight_buft(enum ggml_type type) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get && type == GGML_TYPE_MXFP4)
        for (ggml_backend_buffer_type_t *b = get(dev); b && *b; ++b) return *b;  /* CPU_REPACK */
    return ggml_backend_cpu_buffer_type();
}

void *peer_new(int type, int E, int H, int I, int layers, int threads, uint64_t seed) {
    if (layers < 1 || layers > MAXL) return NULL;
    peer *p = calloc(1, sizeof(peer));
    p->type = (enum ggml_type)type; p->E = E; p->H = H; p->I = I; p->L = layers; p->rng = seed | 1;
    struct ggml_init_params ip = {ggml_tensor_overhead() * (2 * MAXL + 4), NULL, true};
    p->wctx = ggml_init(ip);
    for (int l = 0; l < layers; ++l) {
        p->gu[l] = ggml_new_tensor_3d(p->wctx, p->type, H, 2 * I, E);
        p->dn[l] = ggml_new_tensor_3d(p->wctx, p->type, I, H, E);
    }
    p->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(p->wctx, weight_buft(p->type));
    if (!p->wbuf) { ggml_free(p->wctx); free(p); return NULL; }
    ggml_backend_buffer_set_usage(p->wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int l = 0; l < layers; ++l) { fill(p, p->gu[l]); fill(p, p->dn[l]); }
    p->be = ggml_backend_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    p->tp = ggml_threadpool_new(&tpp);
    ggml_backend_cpu_set_n_threads(p->be, threads);
    ggml_backend_cpu_set_threadpool(p->be, p->tp);
    return p;
}

int peer_tokens(void *h, int T, int K) {
    peer *p = h;
    if (p->gctx) { ggml_backend_buffer_free(p->gbuf); ggml_free(p->gctx); p->gctx = NULL; }
    p->T = T; p->K = K;
    struct ggml_init_params ip = {ggml_tensor_overhead() * (16 * MAXL + 8) + ggml_graph_overhead() * MAXL, NULL, true};
    p->gctx = ggml_init(ip);
    p->x = ggml_new_tensor_3d(p->gctx, GGML_TYPE_F32, p->H, 1, T);
    p->ids = ggml_new_tensor_2d(p->gctx, GGML_TYPE_I32, K, T);
    p->w = ggml_new_tensor_3d(p->gctx, GGML_TYPE_F32, 1, K, T);
    for (int l = 0; l < p->L; ++l) {
        struct ggml_tensor *gu = ggml_mul_mat_id(p->gctx, p->gu[l], p->x, p->ids);   /* [2I, K, T] */
        struct ggml_tensor *a = ggml_swiglu(p->gctx, gu);                             /* [I, K, T] */
        struct ggml_tensor *dn = ggml_mul_mat_id(p->gctx, p->dn[l], a, p->ids);     /* [H, K, T] */
        struct ggml_tensor *y = ggml_mul(p->gctx, dn, p->w);
        p->gf[l] = ggml_new_graph(p->gctx);
        ggml_build_forward_expand(p->gf[l], y);
    }
    p->gbuf = ggml_backend_alloc_ctx_tensors(p->gctx, p->be);
    if (!p->gbuf) return -1;
    float *xs = malloc(sizeof(float) * (size_t)p->H * T);
    for (size_t i = 0; i < (size_t)p->H * T; ++i) xs[i] = (float)(rnd(p) % 2001) / 1000.0f - 1.0f;
    ggml_backend_tensor_set(p->x, xs, 0, ggml_nbytes(p->x));
    free(xs);
    return 0;
}

double peer_run(void *h, int layer, const int32_t *ids, const float *w) {
    peer *p = h;
    struct timespec a, b;
    ggml_threadpool_resume(p->tp);  /* untimed: the pool polls for work from here, as between graphs in serving */
    clock_gettime(CLOCK_MONOTONIC, &a);
    ggml_backend_tensor_set(p->ids, ids, 0, ggml_nbytes(p->ids));
    ggml_backend_tensor_set(p->w, w, 0, ggml_nbytes(p->w));
    if (ggml_backend_graph_compute(p->be, p->gf[layer % p->L]) != GGML_STATUS_SUCCESS) return -1.0;
    clock_gettime(CLOCK_MONOTONIC, &b);
    /* Untimed: park the pool. Left polling, its threads would spin on the cores while our kernels
     * run next in the interleaved benchmark (measured: ours 1.7-1.8x slower at 2 threads). */
    ggml_threadpool_pause(p->tp);
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

int64_t peer_expert_bytes(void *h) {
    peer *p = h;
    return (int64_t)((ggml_nbytes(p->gu[0]) + ggml_nbytes(p->dn[0])) / (size_t)p->E);
}
