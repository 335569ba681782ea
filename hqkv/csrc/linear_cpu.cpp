// hqkv CPU linear layers with int8, int4, bf16 or float32 weights: y[m, n] = sum_k x[m, k] * w[n, k] * s[n, k / 32] (float32: no s).
// Built on first use by hqkv.models.weights (nbs/16a_models.weights.ipynb: the maths, the tests and the
// measurements live there). A decode step reads every weight once, so the product is bound by memory.
// int8: the weights (one float32 scale per 32 of a row, as ggml's Q8_0) are widened to float32 in registers,
// 8 at a time, against the float32 activations as they are (integer products against int8 activations, as llama.cpp's, were
// ~8% faster in a step's products, a probe, and cost Gemma 3 270M a KLD of 0.014 against float32 weights in a bench run of
// commit dd50513 not kept: 16a). int4 (ggml's Q4_1: w = d q + m, q in 0..15, a float32 scale and min
// per 32): the activations are quantized once per call to int8 per block of 32 and the products are integer
// (u8 x s8 pairs summed by maddubs), one float multiply-add per block. bf16 (on CPUs with AVX512-BF16 only): the activations rounded
// to bf16 once per call, native bf16 dot products summed in float32. float32: as int8 without the widening (torch's one-row
// product read 13-19 GB/s on an EPYC, this one 24-32: 16a, linear_f32.json). A few activation rows share each weight row.
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include <omp.h>

static const int64_t GS = 32;                 // weights per scale

// the activation of a gated MLP (1: SiLU, 2: GELU, tanh approximation), by the formulas torch's CPU kernels use
static inline float act_f(int64_t act, float v) {
    if (act == 1) return v / (1.0f + expf(-v));
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));   // sqrt(2 / pi)
}

// a layer's input as its product reads it. nw (its RMS norm's weight, or null): each row x / sqrt(mean(x^2) + eps) * nw, as
// torch's rms_norm. act (a gated MLP's down projection, or 0): each row of x is [gate | up], K values each (the row 2K long),
// and the input act(gate) * up
static const float* norm_rows(const float* x, int64_t M, int64_t K, const float* nw, float eps, std::vector<float>& buf, int64_t act = 0) {
    if (act) {
        buf.resize(M * K);
        for (int64_t m = 0; m < M; ++m)
            for (int64_t k = 0; k < K; ++k) buf[m * K + k] = act_f(act, x[m * 2 * K + k]) * x[m * 2 * K + K + k];
        return buf.data();
    }
    if (!nw) return x;
    buf.resize(M * K);
    for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * K; float ss = 0;
        for (int64_t k = 0; k < K; ++k) ss += xm[k] * xm[k];
        const float r = 1.0f / sqrtf(ss / (float)K + eps);
        for (int64_t k = 0; k < K; ++k) buf[m * K + k] = xm[k] * r * nw[k];
    }
    return buf.data();
}

// y[m, n] += res[m, n] for weight rows [n0, n1) (a residual connection added where the product is written; res null: none)
static inline void add_res(const float* res, int64_t M, int64_t N, int64_t n0, int64_t n1, float* y) {
    if (res) for (int64_t m = 0; m < M; ++m) for (int64_t n = n0; n < n1; ++n) y[m * N + n] += res[m * N + n];
}

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

