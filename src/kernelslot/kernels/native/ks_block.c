/* kernelslot native: the whole MoE decode block (moe.block_tkg) in one call, T <= 64.
 *
 * Same contract as kernels/moe_block/orchestrator.py:
 *   s   = x + residual, rounded to the I/O dtype (written to out_residual);  no residual: s = x
 *   h   = s * rsqrt(mean(s^2) + eps) * gamma                                  (fp32)
 *   l   = h . Wr^T + router_bias                                              (router_logits)
 *   pre-norm:  scores = act(l) over E, select on scores + correction, chosen = scores[top-K]
 *   post-norm: select on l + correction, chosen = act(l[top-K]) over the K (softmax or sigmoid)
 *   norm_topk_prob: chosen /= sum(chosen)        (also for sigmoid post-norm: docs/moe_block.md)
 *   ties: the lower expert index wins; ids outside this rank's [rank*E_L, (rank+1)*E_L) skip
 *   out = rsf * sum_routed c * expert(h) + [sigmoid(h . g)] * shared(h),  c = chosen or 1
 * Both strategies of the torch block reduce to the routed set with these coefficients, so the
 * native block always runs the grouped (selective) kernels.  fp32 throughout.
 */
#include "ks_native.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t hidden, num_experts, num_local, rank_id, top_k;
    int32_t softmax;          /* 1 softmax, 0 sigmoid */
    int32_t pre_norm, norm_topk, post_scale, quant_act, shared_quant_act;
    float routed_scaling;
    const float *gamma;       /* (H,) */
    const float *router_w;    /* (E, H) fp32 */
    const float *router_bias, *correction_bias;  /* (E,) or NULL */
    const ks_experts *experts;
    const ks_act *act;
    const ks_experts *shared;  /* or NULL */
    const ks_act *shared_act;
    const float *shared_gate;  /* (H,) or NULL */
} ks_block;

int ks_moe_experts(const ks_experts *ex, const ks_act *act, const float *h, int64_t T,
                   const int32_t *ids, const float *wts, int64_t K, int post_scale, int quant_act,
                   float *out, int nthreads, int isa);

static float bf16_round(float v) { /* round to nearest even, NaN kept */
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) u |= 0x00400000u;
    else u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&v, &u, 4);
    return v;
}

static float load_io(const void *p, int64_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static float dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

static void softmax(const float *l, float *o, int n) {
    float m = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n; ++i) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; ++i) { o[i] = expf(l[i] - m); sum += o[i]; }
    for (int i = 0; i < n; ++i) o[i] /= sum;
}

/* One token's routing: ids (global, best first) and coefficients. */
static void route(const ks_block *b, const float *logits, float *scores, float *sel, int32_t *ids, float *coef) {
    const int E = b->num_experts, K = b->top_k;
    if (b->pre_norm) {
        if (b->softmax) softmax(logits, scores, E);
        else for (int e = 0; e < E; ++e) scores[e] = sigmoidf(logits[e]);
    } else {
        memcpy(scores, logits, sizeof(float) * (size_t)E);
    }
    for (int e = 0; e < E; ++e) sel[e] = scores[e] + (b->correction_bias ? b->correction_bias[e] : 0.0f);
    for (int k = 0; k < K; ++k) { /* stable descending selection: lower index wins ties */
        int best = -1;
        for (int e = 0; e < E; ++e)
            if (sel[e] == sel[e] && (best < 0 || sel[e] > sel[best])) best = e;
        if (best < 0) best = k;  /* every score NaN: the output is NaN whichever expert runs */
        ids[k] = best;
        coef[k] = scores[best];
        sel[best] = NAN;         /* taken */
    }
    if (!b->pre_norm) {
        if (b->softmax) { float t[KS_GROUP_MAX]; softmax(coef, t, K); memcpy(coef, t, sizeof(float) * (size_t)K); }
        else for (int k = 0; k < K; ++k) coef[k] = sigmoidf(coef[k]);
    }
    if (b->norm_topk) {
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s += coef[k];
        for (int k = 0; k < K; ++k) coef[k] /= s;
    }
}

/* The router GEMV as a pool phase: thread tid scores experts [E*tid/nth, E*(tid+1)/nth) for
 * every token (each logit is one fixed-order dot, so the thread count never changes a bit). */
typedef struct { const ks_block *b; const float *h; float *logits; int64_t T; } router_job;

