// hqkv CPU linear layers with int8 weights: y[m, n] = sum_k x[m, k] * w[n, k] * s[n, k / 32].
// Built on first use by hqkv.models.weights (nbs/16a_models.weights.ipynb: the maths, the tests and the
// measurements live there). A decode step reads every weight once, so the product is bound by memory: the
// weights stay int8 (one float32 scale per 32 of a row, as ggml's Q8_0) and are widened to float32 in
// registers, 8 at a time, against float32 activations; a few activation rows share each weight row.
#include <stdint.h>
#include <string.h>
#include <algorithm>
#include <omp.h>

static const int64_t GS = 32;                 // weights per scale

static void rows_portable(const float* x, int64_t M, int64_t K, const int8_t* w, const float* s, int64_t n0, int64_t n1, int64_t N, float* y) {
    for (int64_t n = n0; n < n1; ++n) {
        const int8_t* wn = w + n * K; const float* sn = s + n * (K / GS);
        for (int64_t m = 0; m < M; ++m) {
            const float* xm = x + m * K; float a = 0;
            for (int64_t g = 0; g < K / GS; ++g) {
                float b = 0;
                for (int64_t j = 0; j < GS; ++j) b += (float)wn[g * GS + j] * xm[g * GS + j];
                a += b * sn[g];
            }
            y[m * N + n] = a;
        }
    }
}

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
namespace avx {
static inline float hsum(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x)); x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
// MT activation rows against weight rows [n0, n1); CH accumulators per activation row so that MT * CH FMA chains hide the latency
template<int MT> static void rows(const float* x, int64_t K, const int8_t* w, const float* s, int64_t n0, int64_t n1, int64_t N, float* y) {
    constexpr int CH = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    for (int64_t n = n0; n < n1; ++n) {
        const int8_t* wn = w + n * K; const float* sn = s + n * (K / GS);
        if (n + 2 < n1) for (int64_t o = 0; o < K; o += 64) _mm_prefetch((const char*)(wn + 2 * K + o), _MM_HINT_T0);
        __m256 a[MT][CH];
        for (int m = 0; m < MT; ++m) for (int c = 0; c < CH; ++c) a[m][c] = _mm256_setzero_ps();
        for (int64_t g = 0; g < K / GS; ++g) {
            const __m256 sc = _mm256_broadcast_ss(sn + g);
            for (int c = 0; c < 4; ++c) {
                const int64_t k = g * GS + 8 * c;
                __m256 wv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(wn + k)))), sc);
                for (int m = 0; m < MT; ++m) a[m][c % CH] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k), a[m][c % CH]);
            }
        }
        for (int m = 0; m < MT; ++m) {
            __m256 t = a[m][0];
            for (int c = 1; c < CH; ++c) t = _mm256_add_ps(t, a[m][c]);
            y[m * N + n] = hsum(t);
        }
    }
}
}  // namespace avx
#pragma GCC pop_options

static int g_isa = -1;                        // 1: AVX2 + FMA, 0: portable

extern "C" int hqkv_linear_isa(int want) {    // want: -1 best available, 0 portable, 1 AVX2 (returns -1 if the CPU lacks it)
    __builtin_cpu_init();
    bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (want == 1 && !has) return -1;
    g_isa = want == -1 ? (has ? 1 : 0) : want;
    return g_isa;
}

// x [M, K] float32, w [N, K] int8, s [N, K / 32] float32, y [M, N] float32; K a multiple of 32
extern "C" int hqkv_linear_int8(const float* x, int64_t M, int64_t K, const int8_t* w, const float* s, int64_t N, float* y, int64_t threads) {
    if (K % GS) return 1;
    if (g_isa < 0) hqkv_linear_isa(-1);
    const int64_t NB = 16;                    // weight rows per work item
    const int64_t items = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t n0 = it * NB, n1 = std::min(N, n0 + NB);
        for (int64_t m0 = 0; m0 < M; ) {
            const float* xm = x + m0 * K; float* ym = y + m0 * N;
            if (g_isa != 1) { rows_portable(xm, M - m0, K, w, s, n0, n1, N, ym); break; }
            const int64_t left = M - m0;
            if (left >= 4) { avx::rows<4>(xm, K, w, s, n0, n1, N, ym); m0 += 4; }
            else if (left >= 2) { avx::rows<2>(xm, K, w, s, n0, n1, N, ym); m0 += 2; }
            else { avx::rows<1>(xm, K, w, s, n0, n1, N, ym); m0 += 1; }
        }
    }
    return 0;
}

// w [N, K] int8, s [N, K / 32] -> out [N, K] float32 (rows [n0, n1) only): for products with many activation rows, which are
// compute-bound and go to torch's matrix product a block of rows at a time
extern "C" int hqkv_linear_dequant(const int8_t* w, const float* s, int64_t K, int64_t n0, int64_t n1, float* out, int64_t threads) {
    if (K % GS) return 1;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = 0; k < K; ++k) out[(n - n0) * K + k] = (float)w[n * K + k] * s[n * (K / GS) + k / GS];
    return 0;
}