// ---------------------------------------------------------------- int4
// a block of 32 weights is 16 bytes: byte j holds q of weight j in its low nibble and q of weight j + 16 in its high one
struct XQ { std::vector<int8_t> q; std::vector<float> d, c; };   // activations [M, K] as int8, per block: scale, scale * sum(q)
// per block of 32: scale max|x| / 127, round to nearest. With nw: each row first RMS-normalized, x / sqrt(mean(x^2) + eps) * nw
// (the layer's norm before its products, as torch's rms_norm computes it)
// per block of 32: scale max|x| / 127, round to nearest; with nw, the rows RMS-normalized first (norm_rows)
static void quant_x(const float* x, int64_t M, int64_t K, XQ& o, const float* nw = nullptr, float eps = 0, int64_t act = 0) {
    const int64_t G = K / GS;
    std::vector<float> buf; x = norm_rows(x, M, K, nw, eps, buf, act);
    o.q.resize(M * K); o.d.resize(M * G); o.c.resize(M * G);
    for (int64_t b = 0; b < M * G; ++b) {
        const float* xb = x + b * GS; float amax = 0;
        for (int j = 0; j < GS; ++j) amax = std::max(amax, fabsf(xb[j]));
        const float d = amax / 127, inv = amax > 0 ? 127 / amax : 0; int32_t sum = 0;
        for (int j = 0; j < GS; ++j) { int v = (int)nearbyintf(xb[j] * inv); v = std::min(127, std::max(-127, v)); o.q[b * GS + j] = (int8_t)v; sum += v; }
        o.d[b] = d; o.c[b] = d * (float)sum;
    }
}
static void rows4_portable(const XQ& xq, int64_t M, int64_t K, const uint8_t* w, const float* s, const float* mn, int64_t n0, int64_t n1, int64_t N, float* y) {
    const int64_t G = K / GS;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wn = w + n * (K / 2); const float* sn = s + n * G; const float* mnn = mn + n * G;
        for (int64_t m = 0; m < M; ++m) {
            float a = 0;
            for (int64_t g = 0; g < G; ++g) {
                const uint8_t* b = wn + 16 * g; const int8_t* xb = xq.q.data() + m * K + g * GS; int32_t t = 0;
                for (int j = 0; j < 16; ++j) t += (b[j] & 15) * xb[j] + (b[j] >> 4) * xb[j + 16];
                a += sn[g] * xq.d[m * G + g] * (float)t + mnn[g] * xq.c[m * G + g];
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
// int4: MT activation rows (xq rows m0..) against weight rows [n0, n1); per block the nibbles -> 32 bytes (0..15), maddubs with the
// int8 activations, pairs summed to int32, one FMA with the two scales; the mins come in once per output, sum_g m[g] d_x[g] sum(q_x)
template<int MT> static void rows4(const XQ& xq, int64_t m0, int64_t K, const uint8_t* w, const float* s, const float* mn, int64_t n0, int64_t n1, int64_t N, float* y) {
    constexpr int CH = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    const int64_t G = K / GS;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int8_t* xr = xq.q.data() + m0 * K; const float* dr = xq.d.data() + m0 * G; const float* cr = xq.c.data() + m0 * G;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wn = w + n * (K / 2); const float* sn = s + n * G; const float* mnn = mn + n * G;
        if (n + 2 < n1) for (int64_t o = 0; o < K / 2; o += 64) _mm_prefetch((const char*)(wn + K + o), _MM_HINT_T0);
        __m256 a[MT][CH];
        for (int m = 0; m < MT; ++m) for (int c = 0; c < CH; ++c) a[m][c] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const __m128i b = _mm_loadu_si128((const __m128i*)(wn + 16 * g));
            const __m256i wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), low);
            for (int m = 0; m < MT; ++m) {
                const __m256i xv = _mm256_loadu_si256((const __m256i*)(xr + m * K + g * GS));
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
                a[m][g % CH] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sn[g] * dr[m * G + g]), a[m][g % CH]);
            }
        }
        for (int m = 0; m < MT; ++m) {
            __m256 t = a[m][0];
            for (int c = 1; c < CH; ++c) t = _mm256_add_ps(t, a[m][c]);
            __m256 cv = _mm256_setzero_ps(); int64_t g = 0;         // sum_g m[g] * c[m, g]: the mins
            for (; g + 8 <= G; g += 8) cv = _mm256_fmadd_ps(_mm256_loadu_ps(mnn + g), _mm256_loadu_ps(cr + m * G + g), cv);
            float off = hsum(cv);
            for (; g < G; ++g) off += mnn[g] * cr[m * G + g];
            y[m * N + n] = hsum(t) + off;
        }
    }
}
// float32 weights: MT activation rows against weight rows [n0, n1), as rows<MT> without the widening and the scales (any K:
// the last K % 8 products in scalar code)
template<int MT> static void rows_f32(const float* x, int64_t K, const float* w, int64_t n0, int64_t n1, int64_t N, float* y) {
    constexpr int CH = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    const int64_t K8 = K & ~7;
    for (int64_t n = n0; n < n1; ++n) {
        const float* wn = w + n * K;
        if (n + 2 < n1) for (int64_t o = 0; o < K; o += 16) _mm_prefetch((const char*)(wn + 2 * K + o), _MM_HINT_T0);
        __m256 a[MT][CH];
        for (int m = 0; m < MT; ++m) for (int c = 0; c < CH; ++c) a[m][c] = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 32 <= K8; k += 32)
            for (int c = 0; c < 4; ++c) {
                const __m256 wv = _mm256_loadu_ps(wn + k + 8 * c);
                for (int m = 0; m < MT; ++m) a[m][c % CH] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k + 8 * c), a[m][c % CH]);
            }
        for (; k < K8; k += 8) {
            const __m256 wv = _mm256_loadu_ps(wn + k);
            for (int m = 0; m < MT; ++m) a[m][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k), a[m][0]);
        }
        for (int m = 0; m < MT; ++m) {
            __m256 t = a[m][0];
            for (int c = 1; c < CH; ++c) t = _mm256_add_ps(t, a[m][c]);
            float r = hsum(t);
            for (int64_t j = K8; j < K; ++j) r += wn[j] * x[m * K + j];
            y[m * N + n] = r;
        }
    }
}
}  // namespace avx
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include <immintrin.h>
namespace v512 {
// int4 with AVX-512 VNNI: two blocks (32 bytes of nibbles) per vector: the low nibbles of block g's 16 bytes are its weights
// 0-15 and the high ones 16-31, so one 512-bit vector holds [g lo | g hi | g+1 lo | g+1 hi] (0..15, u8) against the int8
// activations of both blocks in order; vpdpbusd (u8 x s8, no saturation) sums four products a lane; lanes 0-7 block g, 8-15 g + 1
template<int MT> static void rows4(const XQ& xq, const float* dx2, int64_t m0, int64_t K, const uint8_t* w, const float* s, const float* mn, int64_t n0, int64_t n1, int64_t N, float* y) {
    const int64_t G = K / GS, G2 = G / 2;
    const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const int8_t* xr = xq.q.data() + m0 * K; const float* dr = xq.d.data() + m0 * G; const float* cr = xq.c.data() + m0 * G;
    const float* d2 = dx2 + m0 * G2 * 16;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wn = w + n * (K / 2); const float* sn = s + n * G; const float* mnn = mn + n * G;
        if (n + 2 < n1) for (int64_t o = 0; o < K / 2; o += 64) _mm_prefetch((const char*)(wn + K + o), _MM_HINT_T0);
        __m512 a[MT][2];
        for (int m = 0; m < MT; ++m) { a[m][0] = _mm512_setzero_ps(); a[m][1] = _mm512_setzero_ps(); }
        for (int64_t h = 0; h < G2; ++h) {
            const __m256i b = _mm256_loadu_si256((const __m256i*)(wn + 32 * h));       // blocks 2h, 2h + 1: 16 bytes each
            const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi8(15)), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(15));
            // [g lo | g hi | g+1 lo | g+1 hi]: 128-bit lanes of lo = (g, g+1), of hi = (g, g+1)
            const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                                                  _mm256_permute2x128_si256(lo, hi, 0x31), 1);
            const __m512 sv = _mm512_permutexvar_ps(half, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double*)(sn + 2 * h)))));
            for (int m = 0; m < MT; ++m) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(xr + m * K + 64 * h));
                a[m][h & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv, _mm512_loadu_ps(d2 + m * G2 * 16 + 16 * h)), a[m][h & 1]);
            }
        }
        for (int m = 0; m < MT; ++m) {
            float t = _mm512_reduce_add_ps(_mm512_add_ps(a[m][0], a[m][1]));
            if (G & 1) {                                                                 // an odd last block: scalar
                const int64_t g = G - 1; const uint8_t* bb = wn + 16 * g; const int8_t* xb = xr + m * K + g * GS; int32_t u = 0;
                for (int j = 0; j < 16; ++j) u += (bb[j] & 15) * xb[j] + (bb[j] >> 4) * xb[j + 16];
                t += sn[g] * dr[m * G + g] * (float)u;
            }
            __m512 o = _mm512_setzero_ps();                                              // the mins: sum_g m[g] * c[m, g]
            for (int64_t g = 0; g < G; g += 16) {
                const __mmask16 k = G - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (G - g)) - 1);
                o = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, mnn + g), _mm512_maskz_loadu_ps(k, cr + m * G + g), o);
            }
            y[m * N + n] = t + _mm512_reduce_add_ps(o);
        }
    }
}
}  // namespace v512
#pragma GCC pop_options

