/* kernelslot native: the read-bandwidth probe (the limit the benchmarks compare against).
 *
 * ks_probe_read streams n bytes with the kernels' own thread pool (ks_pool.c) by one of several
 * methods: vector width (64-bit scalar, 128 SSE2, 256 AVX2, 512 AVX-512F), 1-4 sequential
 * streams per thread (each thread's slice cut into `streams` parts read side by side) and a
 * software-prefetch distance (0: none; else bytes ahead of each stream, one prefetcht0 per line).
 * The checksum is the sum mod 2^64 of the buffer's 64-bit words, whatever the method, so a test
 * can check that every byte was read once.  ks_probe_alloc gives a 2 MiB-aligned buffer, with
 * madvise(MADV_HUGEPAGE) or MADV_NOHUGEPAGE, written once (never-written pages would all be the
 * shared zero page and read from cache).  One source, every width compiled with a per-function
 * target attribute and chosen at run time (no per-ISA object).
 */
#include "ks_native.h"
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KS_PROBE_STEP 256   /* bytes per stream per loop iteration: 4 cache lines */
#define KS_PROBE_ALIGN (2L << 20)

typedef uint64_t (*probe_fn)(const uint8_t *p, int64_t per, int pfd);

/* One stream group: S streams of `per` bytes each (per % KS_PROBE_STEP == 0), side by side. */
#define PROBE_PF(q, pfd)                                                                  \
    do {                                                                                  \
        if (pfd)                                                                          \
            for (int l_ = 0; l_ < KS_PROBE_STEP; l_ += 64) __builtin_prefetch((q) + (pfd) + l_, 0, 3); \
    } while (0)

#define DEF_PROBE(NAME, S, TGT, VT, LOAD, ADD, ZERO, VB, FOLD)                               \
    TGT static uint64_t NAME(const uint8_t *p, int64_t per, int pfd) {                        \
        VT a0 = ZERO, a1 = ZERO, a2 = ZERO, a3 = ZERO;                                        \
        for (int64_t i = 0; i < per; i += KS_PROBE_STEP) {                                    \
            for (int s = 0; s < (S); ++s) {                                                   \
                const uint8_t *q = p + s * per + i;                                           \
                PROBE_PF(q, pfd);                                                             \
                for (int j = 0; j < KS_PROBE_STEP; j += 4 * (VB)) {                          \
                    a0 = ADD(a0, LOAD(q + j));                                                \
                    a1 = ADD(a1, LOAD(q + j + (VB)));                                         \
                    a2 = ADD(a2, LOAD(q + j + 2 * (VB)));                                     \
                    a3 = ADD(a3, LOAD(q + j + 3 * (VB)));                                     \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        a0 = ADD(ADD(a0, a1), ADD(a2, a3));                                                   \
        return FOLD(a0);                                                                      \
    }

/* scalar (every machine) */
static inline uint64_t ld64(const uint8_t *q) { uint64_t v; memcpy(&v, q, 8); return v; }
#define ADD64(a, b) ((a) + (b))
#define ID64(a) (a)
DEF_PROBE(probe64_1, 1, , uint64_t, ld64, ADD64, 0, 8, ID64)
DEF_PROBE(probe64_2, 2, , uint64_t, ld64, ADD64, 0, 8, ID64)
DEF_PROBE(probe64_3, 3, , uint64_t, ld64, ADD64, 0, 8, ID64)
DEF_PROBE(probe64_4, 4, , uint64_t, ld64, ADD64, 0, 8, ID64)

#if defined(__x86_64__)
#define T128 __attribute__((target("sse2")))
#define T256 __attribute__((target("avx2")))
#define T512 __attribute__((target("avx512f")))
#define LD128(q) _mm_load_si128((const __m128i *)(q))
#define LD256(q) _mm256_load_si256((const __m256i *)(q))
#define LD512(q) _mm512_load_si512((const void *)(q))
T128 static inline uint64_t fold128(__m128i a) {
    return (uint64_t)_mm_cvtsi128_si64(a) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a));
}
T256 static inline uint64_t fold256(__m256i a) {
    uint64_t w[4];
    _mm256_storeu_si256((__m256i *)w, a);
    return w[0] + w[1] + w[2] + w[3];
}
T512 static inline uint64_t fold512(__m512i a) {
    uint64_t w[8];
    _mm512_storeu_si512((void *)w, a);
    return w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6] + w[7];
}
DEF_PROBE(probe128_1, 1, T128, __m128i, LD128, _mm_add_epi64, _mm_setzero_si128(), 16, fold128)
DEF_PROBE(probe128_2, 2, T128, __m128i, LD128, _mm_add_epi64, _mm_setzero_si128(), 16, fold128)
DEF_PROBE(probe128_3, 3, T128, __m128i, LD128, _mm_add_epi64, _mm_setzero_si128(), 16, fold128)
DEF_PROBE(probe128_4, 4, T128, __m128i, LD128, _mm_add_epi64, _mm_setzero_si128(), 16, fold128)
DEF_PROBE(probe256_1, 1, T256, __m256i, LD256, _mm256_add_epi64, _mm256_setzero_si256(), 32, fold256)
DEF_PROBE(probe256_2, 2, T256, __m256i, LD256, _mm256_add_epi64, _mm256_setzero_si256(), 32, fold256)
DEF_PROBE(probe256_3, 3, T256, __m256i, LD256, _mm256_add_epi64, _mm256_setzero_si256(), 32, fold256)
DEF_PROBE(probe256_4, 4, T256, __m256i, LD256, _mm256_add_epi64, _mm256_setzero_si256(), 32, fold256)
DEF_PROBE(probe512_1, 1, T512, __m512i, LD512, _mm512_add_epi64, _mm512_setzero_si512(), 64, fold512)
DEF_PROBE(probe512_2, 2, T512, __m512i, LD512, _mm512_add_epi64, _mm512_setzero_si512(), 64, fold512)
DEF_PROBE(probe512_3, 3, T512, __m512i, LD512, _mm512_add_epi64, _mm512_setzero_si512(), 64, fold512)
DEF_PROBE(probe512_4, 4, T512, __m512i, LD512, _mm512_add_epi64, _mm512_setzero_si512(), 64, fold512)
#endif