static void router_phase(void *arg, int tid, int nth) {
    const router_job *j = (const router_job *)arg;
    const ks_block *b = j->b;
    const int64_t H = b->hidden, E = b->num_experts;
    for (int64_t e = E * tid / nth; e < E * (tid + 1) / nth; ++e)
        for (int64_t t = 0; t < j->T; ++t)
            j->logits[t * E + e] = dot(j->h + t * H, b->router_w + e * H, H) + (b->router_bias ? b->router_bias[e] : 0.0f);
}

/* out (T, H) fp32 = the block output; out_residual (T, H) in the I/O dtype when residual is
 * given; router_logits (T, E) fp32 when non-NULL.  x and residual contiguous (T, H), bf16 when
 * io_bf16 else fp32.  Returns 0 or the ks_moe_experts error codes. */
int ks_moe_block(const ks_block *b, const void *x, const void *residual, int64_t T, int io_bf16, float eps,
                 float *out, void *out_residual, float *router_logits, int nthreads, int isa) {
    if (!b || !x || !out || T < 1 || T > KS_GROUP_MAX) return -1;
    const int64_t H = b->hidden;
    const int E = b->num_experts, K = b->top_k, EL = b->num_local;
    if (K < 1 || K > E || K > KS_GROUP_MAX || H % KS_KBLOCK) return -1;
    float *h = malloc(sizeof(float) * (size_t)(T * H)), *logits = malloc(sizeof(float) * (size_t)(T * E));
    float *scratch = malloc(sizeof(float) * (size_t)(2 * E)), *coef = malloc(sizeof(float) * (size_t)(T * K));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
    float *shared = b->shared ? calloc((size_t)(T * H), sizeof(float)) : NULL;
    int rc = 0;
    if (!h || !logits || !scratch || !coef || !ids || (b->shared && !shared)) { rc = -3; goto done; }
    for (int64_t t = 0; t < T; ++t) {
        float *ht = h + t * H;
        double ss = 0.0;
        for (int64_t i = 0; i < H; ++i) {
            float v = load_io(x, t * H + i, io_bf16);
            if (residual) {
                v += load_io(residual, t * H + i, io_bf16);
                if (io_bf16) v = bf16_round(v);
                if (out_residual) {
                    if (io_bf16) { uint32_t u; memcpy(&u, &v, 4); ((uint16_t *)out_residual)[t * H + i] = (uint16_t)(u >> 16); }
                    else ((float *)out_residual)[t * H + i] = v;
                }
            }
            ht[i] = v;
            ss += (double)v * v;
        }
        const float inv = 1.0f / sqrtf((float)(ss / (double)H) + eps);
        for (int64_t i = 0; i < H; ++i) ht[i] = ht[i] * inv * b->gamma[i];
    }
    float *lg = router_logits ? router_logits : logits;
    router_job job = {b, h, lg, T};
    const int nth = nthreads < 1 ? 1 : nthreads > E ? E : nthreads;
    ks_pool_lock();
    ks_pool_run(router_phase, &job, nth);
    ks_pool_unlock();
    for (int64_t t = 0; t < T; ++t) {
        route(b, lg + t * E, scratch, scratch + E, ids + t * K, coef + t * K);
        for (int k = 0; k < K; ++k) { /* global -> local ids of this rank */
            const int loc = ids[t * K + k] - b->rank_id * EL;
            ids[t * K + k] = loc >= 0 && loc < EL ? loc : -1;
        }
    }
    memset(out, 0, sizeof(float) * (size_t)(T * H));
    rc = ks_moe_experts(b->experts, b->act, h, T, ids, coef, K, b->post_scale, b->quant_act, out, nthreads, isa);
    if (rc) goto done;
    if (b->routed_scaling != 1.0f)
        for (int64_t i = 0; i < T * H; ++i) out[i] *= b->routed_scaling;
    if (b->shared) {
        for (int64_t t = 0; t < T; ++t) { ids[t] = 0; coef[t] = 1.0f; }
        rc = ks_moe_experts(b->shared, b->shared_act, h, T, ids, coef, 1, 1, b->shared_quant_act, shared, nthreads, isa);
        if (rc) goto done;
        for (int64_t t = 0; t < T; ++t) {
            const float g = b->shared_gate ? sigmoidf(dot(h + t * H, b->shared_gate, H)) : 1.0f;
            for (int64_t i = 0; i < H; ++i) out[t * H + i] += b->shared_gate ? shared[t * H + i] * g : shared[t * H + i];
        }
    }
done:
    free(h); free(logits); free(scratch); free(coef); free(ids); free(shared);
    return rc;
}