// ---------------------------------------------------------------- bf16
// weights bf16 [N, K]; the activations rounded to bf16 once per call (to nearest even, as torch's .bfloat16()), zero-padded to a
// multiple of 32; per weight row and 32 values one native bf16 dot product (vdpbf16ps: pairs multiplied and summed into float32)
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512bf16")   // avx2,fma too: immintrin.h was included under those
#include <immintrin.h>
namespace bf {
static void round_x(const float* x, int64_t M, int64_t K, int64_t Kp, uint16_t* o) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < Kp; k += 32) {
            const int64_t left = K - k;
            const __mmask16 lo = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __mmask16 hi = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            const __m512 a = _mm512_maskz_loadu_ps(lo, x + m * K + k), b = _mm512_maskz_loadu_ps(hi, x + m * K + k + 16);
            _mm512_storeu_si512((void*)(o + m * Kp + k), (__m512i)_mm512_cvtne2ps_pbh(b, a));   // a -> low half, b -> high
        }
}
// MT activation rows (xb: bf16 [MT, Kp]) against weight rows [n0, n1); CH accumulators per activation row
template<int MT> static void rows(const uint16_t* xb, int64_t K, int64_t Kp, const uint16_t* w, int64_t n0, int64_t n1, int64_t N, float* y) {
    constexpr int CH = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* wn = w + n * K;
        if (n + 2 < n1) for (int64_t o = 0; o < K; o += 32) _mm_prefetch((const char*)(wn + 2 * K + o), _MM_HINT_T0);
        __m512 a[MT][CH];
        for (int m = 0; m < MT; ++m) for (int c = 0; c < CH; ++c) a[m][c] = _mm512_setzero_ps();
        int64_t k = 0, c = 0;
        for (; k + 32 <= K; k += 32, ++c) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void*)(wn + k));
            for (int m = 0; m < MT; ++m)
                a[m][c % CH] = _mm512_dpbf16_ps(a[m][c % CH], (__m512bh)_mm512_loadu_si512((const void*)(xb + m * Kp + k)), wv);
        }
        if (k < K) {                                  // the tail: a masked load of the weights, the activations are zero-padded
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1ull << (K - k)) - 1), wn + k);
            for (int m = 0; m < MT; ++m)
                a[m][0] = _mm512_dpbf16_ps(a[m][0], (__m512bh)_mm512_loadu_si512((const void*)(xb + m * Kp + k)), wv);
        }
        for (int m = 0; m < MT; ++m) {
            __m512 t = a[m][0];
            for (int c2 = 1; c2 < CH; ++c2) t = _mm512_add_ps(t, a[m][c2]);
            y[m * N + n] = _mm512_reduce_add_ps(t);
        }
    }
}
}  // namespace bf
#pragma GCC pop_options

