/* The ik_llama.cpp peer of benchmarks/moe_decode.py: the routed-expert MLP of one decode step on
 * ik_llama.cpp's ggml CPU backend as `llama-server -rtr` (run-time repack) runs it: the weights
 * repacked by iqk_repack_tensor to its row-interleaved types (MXFP4 -> MXFP4_R8, Q8_0 ->
 * Q8_0_R8, BF16 -> BF16_R16, IQ4_NL -> IQ4_NL_R4), its fused MoE op ggml_moe_up_gate (gate and
 * up as two tensors, SiLU) then MUL_MAT_ID down and the affinity scale.  NVFP4 is run as IQ4_NL
 * (ik has no NVFP4; IQ4_NL is its closest 4-bit type, 4.5 bits per weight).  Threads: the CPU
 * backend's n_threads on OpenMP (ik has no threadpool API); the OpenMP team is started untimed
 * before each timed call and paused (omp_pause_resource_all) after it, or its spinning threads
 * would slow our next interleaved call.  Built by benchmarks/peer_moe.sh against an ik build
 * outside this repository; same C API as ggml_moe_peer.c.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include "peer_common.h"

void iqk_repack_tensor(struct ggml_tensor *tensor);  /* ik's ggml/src/iqk/iqk_quantize.h (not installed) */

#define MAXL 16

typedef struct {
    int E, H, I, L, K, T, threads;
    enum ggml_type type;
    ggml_backend_t be;
    struct ggml_context *wctx, *gctx;
    ggml_backend_buffer_t wbuf, gbuf;
    struct ggml_tensor *up[MAXL], *gate[MAXL], *dn[MAXL], *y[MAXL], *x, *ids, *w;
    struct ggml_cgraph *gf[MAXL];
    ks_check_mat cg, cu, cd;  /* layer 0's first experts as filled, before the repack */
    enum ggml_type run_type;  /* after iqk_repack_tensor */
    uint64_t rng;
} peer;

int peer_type_for(const char *fmt) {
    if (!strcmp(fmt, "mxfp4")) return GGML_TYPE_MXFP4;
    if (!strcmp(fmt, "nvfp4")) return GGML_TYPE_IQ4_NL;  /* no NVFP4 in ik: its nearest 4-bit type */
    if (!strcmp(fmt, "mxfp8")) return GGML_TYPE_Q8_0;
    if (!strcmp(fmt, "bf16")) return GGML_TYPE_BF16;
    return -1;
}

static void fill(peer *p, struct ggml_tensor *t, ks_check_mat *copy) {
    const size_t n = ggml_nbytes(t);
    uint8_t *h = malloc(n);
    ks_fill_bytes(&p->rng, t->type, h, n);
    if (copy) ks_check_copy(copy, h, t, 0);
    ggml_backend_tensor_set(t, h, 0, n);
    free(h);
    iqk_repack_tensor(t);  /* in place (CPU buffer), as -rtr does at load time */
}

static char describe_buf[256];

const char *peer_describe(void *h) {
    peer *p = h;
    snprintf(describe_buf, sizeof describe_buf, "ik_llama.cpp %s repacked to %s, ggml_moe_up_gate (SiLU) + MUL_MAT_ID down, OpenMP",
             ggml_type_name(p->type), ggml_type_name(p->run_type));
    return describe_buf;
}

void *peer_new(int type, int E, int H, int I, int layers, int threads, uint64_t seed) {
    if (layers < 1 || layers > MAXL) return NULL;
    peer *p = calloc(1, sizeof(peer));
    p->type = (enum ggml_type)type; p->E = E; p->H = H; p->I = I; p->L = layers; p->rng = seed | 1;
    p->threads = threads;
    struct ggml_init_params ip = {ggml_tensor_overhead() * (3 * MAXL + 4), NULL, true};
    p->wctx = ggml_init(ip);
    for (int l = 0; l < layers; ++l) {
        p->up[l] = ggml_new_tensor_3d(p->wctx, p->type, H, I, E);
        p->gate[l] = ggml_new_tensor_3d(p->wctx, p->type, H, I, E);
        p->dn[l] = ggml_new_tensor_3d(p->wctx, p->type, I, H, E);
    }
    p->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(p->wctx, ggml_backend_cpu_buffer_type());
    if (!p->wbuf) { ggml_free(p->wctx); free(p); return NULL; }
    ggml_backend_buffer_set_usage(p->wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int l = 0; l < layers; ++l) {
        fill(p, p->gate[l], l ? NULL : &p->cg);
        fill(p, p->up[l], l ? NULL : &p->cu);
        fill(p, p->dn[l], l ? NULL : &p->cd);
    }
    if (!p->cg.raw || !p->cu.raw || !p->cd.raw) return NULL;
    p->run_type = p->dn[0]->type;
    p->be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(p->be, threads);
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
        struct ggml_tensor *a = ggml_moe_up_gate(p->gctx, p->up[l], p->gate[l], p->x, p->ids, GGML_UNARY_OP_SILU); /* [I, K, T] */
        struct ggml_tensor *dn = ggml_mul_mat_id(p->gctx, p->dn[l], a, p->ids);                                    /* [H, K, T] */
        p->y[l] = ggml_mul(p->gctx, dn, p->w);
        p->gf[l] = ggml_new_graph(p->gctx);
        ggml_build_forward_expand(p->gf[l], p->y[l]);
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
    if (p->threads > 1) {  /* untimed: start the OpenMP team; it spins for the timed call, as between graphs in serving */
#pragma omp parallel num_threads(p->threads)
        { (void)0; }
    }
    clock_gettime(CLOCK_MONOTONIC, &a);
    ggml_backend_tensor_set(p->ids, ids, 0, ggml_nbytes(p->ids));
    ggml_backend_tensor_set(p->w, w, 0, ggml_nbytes(p->w));
    const int rc = ggml_backend_graph_compute(p->be, p->gf[layer % p->L]);
    clock_gettime(CLOCK_MONOTONIC, &b);
    omp_pause_resource_all(omp_pause_soft);  /* untimed: park the team (else it spins into our next call) */
    return rc == GGML_STATUS_SUCCESS ? ks_seconds(&a, &b) : -1.0;
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
        ggml_to_float_t tf = ggml_internal_get_type_traits(p->type).to_float;
        err = ks_check_error(&p->cg, &p->cu, &p->cd, tf, tf, p->H, p->I, K, nt, x, w, y);
    }
    free(ids); free(w); free(x); free(y);
    return err;
}

int64_t peer_expert_bytes(void *h) {
    peer *p = h;
    return (int64_t)((ggml_nbytes(p->up[0]) + ggml_nbytes(p->gate[0]) + ggml_nbytes(p->dn[0])) / (size_t)p->E);
}
