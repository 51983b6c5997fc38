/* The peer of benchmarks/moe_decode.py: the routed-expert MLP of one decode step on ggml's CPU
 * backend, as llama.cpp runs it (MUL_MAT_ID gate/up, SwiGLU, MUL_MAT_ID down, affinity scale;
 * the final sum over the K experts, a few adds, is left out).  Weights live in the CPU
 * backend's "extra" (repacked) buffer type when it has one for the type (MXFP4 on AVX2), else
 * in a plain CPU buffer; one persistent ggml threadpool.  Built by benchmarks/peer_moe.sh
 * against a ggml build outside this repository and loaded with ctypes; never part of the
 * package.
 *
 * API (shared with ik_moe_peer.c): peer_type_for(format) -> the ggml type this peer runs for one
 * of "mxfp4", "nvfp4", "mxfp8", "bf16" (-1: none); peer_new(type, E, H, I, layers, threads, seed)
 * -> handle; peer_tokens(h, T, K) builds the graphs for T tokens; peer_run(h, layer, ids (T*K
 * int32), weights (T*K f32)) -> seconds; peer_check(h) -> relative L2 error of its output against
 * a double reference (peer_common.h); peer_describe(h) -> the types and layout it runs;
 * peer_expert_bytes(h) -> bytes of one expert's gate/up + down as ggml stores them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#define KS_PEER_HAS_NVFP4
#include "peer_common.h"

#define MAXL 16

typedef struct {
    int E, H, I, L, K, T;
    enum ggml_type type;
    ggml_backend_t be;
    struct ggml_threadpool *tp;
    struct ggml_context *wctx, *gctx;
    ggml_backend_buffer_t wbuf, gbuf;
    struct ggml_tensor *gu[MAXL], *dn[MAXL], *y[MAXL], *x, *ids, *w;
    struct ggml_cgraph *gf[MAXL];
    ks_check_mat cg, cu, cd;  /* layer 0's first experts as filled (gate, up, down) */
    int repacked;
    uint64_t rng;
} peer;

/* Fill t (copying its first experts into *copy as filled, before any repack by the buffer). */
static void fill(peer *p, struct ggml_tensor *t, ks_check_mat *copy, ks_check_mat *copy2, int64_t row0_2) {
    const size_t n = ggml_nbytes(t);
    uint8_t *h = malloc(n);
    ks_fill_bytes(&p->rng, t->type, h, n);
    if (copy) ks_check_copy(copy, h, t, 0);
    if (copy2) ks_check_copy(copy2, h, t, row0_2);
    ggml_backend_tensor_set(t, h, 0, n);
    free(h);
}

int peer_type_for(const char *fmt) {
    if (!strcmp(fmt, "mxfp4")) return GGML_TYPE_MXFP4;
    if (!strcmp(fmt, "nvfp4")) return GGML_TYPE_NVFP4;
    if (!strcmp(fmt, "mxfp8")) return GGML_TYPE_Q8_0;  /* the closest 8-bit type */
    if (!strcmp(fmt, "bf16")) return GGML_TYPE_BF16;
    return -1;
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

static char describe_buf[256];

const char *peer_describe(void *h) {
    peer *p = h;
    snprintf(describe_buf, sizeof describe_buf, "ggml %s%s, MUL_MAT_ID gate/up (one %dx%d tensor) + SWIGLU + MUL_MAT_ID down",
             ggml_type_name(p->type), p->repacked ? " in the CPU_REPACK buffer" : " (plain layout)", p->H, 2 * p->I);
    return describe_buf;
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
    ggml_backend_buffer_type_t buft = weight_buft(p->type);
    p->repacked = buft != ggml_backend_cpu_buffer_type();
    p->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(p->wctx, buft);
    if (!p->wbuf) { ggml_free(p->wctx); free(p); return NULL; }
    ggml_backend_buffer_set_usage(p->wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int l = 0; l < layers; ++l) {  /* ggml_swiglu: silu of the first half (gate), times the second (up) */
        fill(p, p->gu[l], l ? NULL : &p->cg, l ? NULL : &p->cu, I);
        fill(p, p->dn[l], l ? NULL : &p->cd, NULL, 0);
    }
    if (!p->cg.raw || !p->cu.raw || !p->cd.raw) return NULL;
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
        p->y[l] = y;
        p->gf[l] = ggml_new_graph(p->gctx);
        ggml_build_forward_expand(p->gf[l], y);
    }
    p->gbuf = ggml_backend_alloc_ctx_tensors(p->gctx, p->be);
    if (!p->gbuf) return -1;
    float *xs = malloc(sizeof(float) * (size_t)p->H * T);
    for (size_t i = 0; i < (size_t)p->H * T; ++i) xs[i] = (float)(ks_rnd(&p->rng) % 2001) / 1000.0f - 1.0f;
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
    return ks_seconds(&a, &b);
}

double peer_check(void *h) {
    peer *p = h;
    const int T = p->T, K = p->K, nt = T < KS_CHECK_TOKENS ? T : KS_CHECK_TOKENS;
    int32_t *ids = malloc(sizeof(int32_t) * T * K);
    float *w = malloc(sizeof(float) * T * K), *x = malloc(ggml_nbytes(p->x)), *y = malloc(ggml_nbytes(p->y[0]));
    ks_check_routing(T, K, ids, w);
    double err = INFINITY;
    if (peer_run(h, 0, ids, w) >= 0) {
        ggml_backend_tensor_get(p->x, x, 0, ggml_nbytes(p->x));
        ggml_backend_tensor_get(p->y[0], y, 0, ggml_nbytes(p->y[0]));
        ggml_to_float_t tf = ggml_get_type_traits(p->type)->to_float;
        err = ks_check_error(&p->cg, &p->cu, &p->cd, tf, tf, p->H, p->I, K, nt, x, w, y);
    }
    free(ids); free(w); free(x); free(y);
    return err;
}

int64_t peer_expert_bytes(void *h) {
    peer *p = h;
    return (int64_t)((ggml_nbytes(p->gu[0]) + ggml_nbytes(p->dn[0])) / (size_t)p->E);
}