static int g_isa = -1;                        // 2: AVX-512 VNNI (int4; int8 runs AVX2 there), 1: AVX2 + FMA, 0: portable

static bool has_vnni512() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}
// want: -1 best available, 0 portable, 1 AVX2, 2 AVX-512 VNNI; returns the kernel set chosen, -1 if the CPU lacks the one asked for
extern "C" int hqkv_linear_isa(int want) {
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), v512 = avx2 && has_vnni512();
    if ((want == 1 && !avx2) || (want == 2 && !v512) || want > 2 || want < -1) return -1;
    g_isa = want == -1 ? (v512 ? 2 : avx2 ? 1 : 0) : want;
    return g_isa;
}

// x [M, K] float32, w [N, K] int8, s [N, K / 32] float32, y [M, N] float32; K a multiple of 32. x is quantized to int8 per block
// of 32 (scale max|x| / 127, as the int4 product does) and every path computes the same integer sums
// AVX-512: the activation scales of two blocks, each repeated 8 times (one vector per pair of blocks and row)
static void dup_scales(const XQ& xq, int64_t M, int64_t K, std::vector<float>& dx2) {
    if (g_isa != 2) return;
    const int64_t G = K / GS, G2 = G / 2;
    dx2.resize(M * G2 * 16);
    for (int64_t m = 0; m < M; ++m) for (int64_t h = 0; h < G2; ++h) for (int j = 0; j < 16; ++j)
        dx2[(m * G2 + h) * 16 + j] = xq.d[m * G + 2 * h + j / 8];
}