/* 1 when this CPU can run the probe at `width` bits (64, 128, 256, 512). */
int ks_probe_width_supported(int width) {
    if (width == 64) return 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (width == 128) return 1;
    if (width == 256) return __builtin_cpu_supports("avx2") ? 1 : 0;
    if (width == 512) return __builtin_cpu_supports("avx512f") ? 1 : 0;
#endif
    return 0;
}

static probe_fn probe_pick(int width, int streams) {
    static const probe_fn f64[4] = {probe64_1, probe64_2, probe64_3, probe64_4};
    if (streams < 1 || streams > 4 || !ks_probe_width_supported(width)) return NULL;
    if (width == 64) return f64[streams - 1];
#if defined(__x86_64__)
    static const probe_fn f128[4] = {probe128_1, probe128_2, probe128_3, probe128_4};
    static const probe_fn f256[4] = {probe256_1, probe256_2, probe256_3, probe256_4};
    static const probe_fn f512[4] = {probe512_1, probe512_2, probe512_3, probe512_4};
    if (width == 128) return f128[streams - 1];
    if (width == 256) return f256[streams - 1];
    if (width == 512) return f512[streams - 1];
#endif
    return NULL;
}

typedef struct {
    const uint8_t *p;
    int64_t chunk;       /* bytes per thread, a multiple of streams * KS_PROBE_STEP */
    int streams, pfd;
    probe_fn fn;
    uint64_t sum[64];
} probe_job;

static void probe_slice(void *arg, int tid, int nth) {
    (void)nth;
    probe_job *j = (probe_job *)arg;
    j->sum[tid] = j->fn(j->p + j->chunk * tid, j->chunk / j->streams, j->pfd);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read n bytes at p (64-byte aligned, n % 256 == 0) with nthreads pool threads by the method
 * (width, streams, prefetch bytes); *checksum = sum of the 64-bit words mod 2^64, *seconds = the
 * wall time of the read (the pool is woken untimed first).  Each thread reads one contiguous
 * slice; the tail that does not divide evenly is read by the caller afterwards, timed.
 * Returns 0, -1 (bad argument) or -4 (width not supported on this CPU). */
int ks_probe_read(const uint8_t *p, int64_t n, int nthreads, int width, int streams, int prefetch,
                  uint64_t *checksum, double *seconds) {
    if (!p || n < 0 || n % KS_PROBE_STEP || ((uintptr_t)p & 63) || nthreads < 1 || nthreads > 64 ||
        streams < 1 || streams > 4 || prefetch < 0 || prefetch > (1 << 20) || !checksum || !seconds)
        return -1;
    probe_fn fn = probe_pick(width, streams), tail = probe_pick(width, 1);
    if (!fn) return ks_probe_width_supported(width) ? -1 : -4;
    probe_job job;
    memset(&job, 0, sizeof job);
    const int64_t unit = (int64_t)streams * KS_PROBE_STEP;
    job.p = p; job.chunk = n / nthreads / unit * unit; job.streams = streams; job.pfd = prefetch; job.fn = fn;
    ks_pool_warm(nthreads);
    ks_pool_lock();
    const double t0 = now_s();
    if (job.chunk) ks_pool_run(probe_slice, &job, nthreads);
    const int64_t done = job.chunk * nthreads;
    uint64_t s = done < n ? tail(p + done, n - done, prefetch) : 0;
    const double t1 = now_s();
    ks_pool_unlock();
    for (int t = 0; t < nthreads && job.chunk; ++t) s += job.sum[t];
    *checksum = s;
    *seconds = t1 - t0;
    return 0;
}

/* A buffer of n bytes for the probe: 2 MiB-aligned, madvise(MADV_HUGEPAGE) when huge else
 * MADV_NOHUGEPAGE (Linux), every 64-bit word i set to i * 0x9E3779B97F4A7C15 (so every page is
 * backed).  NULL when out of memory.  Free with ks_probe_free. */
void *ks_probe_alloc(int64_t n, int huge) {
    if (n <= 0) return NULL;
    const size_t size = ((size_t)n + KS_PROBE_ALIGN - 1) / KS_PROBE_ALIGN * KS_PROBE_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, KS_PROBE_ALIGN, size)) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)huge;
#endif
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < size / 8; ++i) w[i] = (uint64_t)i * 0x9E3779B97F4A7C15ULL;
    return p;
}

void ks_probe_free(void *p) { free(p); }