// x [M, K] float32, w [N, K] int8, s [N, K / 32] float32, y [M, N] float32; K a multiple of 32. nw (or null) and eps: the rows of
// x RMS-normalized first; act: x [M, 2K] is a gated MLP's [gate | up] (norm_rows); res (or null): [M, N] added to y
extern "C" int hqkv_linear_int8(const float* x, int64_t M, int64_t K, const int8_t* w, const float* s, int64_t N, float* y, int64_t threads,
                                const float* nw, float eps, int64_t act, const float* res) {
    if (K % GS || (act && nw)) return 1;
    if (g_isa < 0) hqkv_linear_isa(-1);
    std::vector<float> buf; x = norm_rows(x, M, K, nw, eps, buf, act);   // once per call, shared by every thread
    const int64_t NB = 16;                    // weight rows per work item
    const int64_t items = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t n0 = it * NB, n1 = std::min(N, n0 + NB);
        if (g_isa == 0) rows_portable(x, M, K, w, s, n0, n1, N, y);
        else for (int64_t m0 = 0; m0 < M; ) {
            const float* xm = x + m0 * K; float* ym = y + m0 * N;
            const int64_t left = M - m0; const int mt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (mt == 4) avx::rows<4>(xm, K, w, s, n0, n1, N, ym);      // AVX-512 gains nothing here: bound by memory
            else if (mt == 2) avx::rows<2>(xm, K, w, s, n0, n1, N, ym);
            else avx::rows<1>(xm, K, w, s, n0, n1, N, ym);
            m0 += mt;
        }
        add_res(res, M, N, n0, n1, y);
    }
    return 0;
}

// x [M, K] float32, w [N, K] float32, y [M, N] float32 (any K); nw, eps, act and res as hqkv_linear_int8's
extern "C" int hqkv_linear_f32(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y, int64_t threads,
                               const float* nw, float eps, int64_t act, const float* res) {
    if (act && nw) return 1;
    if (g_isa < 0) hqkv_linear_isa(-1);
    std::vector<float> buf; x = norm_rows(x, M, K, nw, eps, buf, act);
    const int64_t NB = 16;
    const int64_t items = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t n0 = it * NB, n1 = std::min(N, n0 + NB);
        if (g_isa == 0) {
            for (int64_t n = n0; n < n1; ++n) for (int64_t m = 0; m < M; ++m) {
                float a = 0;
                for (int64_t k = 0; k < K; ++k) a += w[n * K + k] * x[m * K + k];
                y[m * N + n] = a;
            }
        } else for (int64_t m0 = 0; m0 < M; ) {
            const int64_t left = M - m0; const float* xm = x + m0 * K; float* ym = y + m0 * N;
            if (left >= 4) { avx::rows_f32<4>(xm, K, w, n0, n1, N, ym); m0 += 4; }
            else if (left >= 2) { avx::rows_f32<2>(xm, K, w, n0, n1, N, ym); m0 += 2; }
            else { avx::rows_f32<1>(xm, K, w, n0, n1, N, ym); m0 += 1; }
        }
        add_res(res, M, N, n0, n1, y);
    }
    return 0;
}

// x [M, K] float32, w [N, K / 2] packed int4, s and mn [N, K / 32] float32 (scales, mins), y [M, N] float32; K a multiple of 32;
// nw, eps, act and res as hqkv_linear_int8's
extern "C" int hqkv_linear_int4(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* s, const float* mn, int64_t N, float* y, int64_t threads,
                                const float* nw, float eps, int64_t act, const float* res) {
    if (K % GS || (act && nw)) return 1;
    if (g_isa < 0) hqkv_linear_isa(-1);
    XQ xq; quant_x(x, M, K, xq, nw, eps, act);      // once per call, shared by every thread
    std::vector<float> dx2; dup_scales(xq, M, K, dx2);
    const int64_t NB = 16;
    const int64_t items = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t n0 = it * NB, n1 = std::min(N, n0 + NB);
        if (g_isa == 0) rows4_portable(xq, M, K, w, s, mn, n0, n1, N, y);
        else for (int64_t m0 = 0; m0 < M; ) {
            const int64_t left = M - m0; float* ym = y + m0 * N; const int mt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (g_isa == 2) {
                if (mt == 4) v512::rows4<4>(xq, dx2.data(), m0, K, w, s, mn, n0, n1, N, ym);
                else if (mt == 2) v512::rows4<2>(xq, dx2.data(), m0, K, w, s, mn, n0, n1, N, ym);
                else v512::rows4<1>(xq, dx2.data(), m0, K, w, s, mn, n0, n1, N, ym);
            } else {
                if (mt == 4) avx::rows4<4>(xq, m0, K, w, s, mn, n0, n1, N, ym);
                else if (mt == 2) avx::rows4<2>(xq, m0, K, w, s, mn, n0, n1, N, ym);
                else avx::rows4<1>(xq, m0, K, w, s, mn, n0, n1, N, ym);
            }
            m0 += mt;
        }
        add_res(res, M, N, n0, n1, y);
    }
    return 0;
}

// w [N, K] int8 (bits 8) or [N, K / 2] packed int4 (bits 4, with mins mn), s [N, K / 32] -> out [N, K] float32 (rows [n0, n1) only): for
// products with many activation rows, which are compute-bound and go to torch's matrix product a block of rows at a time
extern "C" int hqkv_linear_dequant(const void* w, const float* s, const float* mn, int64_t K, int64_t n0, int64_t n1, float* out, int64_t threads, int64_t bits) {
    if (K % GS || (bits != 8 && bits != 4)) return 1;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t n = n0; n < n1; ++n) {
        float* o = out + (n - n0) * K; const float* sn = s + n * (K / GS);
        if (bits == 8) { const int8_t* wn = (const int8_t*)w + n * K; for (int64_t k = 0; k < K; ++k) o[k] = (float)wn[k] * sn[k / GS]; continue; }
        const uint8_t* wn = (const uint8_t*)w + n * (K / 2);
        for (int64_t g = 0; g < K / GS; ++g)
            for (int j = 0; j < 16; ++j) { const uint8_t b = wn[16 * g + j];
                const float m = mn[n * (K / GS) + g]; o[g * GS + j] = (float)(b & 15) * sn[g] + m; o[g * GS + j + 16] = (float)(b >> 4) * sn[g] + m; }
    }
    return 0;
}

extern "C" int hqkv_linear_has_bf16() {       // 1: the CPU has native bf16 dot products (AVX512-BF16), which hqkv_linear_bf16 needs
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") ? 1 : 0;
}

// x [M, K] float32, w [N, K] bf16, y [M, N] float32 (float32 sums of the bf16 products; any K); 2: the CPU has no native bf16
extern "C" int hqkv_linear_bf16(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* y, int64_t threads) {
    if (!hqkv_linear_has_bf16()) return 2;
    const int64_t Kp = (K + 31) / 32 * 32;
    std::vector<uint16_t> xb(M * Kp);
    bf::round_x(x, M, K, Kp, xb.data());      // once per call, shared by every thread
    const int64_t NB = 16;
    const int64_t items = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t n0 = it * NB, n1 = std::min(N, n0 + NB);
        for (int64_t m0 = 0; m0 < M; ) {
            const int64_t left = M - m0; const uint16_t* xm = xb.data() + m0 * Kp; float* ym = y + m0 * N;
            if (left >= 4) { bf::rows<4>(xm, K, Kp, w, n0, n1, N, ym); m0 += 4; }
            else if (left >= 2) { bf::rows<2>(xm, K, Kp, w, n0, n1, N, ym); m0 += 2; }
            else { bf::rows<1>(xm, K, Kp, w, n0, n1, N, ym); m0 += 1; }
        }
    }
    return 0;
}
