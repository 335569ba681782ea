// hqkv CPU decode attention that reads coded KV pages in place.
// Built on first use by hqkv.attention_cpu (nbs/34_attention.cpu.ipynb: the maths, the tests and the
// measurements live there). One work item = (sequence, split of the context), its KV heads one after another;
// each KV head's G query heads (1 to 8, or padded to a multiple of 8) share every decoded row; blocks of up to
// 64 rows are scored, softmaxed online in FP32 and accumulated into V, all in the codec's rotated domain. Splits
// are merged by log-sum-exp. The window rule (sinks from the window, then the codes, then the recent ring) is
// hqkv.attention_cpu.held_spans; this file only reads the three spans it is given per sequence.
#include <stdint.h>
#include <string.h>
#include <stddef.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include <omp.h>
#include <utility>

enum { FMT_BF16 = 0, FMT_E8 = 1, FMT_Q8_0 = 2, FMT_Q4_0 = 3, FMT_TBQ4 = 4, FMT_TBQ3 = 5, FMT_TBQ2 = 6, FMT_COUNT = 7 };
static const int BLK = 64;                    // rows per block (and at most one page)

// the next head's rows (hq-e8-2b: 72 bytes at D 256; rows under 128 bytes are too short for prefetch_rows; bf16): item()
// names them before each head, and the kernels (through their format's `ahead`) prefetch a few at a time while they work on
// this head's: score half the rows, accum (its first pass) the other half. A head's rows are 1-2 lines every H rows, in
// pages anywhere in the pool, which the hardware prefetchers do not follow; one burst of them all before the head stalls on
// the line fill buffers and gained nothing (nbs/34_attention.cpu, "What the numbers say": the probes)
struct Ahead { const uint8_t* base[2]; int64_t stride[2], rb[2]; int n = 0, next = 0; };   // one per thread (Fmt::ahead)
// (every line of a row, and its last byte: a row that does not start on a line ends on one more). Into L2 (prefetcht1): on an
// EPYC Zen 4, 2 threads, 32K tokens, prefetcht0 here stalled the kernels on L1's miss buffers (perf: 30% of bf16 scoring's
// samples on one prefetcht0); prefetcht1 made bf16 pages 1.4-1.7x faster (D 64-256, GQA 1-8) and the coded rows 1.05-1.09x
// (nbs/34_attention.cpu, "What the numbers say")
static inline void ahead_rows(Ahead* ap, int rows) {
    if (!ap) return;
    Ahead& a = *ap;
    for (int e = std::min(a.n, a.next + rows); a.next < e; ++a.next)
        for (int s = 0; s < 2; ++s) if (a.rb[s]) {
            const uint8_t* r = a.base[s] + a.next * a.stride[s];
            for (int64_t o = 0; o < a.rb[s]; o += 64) __builtin_prefetch(r + o, 0, 2);
            __builtin_prefetch(r + a.rb[s] - 1, 0, 2);
        }
}

struct Fmt {                                  // one side's format (keys or values)
    int64_t kind, D, block, block_bytes;      // block: values per scale (ggml 32, tbq block, e8 unused)
    const float* tab;                         // e8: |pattern|[256][8], then per low byte [256][16]: sign masks, signed shifts; tbq: centroids[8 or 16]
    uint8_t blk[64];                          // the scale block of each group of 8 values (e8: its quarter; q8_0/q4_0/tbq: its block)
    int64_t row_bytes;                        // bytes of a row
    // not mirrored by ctypes: set by with_blocks
    int32_t nsb;                              // scale blocks per row
    int32_t sb[65];                           // block b covers groups [sb[b], sb[b + 1])
    Ahead* ahead;                             // the calling thread's prefetch cursor (its own copy of the formats), or null
};
static Fmt with_blocks(const void* mirrored) {   // the ctypes part, then the block boundaries from blk
    Fmt f; memset(&f, 0, sizeof f); memcpy(&f, mirrored, offsetof(Fmt, nsb));
    const int C = (int)(f.D / 8); f.nsb = 0; f.sb[0] = 0;
    for (int c = 1; c <= C; ++c) if (c == C || f.blk[c] != f.blk[c - 1]) f.sb[++f.nsb] = c;
    return f;
}

struct Args {                                 // mirrored by hqkv.attention_cpu._Args (ctypes)
    const float* q;                           // [B, H, Gp, D] rotated, scaled
    const uint8_t* k_pages; const uint8_t* v_pages;   // [num_pages, page_size, tok_bytes]: head h's row at byte k_off[h]
    const int32_t* indptr; const int32_t* indices;
    const int64_t* spans;                     // [B, 4]: length L, s, r, window slot (sinks [0,s), codes [s,r), ring [r,L))
    const uint16_t* k_sink; const uint16_t* v_sink;   // bf16 [slots, S, H, D] (or null)
    const uint16_t* k_ring; const uint16_t* v_ring;   // bf16 [slots, R, H, D] (or null)
    float* out; float* lse;                   // [B, H, Gp, D], [B, H, Gp]
    int64_t B, H, Gp, D, page_size, k_tok_bytes, v_tok_bytes, S, R, chunk, threads;   // tok_bytes: a token's rows, all heads
    int64_t block_rows, window_block_rows;    // set by hqkv_cpu_decode: rows per block of codes / of window rows (all heads' K and V under 128 KiB)
    const Fmt* kf; const Fmt* vf;             // [H] each head's format (from Python: ctypes arrays of the mirrored part)
    const int64_t* k_off; const int64_t* v_off;   // [H] each head's byte offset in a token
    const Fmt* wf; const int64_t* w_off;      // set by hqkv_cpu_decode: the window's rows (bf16) as a format and offsets
    // a turned mean (hqkv.keyprofile): its score term qt . (cos, sin)(p omega) added to every row's score; qt null: none
    const float* qt;                          // [B, H, Gp, D]: the queries' side (KeyProfile.turn_query), scaled as q
    const float* turn_tab;                    // [D, 96]: (cos, sin) of o omega, o = 0..63, per channel, 16 zeros, 16 coefficients
    const float* turn_base;                   // [turn_blocks, D]: (cos, sin) of 64 k omega
    int64_t turn_blocks;                      // rows of turn_base: every position read is below 64 turn_blocks
    const int32_t* turn_order; int64_t turn_exact;   // [D]: the channels read from turn_tab's values first (turn_exact of them), then the polynomials'
};

static inline float bf16f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float f16f(uint16_t h) {        // IEEE half -> float (portable)
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) { if (m == 0) u = s; else { float f = ldexpf((float)m, -24); memcpy(&u, &f, 4); u |= s; } }
    else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t ld16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
// hq-e8-2b's bf16 scales per row, after its D/4 bytes of codewords: four (a quarter each) or one (the whole row)
static inline int64_t e8_scales(const Fmt& f) { return (f.row_bytes - f.D / 4) / 2; }

// ---------------------------------------------------------------- portable path: decode a row, then loops
static void decode_row(const Fmt& f, const uint8_t* row, float* x) {
    const int64_t D = f.D;
    switch (f.kind) {
    case FMT_BF16: for (int64_t i = 0; i < D; ++i) x[i] = bf16f(ld16(row + 2 * i)); break;
    case FMT_E8: {
        float sc[4]; const int64_t last = e8_scales(f) - 1;   // one scale: repeated for the four quarters
        for (int k = 0; k < 4; ++k) sc[k] = bf16f(ld16(row + D / 4 + 2 * std::min<int64_t>(k, last)));
        for (int64_t g = 0; g < D / 8; ++g) {
            const uint8_t* cw = row + 2 * g; const float* t = f.tab + 2048 + 16 * cw[0];
            for (int j = 0; j < 8; ++j) {
                float a = f.tab[8 * cw[1] + j] + t[8 + j]; uint32_t u, m; memcpy(&u, &a, 4); memcpy(&m, t + j, 4); u ^= m;
                float v; memcpy(&v, &u, 4); x[8 * g + j] = v * sc[f.blk[g]];
            }
        }
        break; }
    case FMT_Q8_0:
        for (int64_t b = 0; b < D / 32; ++b) { const uint8_t* p = row + 34 * b; float d = f16f(ld16(p));
            for (int j = 0; j < 32; ++j) x[32 * b + j] = (float)(int8_t)p[2 + j] * d; }
        break;
    case FMT_Q4_0:
        for (int64_t b = 0; b < D / 32; ++b) { const uint8_t* p = row + 18 * b; float d = f16f(ld16(p));
            for (int j = 0; j < 16; ++j) { x[32 * b + j] = (float)((p[2 + j] & 15) - 8) * d; x[32 * b + 16 + j] = (float)((p[2 + j] >> 4) - 8) * d; } }
        break;
    default: {                                 // tbq4/3/2: per block an fp16 scale and packed little-endian indices
        int bits = f.kind == FMT_TBQ4 ? 4 : f.kind == FMT_TBQ3 ? 3 : 2;
        for (int64_t b = 0; b < D / f.block; ++b) {
            const uint8_t* p = row + f.block_bytes * b; float d = f16f(ld16(p)); p += 2;
            for (int64_t j = 0; j < f.block; ++j) {
                int64_t bit = j * bits; uint32_t w = p[bit >> 3] | ((bit >> 3) + 1 < f.block_bytes - 2 ? (uint32_t)p[(bit >> 3) + 1] << 8 : 0);
                x[f.block * b + j] = f.tab[(w >> (bit & 7)) & ((1 << bits) - 1)] * d;
            }
        }
    } }
}

static void score_scalar(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* q, int G, float* s, float* tmp) {
    for (int i = 0; i < n; ++i) {
        decode_row(f, base + i * stride, tmp);
        for (int g = 0; g < G; ++g) { float a = 0; for (int64_t d = 0; d < f.D; ++d) a += q[g * f.D + d] * tmp[d]; s[g * BLK + i] = a; }
    }
}
static void accum_scalar(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, int G, float* acc, float* tmp) {
    for (int i = 0; i < n; ++i) {
        decode_row(f, base + i * stride, tmp);
        for (int g = 0; g < G; ++g) { float w = p[g * BLK + i]; for (int64_t d = 0; d < f.D; ++d) acc[g * f.D + d] += w * tmp[d]; }
    }
}
static void softmax_scalar(float* s, int n, int G, float* m, float* l, float* acc, int64_t D) {
    for (int g = 0; g < G; ++g) {
        float* sg = s + g * BLK; float mb = sg[0];
        for (int i = 1; i < n; ++i) mb = sg[i] > mb ? sg[i] : mb;
        float mn = mb > m[g] ? mb : m[g], alpha = expf(m[g] - mn), sum = 0;
        for (int i = 0; i < n; ++i) { sg[i] = expf(sg[i] - mn); sum += sg[i]; }
        l[g] = l[g] * alpha + sum; m[g] = mn;
        if (alpha != 1.0f) for (int64_t d = 0; d < D; ++d) acc[g * D + d] *= alpha;
    }
}

// ---------------------------------------------------------------- AVX2 + FMA + F16C path
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
namespace avx {

static inline __m256 bcast_f16(const uint8_t* p) { return _mm256_set1_ps(_cvtsh_ss(ld16(p))); }

// A format: prep (per block of rows), row (a row's reader), scale(row, b) (the scale of block b, broadcast) and load8(row, c)
// (group c's 8 values before that scale); `scaled` false: no scale.
struct BF16 {                               // 8 bf16 -> 8 float: widen and shift
    static constexpr bool scaled = false;
    struct R { const uint8_t* p; };
    static inline void prep(const uint8_t*, int64_t, int, const Fmt&, float*) {}
    static inline R row(const uint8_t* p, const Fmt&, const float*, int) { return R{p}; }
    static inline __m256 scale(const R&, int, const Fmt&) { return _mm256_set1_ps(1.0f); }
    static inline __m256 load8(const R& r, int c, const Fmt&) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(r.p + 16 * c)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
};
struct E8 {                                 // (|pattern| + signed shift) xor signs; the quarter scale (tables: hqkv.attention_cpu.e8_tables)
    static constexpr bool scaled = true;
    struct R { const uint8_t* p; const float* sc; };   // sc: the row's 4 quarter scales as floats (see prep; one scale: 4 copies)
    static inline void prep(const uint8_t* base, int64_t stride, int n, const Fmt& f, float* sc) {
        const int64_t last = e8_scales(f) - 1;   // one scale: repeated for the four quarters
        for (int i = 0; i < n; ++i) { const uint8_t* sp = base + i * stride + f.D / 4; for (int k = 0; k < 4; ++k) sc[4 * i + k] = bf16f(ld16(sp + 2 * std::min<int64_t>(k, last))); }
    }
    static inline R row(const uint8_t* p, const Fmt&, const float* sc, int i) { return R{p, sc + 4 * i}; }
    static inline __m256 scale(const R& r, int b, const Fmt&) { return _mm256_broadcast_ss(r.sc + b); }
    static inline __m256 load8(const R& r, int c, const Fmt& f) {
        const uint32_t w = ld16(r.p + 2 * c);                         // one load: low byte sign bits and shift, high byte pattern
        const float* t = f.tab + 2048 + 16 * (w & 255);
        return _mm256_xor_ps(_mm256_add_ps(_mm256_load_ps(f.tab + 8 * (w >> 8)), _mm256_load_ps(t + 8)), _mm256_load_ps(t));
    }
};
struct Q8 {                                 // 8 int8 -> float; the block's fp16 scale
    static constexpr bool scaled = true;
    struct R { const uint8_t* p; };
    static inline void prep(const uint8_t*, int64_t, int, const Fmt&, float*) {}
    static inline R row(const uint8_t* p, const Fmt&, const float*, int) { return R{p}; }
    static inline __m256 scale(const R& r, int b, const Fmt&) { return bcast_f16(r.p + 34 * b); }
    static inline __m256 load8(const R& r, int c, const Fmt&) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(r.p + 34 * (c >> 2) + 2 + 8 * (c & 3)))));
    }
};
struct Q4 {                                 // element j: low nibble of byte j (j < 16), else high nibble of byte j - 16
    static constexpr bool scaled = true;
    struct R { const uint8_t* p; };
    static inline void prep(const uint8_t*, int64_t, int, const Fmt&, float*) {}
    static inline R row(const uint8_t* p, const Fmt&, const float*, int) { return R{p}; }
    static inline __m256 scale(const R& r, int b, const Fmt&) { return bcast_f16(r.p + 18 * b); }
    static inline __m256 load8(const R& r, int c, const Fmt&) {
        __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(r.p + 18 * (c >> 2) + 2 + 8 * (c & 1))));
        w = (c & 2) ? _mm256_srli_epi32(w, 4) : _mm256_and_si256(w, _mm256_set1_epi32(15));
        return _mm256_cvtepi32_ps(_mm256_sub_epi32(w, _mm256_set1_epi32(8)));
    }
};
template<int BITS> struct TBQ {             // 8 packed indices -> centroids by a register permute; the block's fp16 scale
    static constexpr bool scaled = true;
    struct R { const uint8_t* p; };
    static inline void prep(const uint8_t*, int64_t, int, const Fmt&, float*) {}
    static inline R row(const uint8_t* p, const Fmt&, const float*, int) { return R{p}; }
    static inline __m256 scale(const R& r, int b, const Fmt& f) { return bcast_f16(r.p + f.block_bytes * b); }
    static inline __m256 load8(const R& r, int c, const Fmt& f) {
        const int bk = f.blk[c], j = c - f.sb[bk];                    // chunk j of block bk (no division per group)
        const uint8_t* b = r.p + f.block_bytes * bk;
        const uint8_t* ix = b + 2 + j * BITS;                        // 8 indices = BITS bytes
        // in a register: a 3-byte memcpy into a stack word, read back as 4, stalled store forwarding (4x the rest of the loop)
        const uint32_t w = BITS == 2 ? (uint32_t)ld16(ix) : BITS == 3 ? (uint32_t)ld16(ix) | (uint32_t)ix[2] << 16 : ((uint32_t)ld16(ix) | (uint32_t)ld16(ix + 2) << 16);
        const __m256i sh = BITS == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : BITS == 3 ? _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)
                                                                                    : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        __m256i id = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32((1 << BITS) - 1));
        __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(f.tab), id);
        if (BITS == 4) {
            __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(f.tab + 8), id);
            v = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(id, 28)));
        }
        return v;
    }
};

static const int AHEAD = 8;                  // rows prefetched ahead inside a block: with 8 query heads a row is ~100 instructions, too few rows in flight to hide DRAM latency
static inline void prefetch_rows(const uint8_t* base, int64_t stride, int64_t rb, int from, int to) {
    if (rb < 128) return;                     // short coded rows: measured slower with it (the hardware prefetchers keep up)
    for (int r = from; r < to; ++r) for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char*)(base + r * stride + o), _MM_HINT_T0);
}
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
static inline float hsum(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x)); x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// scores s[g][i] = q_g . k_i for G heads (G 1-8): 8/G rows at a time so that 8 accumulators fill one hadd tree
template<class F, int G> static void score(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* q, float* s, float* sc) {
    constexpr int RB = 8 / G;
    const int C = (int)(f.D / 8);
    F::prep(base, stride, n, f, sc);
    int i = 0;
    prefetch_rows(base, stride, f.row_bytes, 0, std::min(n, AHEAD));
    for (; i + RB <= n; i += RB) {
        prefetch_rows(base, stride, f.row_bytes, std::min(n, i + AHEAD), std::min(n, i + AHEAD + RB));
        ahead_rows(f.ahead, (RB + 1) / 2);
        __m256 acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
        typename F::R rr[RB];
        for (int r = 0; r < RB; ++r) rr[r] = F::row(base + (i + r) * stride, f, sc, i + r);
        for (int b = 0; b < f.nsb; ++b) {               // the block's scale once per row, not per group
            __m256 s8[RB];
            for (int r = 0; r < RB; ++r) s8[r] = F::scale(rr[r], b, f);
            for (int c = f.sb[b]; c < f.sb[b + 1]; ++c)
                for (int r = 0; r < RB; ++r) {
                    __m256 k = F::load8(rr[r], c, f);
                    if (F::scaled) k = _mm256_mul_ps(k, s8[r]);
                    for (int g = 0; g < G; ++g) acc[r * G + g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * f.D + 8 * c), k, acc[r * G + g]);
                }
        }
        alignas(32) float t[8];
        _mm256_store_ps(t, hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
        for (int r = 0; r < RB; ++r) for (int g = 0; g < G; ++g) s[g * BLK + i + r] = t[r * G + g];
    }
    for (; i < n; ++i) {                       // the block's last rows, one at a time
        __m256 acc[G];
        for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
        typename F::R r = F::row(base + i * stride, f, sc, i);
        for (int c = 0; c < C; ++c) { __m256 k = F::load8(r, c, f);
            if (F::scaled) k = _mm256_mul_ps(k, F::scale(r, f.blk[c], f));
            for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * f.D + 8 * c), k, acc[g]); }
        for (int g = 0; g < G; ++g) s[g * BLK + i] = hsum(acc[g]);
    }
}

// tbq keys with 8 rows in the lanes (v512::score_tbq on 8 lanes; no sum across lanes): per group of 8 values one gather of
// the 8 rows' 4 index bytes that end with the group's, then per value a shift and a permute (tbq4: two and a blend) give the
// rows' centroids, times the rows' block scales, and one FMA per head
template<int BITS, int G> static void score_tbq(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* q, float* s, float* sc) {
    if (f.block % 8 || 8 * stride > INT32_MAX) return score<TBQ<BITS>, G>(f, base, stride, n, q, s, sc);
    const int NB = (int)(f.D / f.block), GPB = (int)(f.block / 8);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(f.tab), _mm256_and_si256(lane, _mm256_set1_epi32((1 << BITS) - 1)));
    const __m256 hi = _mm256_loadu_ps(f.tab + 8);   // tbq4's centroids 8..15
    for (int i0 = 0; i0 < n; i0 += 8) {       // rows past n: the last row again (s has room for them; never read)
        ahead_rows(f.ahead, 4);
        const __m256i off = _mm256_mullo_epi32(_mm256_min_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(i0)), _mm256_set1_epi32(n - 1)),
                                               _mm256_set1_epi32((int)stride));
        __m256 acc[G];
        for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
        for (int bk = 0; bk < NB; ++bk) {
            const uint8_t* bb = base + bk * f.block_bytes;
            alignas(32) float d8[8];
            for (int r = 0; r < 8; ++r) d8[r] = _cvtsh_ss(ld16(bb + std::min(i0 + r, n - 1) * stride));
            const __m256 d = _mm256_load_ps(d8);
            for (int c = 0; c < GPB; ++c) {
                const __m256i x = _mm256_i32gather_epi32((const int*)(bb + c * BITS + BITS - 2), off, 1);   // the group's bits at 8 (4 - BITS)
                const float* qc = q + 8 * (bk * GPB + c);
                #pragma GCC unroll 8
                for (int t = 0; t < 8; ++t) {
                    const __m256i id = _mm256_srli_epi32(x, 8 * (4 - BITS) + BITS * t);
                    __m256 v = _mm256_permutevar8x32_ps(lo, id);
                    if (BITS == 4) v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(hi, id), _mm256_castsi256_ps(_mm256_slli_epi32(id, 28)));
                    v = _mm256_mul_ps(v, d);
                    for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(qc[g * f.D + t]), v, acc[g]);
                }
            }
        }
        for (int g = 0; g < G; ++g) _mm256_storeu_ps(s + g * BLK + i0, acc[g]);
    }
}

// acc[g] += sum_i p[g][i] v_i: CB chunks of 8 values at a time for all rows of the block, the G x CB accumulators in
// registers (acc in memory would chain every row's update through a store and a load)
template<class F, int G> static void accum(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float* sc) {
    constexpr int CB = 8 / G;
    const int C = (int)(f.D / 8);
    F::prep(base, stride, n, f, sc);
    int c0 = 0;
    prefetch_rows(base, stride, f.row_bytes, 0, std::min(n, AHEAD));
    for (; c0 + CB <= C; c0 += CB) {
        __m256 a[G][CB];
        for (int g = 0; g < G; ++g) for (int k = 0; k < CB; ++k) a[g][k] = _mm256_loadu_ps(acc + g * f.D + 8 * (c0 + k));
        const bool one = f.blk[c0] == f.blk[c0 + CB - 1];   // the chunk's groups share a scale: once per row
        for (int i = 0; i < n; ++i) {
            if (c0 == 0) prefetch_rows(base, stride, f.row_bytes, std::min(n, i + AHEAD), std::min(n, i + AHEAD + 1));
            if (c0 == 0 && (i & 1) == 0) ahead_rows(f.ahead, 1);
            typename F::R r = F::row(base + i * stride, f, sc, i);
            __m256 w[G];
            for (int g = 0; g < G; ++g) w[g] = _mm256_broadcast_ss(p + g * BLK + i);
            __m256 s8 = F::scaled && one ? F::scale(r, f.blk[c0], f) : _mm256_setzero_ps();
            for (int k = 0; k < CB; ++k) { __m256 v = F::load8(r, c0 + k, f);
                if (F::scaled) v = _mm256_mul_ps(v, one ? s8 : F::scale(r, f.blk[c0 + k], f));
                for (int g = 0; g < G; ++g) a[g][k] = _mm256_fmadd_ps(w[g], v, a[g][k]); }
        }
        for (int g = 0; g < G; ++g) for (int k = 0; k < CB; ++k) _mm256_storeu_ps(acc + g * f.D + 8 * (c0 + k), a[g][k]);
    }
    for (; c0 < C; ++c0) {                     // head dims that are not a multiple of 8 * CB: one chunk at a time
        __m256 a[G];
        for (int g = 0; g < G; ++g) a[g] = _mm256_loadu_ps(acc + g * f.D + 8 * c0);
        for (int i = 0; i < n; ++i) { typename F::R r = F::row(base + i * stride, f, sc, i); __m256 v = F::load8(r, c0, f);
            if (F::scaled) v = _mm256_mul_ps(v, F::scale(r, f.blk[c0], f));
            for (int g = 0; g < G; ++g) a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * BLK + i), v, a[g]); }
        for (int g = 0; g < G; ++g) _mm256_storeu_ps(acc + g * f.D + 8 * c0, a[g]);
    }
}

static inline __m256 exp256(__m256 x) {      // Cephes-style expf for x <= 0 (scores minus their max), rel. error ~1e-7
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static void softmax(float* s, int n, int G, float* m, float* l, float* acc, int64_t D) {
    for (int g = 0; g < G; ++g) {
        float* sg = s + g * BLK; float mb = sg[0]; int i = 0;
        __m256 vmax = _mm256_set1_ps(-INFINITY);          // the block's max: 8 lanes, then the tail (gcc keeps the scalar loop)
        for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sg + i));
        alignas(32) float t8[8]; _mm256_store_ps(t8, vmax);
        for (int k = 0; k < 8; ++k) mb = t8[k] > mb ? t8[k] : mb;
        for (; i < n; ++i) mb = sg[i] > mb ? sg[i] : mb;
        float mn = mb > m[g] ? mb : m[g], alpha = expf(m[g] - mn);
        __m256 vm = _mm256_set1_ps(mn), vs = _mm256_setzero_ps(); float sum = 0; i = 0;
        for (; i + 8 <= n; i += 8) { __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + i), vm)); _mm256_storeu_ps(sg + i, e); vs = _mm256_add_ps(vs, e); }
        for (; i < n; ++i) { sg[i] = expf(sg[i] - mn); sum += sg[i]; }
        l[g] = l[g] * alpha + sum + hsum(vs); m[g] = mn;
        if (alpha != 1.0f) { __m256 va = _mm256_set1_ps(alpha); for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(acc + g * D + d, _mm256_mul_ps(va, _mm256_loadu_ps(acc + g * D + d))); }
    }
}
}  // namespace avx
#pragma GCC pop_options

// ---------------------------------------------------------------- AVX-512 VNNI path: hq-e8-2b rows as int8, integer key dots
// 4x a coded value is an integer in -11..11 (|pattern| in {1/2, 3/2, 5/2}, shift +-1/4), so each 16-bit codeword has an exact
// int8 image (hqkv.codec.e8 grid4, handed over once by hqkv_cpu_e8_init): 512 KiB, which the AVX2 integer paths gather from; the
// AVX-512 path builds the same values from a 2 KiB pattern table instead (codes8: the big one leaves L2 between layers).
// Keys: the query is quantized once per call to int8 (one scale per head row, signed), the keys decoded as 4k + 11 (unsigned)
// with 16 rows in the lanes of a vector; vpdpbusd sums q (4k + 11) four bytes at a time for 16 rows, 11 sum(q) (fixed for the
// call) comes off once per quarter, then one float FMA per quarter and head applies the rows' scales (score, below). Values:
// the int8 rows are widened to float and accumulated with weights p * scale / 4 (each 16 values share a quarter). As in
// ggml's IQ2 dots, no value goes through a float lookup table.
alignas(64) static uint64_t E8_INT8[65536];   // codeword -> 8 x int8: 4x its 8 values (hqkv.codec.e8 `grid4`, copied once)
alignas(64) static uint64_t E8_ABS4[256];     // pattern -> 8 x int8: 4 |pattern|, coordinate 0 negated by its parity (from E8_INT8)

// the G heads' int8 queries of one (sequence, KV head), for both integer paths: q [G, D] float -> r = round(q / scale), scale [G]
// (max |q| / 127), qf [G, D] = r * scale, the query the window's exact rows are scored with (every key sees the same query), and
// qs [G, D]: r (signed int8), v512 in order, v2 in v2's order (chunk j of 32: 8 values of codeword j of each quarter); qlane:
// the offset keys' share (both paths store keys as 4k + 11, unsigned), v512 [G, 8]: 11 sum r over quarter l (l < 4), v2 [G, 8]:
// 11 sum r over each lane's values. Plain code: any CPU.
static void quantize(const float* q, int64_t G, int64_t D, bool v512, uint8_t* qs, float* scale, float* qf, int32_t* qlane) {
    const int64_t Qg = D / 32;                 // codewords per quarter
    const float M = 12582912.0f;               // 1.5 x 2^23: (y + M) - M rounds |y| <= 2^22 to an integer, ties to even (as
                                               // nearbyintf and torch.round; no libm call per value, no division)
    for (int64_t g = 0; g < G; ++g) {
        const float* x = q + g * D; float m = 0;
        for (int64_t d = 0; d < D; ++d) m = fmaxf(m, fabsf(x[d]));
        const float inv = m > 0 ? 127.0f / m : 0.0f; scale[g] = m / 127.0f;
        for (int k = 0; k < 8; ++k) qlane[8 * g + k] = 0;
        for (int64_t quarter = 0; quarter < 4; ++quarter)
            for (int64_t j = 0; j < Qg; ++j) {   // codeword j of the quarter: values d0 .. d0 + 7
                const int64_t d0 = 8 * (quarter * Qg + j);
                uint8_t* o = qs + g * D + (v512 ? d0 : 32 * j + 8 * quarter);
                for (int t = 0; t < 8; ++t) {
                    const float r = (x[d0 + t] * inv + M) - M; const int ri = (int)r;
                    qf[g * D + d0 + t] = r * scale[g]; o[t] = (uint8_t)(int8_t)ri;
                    qlane[8 * g + (v512 ? quarter : 2 * quarter + t / 4)] += 11 * ri;
                }
            }
    }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")
namespace v512 {
static inline __m256 fold(__m512 a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)); }
// 8 codewords -> 64 int8 values without the 512 KiB table: the pattern (high byte) from a 256-entry table of 4|pattern|
// (2 KiB, stays in L1; the big table is evicted by the weights between layers, and its gathers then missed L2 in the
// engine), the low byte's signs as a byte mask (coordinate 0: the parity of the other seven) and its shift as +-1.
// LOADS: the 8 patterns by 8 scalar loads and inserts instead of one gather (g_e8_loads): on an EPYC (Zen 4) the gather
// was the kernels' hottest instruction (perf), and the loads made hq-e8-2b calls 1.06-1.29x faster (1K-32K, D 64-256, GQA 1-8,
// 2 threads, both alternated in one process; a probe, not saved). Intel Xeons were measured fast with the gather (34's notes)
template<bool LOADS, int OFF = 0> static inline __m512i codes8(const uint8_t* p) {   // OFF: added to every value (keys: 11, unsigned)
    const __m128i w = _mm_loadu_si128((const __m128i*)p);
    __m512i P;
    if constexpr (LOADS) {                      // codeword j's pattern: byte 2j + 1
        const long long* T = (const long long*)E8_ABS4;
        const __m128i x0 = _mm_insert_epi64(_mm_cvtsi64_si128(T[p[1]]), T[p[3]], 1), x1 = _mm_insert_epi64(_mm_cvtsi64_si128(T[p[5]]), T[p[7]], 1);
        const __m128i x2 = _mm_insert_epi64(_mm_cvtsi64_si128(T[p[9]]), T[p[11]], 1), x3 = _mm_insert_epi64(_mm_cvtsi64_si128(T[p[13]]), T[p[15]], 1);
        P = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(x0), x1, 1)),
                               _mm256_inserti128_si256(_mm256_castsi128_si256(x2), x3, 1), 1);
    } else P = _mm512_i64gather_epi64(_mm512_cvtepu16_epi64(_mm_srli_epi16(w, 8)), (const long long*)E8_ABS4, 8);
    const uint64_t lo = (uint64_t)_mm_cvtsi128_si64(_mm_cvtepi16_epi8(w)), odd = 0x0101010101010101ull;
    uint64_t t = lo & ~odd; const uint64_t signs = t;
    t ^= t >> 4; t ^= t >> 2; t ^= t >> 1;          // bit 0 of each byte: the parity of its bits 1..7
    const __m512i v = _mm512_mask_sub_epi8(P, (__mmask64)(signs | (t & odd)), _mm512_setzero_si512(), P);
    const __m512i v0 = _mm512_add_epi8(v, _mm512_set1_epi8(OFF - 1));
    return _mm512_mask_add_epi8(v0, (__mmask64)((lo & odd) * 0xFF), v0, _mm512_set1_epi8(2));
}

// the rows' quarter scales as floats, sc[q * BLK + i] (row i, quarter q): eight rows' 8-byte scale words by one gather, their
// bf16 reordered by quarter with one word permute, widened to float (rows past n, to a multiple of 16, repeat the last one).
// A row of one scale: the 8 bytes that end the row, its scale the last word, repeated for the four quarters
static inline void scales(const uint8_t* base, int64_t stride, int n, const Fmt& f, float* sc) {
    alignas(64) static const uint16_t by_quarter[32] = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29,
                                                        2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
    alignas(64) static const uint16_t last_word[32] = {3, 7, 11, 15, 19, 23, 27, 31, 3, 7, 11, 15, 19, 23, 27, 31,
                                                       3, 7, 11, 15, 19, 23, 27, 31, 3, 7, 11, 15, 19, 23, 27, 31};
    const bool one = e8_scales(f) == 1;
    const __m512i perm = _mm512_load_si512(one ? last_word : by_quarter);
    const uint8_t* word = base + f.D / 4 - (one ? 6 : 0);
    const __m512i step = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), last = _mm512_set1_epi64(n - 1);
    for (int i0 = 0; i0 < ((n + 15) & ~15); i0 += 8) {   // to a multiple of 16 rows (score reads 16 at a time)
        const __m512i rows = _mm512_min_epi64(_mm512_add_epi64(_mm512_set1_epi64(i0), step), last);
        const __m512i w = _mm512_permutexvar_epi16(perm, _mm512_i64gather_epi64(_mm512_mullo_epi64(rows, _mm512_set1_epi64(stride)),
                                                                                 (const long long*)word, 1));
        for (int q = 0; q < 4; ++q) {
            const __m256i x = _mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(w, q));
            _mm256_storeu_ps(sc + q * BLK + i0, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
        }
    }
}

// 16 rows' 64 values (r[i]: row i, dword j = values 4j..4j+3) -> r[j]: quad j of the 16 rows (dword i = row i)
static inline void transpose16(__m512i* r) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) { t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]); t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]); }
    for (int R = 0; R < 4; ++R) {             // u[4R + m], 128-bit lane L: quad 4L + m of rows 4R..4R+3
        const __m512i* x = t + 4 * R;
        u[4 * R] = _mm512_unpacklo_epi64(x[0], x[2]); u[4 * R + 1] = _mm512_unpackhi_epi64(x[0], x[2]);
        u[4 * R + 2] = _mm512_unpacklo_epi64(x[1], x[3]); u[4 * R + 3] = _mm512_unpackhi_epi64(x[1], x[3]);
    }
    for (int m = 0; m < 4; ++m) {             // the four row groups' lanes L of u[R..][m] -> r[4L + m]
        const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88), v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88), v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_shuffle_i32x4(v0, v2, 0x88); r[8 + m] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[4 + m] = _mm512_shuffle_i32x4(v1, v3, 0x88); r[12 + m] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

// s[g][i] = q_g . k_i for G heads (1-8), D a multiple of 64, with the rows in the lanes: 16 rows at a time, their codes decoded
// as 4k + 11 (unsigned) and transposed so that a vector holds the same 4 values of the 16 rows; one vpdpbusd per 4 values and
// head (the query's 4 signed bytes broadcast) sums 16 rows' products in int32 over a quarter, whose offset share (11 sum q,
// qlane) comes off before one convert and one FMA by the 16 rows' quarter scales. No reduction across lanes: each head's
// 16 scores are one vector. The query as quantize(v512) stores it: signed, in order. The accumulators start at zero and every
// loop over the heads is unrolled: GCC otherwise copies a shared start value into each before every vpdpbusd, or keeps the
// array on the stack (a load and a store per product).
template<int G, bool LOADS> static void score(const Fmt& f, const uint8_t* base, int64_t stride, int n, const uint8_t* qs, const float* qscale,
                                  const int32_t* qlane, float* s, float*) {
    const int D = (int)f.D, QQ = D / 16;   // quads (4 values) per quarter: 4 to 32, not always a power of two (D 192: 12)
    alignas(64) float sc[4 * BLK + 8];
    alignas(64) __m512i y[16];
    Ahead* ah = f.ahead;
    scales(base, stride, n, f, sc);
    for (int i0 = 0; i0 < n; i0 += 16) {
        ahead_rows(ah, 8);
        __m512i acc[G]; __m512 fs[G];
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) { acc[g] = _mm512_setzero_si512(); fs[g] = _mm512_setzero_ps(); }
        for (int c = 0; c < D / 64; ++c) {
            for (int r = 0; r < 16; ++r) y[r] = codes8<LOADS, 11>(base + std::min(i0 + r, n - 1) * stride + 16 * c);   // past n: the last row
            transpose16(y);
            for (int j0 = 0; j0 < 16;) {            // the chunk's quads up to the end of their quarter q
                const int q = (16 * c + j0) / QQ, j1 = std::min(16, (q + 1) * QQ - 16 * c);
                for (int j = j0; j < j1; ++j) {
                    const uint8_t* qj = qs + 4 * (16 * c + j);   // quad 16c + j of the row
                    #pragma GCC unroll 8
                    for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], y[j], _mm512_set1_epi32(*(const int32_t*)(qj + g * D)));
                }
                j0 = j1;
                if (16 * c + j1 == (q + 1) * QQ) {  // the end of quarter q
                    const __m512 scq = _mm512_load_ps(sc + q * BLK + i0);
                    #pragma GCC unroll 8
                    for (int g = 0; g < G; ++g) {
                        fs[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[g], _mm512_set1_epi32(qlane[8 * g + q]))), scq, fs[g]);
                        acc[g] = _mm512_setzero_si512();
                    }
                }
            }
        }
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + g * BLK + i0, _mm512_mul_ps(fs[g], _mm512_set1_ps(0.25f * qscale[g])));   // s has room past n
    }
}

// acc[g] += sum_i p[g][i] v_i, D a multiple of 64: W values at a time for all rows (64 when G <= 4, else 32), the G x W/16
// accumulators in registers. A row's 8 codewords are decoded at once (codes8): with W 32 the second half waits in `half`
// for the next pass. Each 16 values share a quarter, whose scale is folded into the row's weights once:
// w[quarter][g][i] = p[g][i] sc[quarter][i] / 4, vector products over the block's rows
template<int G, bool LOADS> static void accum(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float*) {
    constexpr int W = G <= 4 ? 64 : 32, NV = W / 16;
    alignas(64) float sc[4 * BLK + 8], w[4 * G * BLK];
    alignas(64) int8_t half[W == 32 ? BLK * 32 : 1];   // W 32: each row's values 32..63 of the 64 just decoded
    Ahead* ah = f.ahead;
    scales(base, stride, n, f, sc);
    for (int q = 0; q < 4; ++q)
        for (int g = 0; g < G; ++g)
            for (int i = 0; i < n; i += 16) {   // rows past n: computed from stale scores, never read
                const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(p + g * BLK + i), _mm512_load_ps(sc + q * BLK + i));
                _mm512_store_ps(w + (q * G + g) * BLK + i, _mm512_mul_ps(x, _mm512_set1_ps(0.25f)));
            }
    for (int c = 0; c < (int)(f.D / W); ++c) {
        const float* wq[NV];                      // the quarter of each 16 values of the pass
        for (int k = 0; k < NV; ++k) wq[k] = w + f.blk[(W * c + 16 * k) / 8] * G * BLK;
        __m512 a[G][NV];
        for (int g = 0; g < G; ++g) for (int k = 0; k < NV; ++k) a[g][k] = _mm512_loadu_ps(acc + g * f.D + W * c + 16 * k);
        for (int i = 0; i < n; ++i) {
            if (c == 0 && (i & 1) == 0) ahead_rows(ah, 1);
            __m512 v[NV];
            if (W == 64) {
                const __m512i x = codes8<LOADS>(base + i * stride + 16 * c);
                for (int k = 0; k < NV; ++k) v[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(x, k)));
            } else {
                __m256i x;
                if (c % 2 == 0) {                 // this pass and the next: codewords 4c .. 4c + 7
                    const __m512i y = codes8<LOADS>(base + i * stride + 8 * c);
                    x = _mm512_castsi512_si256(y); _mm256_store_si256((__m256i*)(half + 32 * i), _mm512_extracti64x4_epi64(y, 1));
                } else x = _mm256_load_si256((const __m256i*)(half + 32 * i));
                v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x)));
                v[NV - 1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(x, 1)));
            }
            for (int g = 0; g < G; ++g)
                for (int k = 0; k < NV; ++k) a[g][k] = _mm512_fmadd_ps(_mm512_set1_ps(wq[k][g * BLK + i]), v[k], a[g][k]);
        }
        for (int g = 0; g < G; ++g) for (int k = 0; k < NV; ++k) _mm512_storeu_ps(acc + g * f.D + W * c + 16 * k, a[g][k]);
    }
}

// lanes 0..k-1 of 16 (the first k heads, or rows)
static inline __mmask16 head_mask(int k) { return k >= 16 ? (__mmask16)0xFFFF : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1); }
// accum for one query head (GQA 1) at D >= 128, in integers: the rows' weights w = p sc / 4 (as accum) rounded to 24 bits of
// their block's largest per quarter and split into three byte planes; four rows' codes interleaved by bytes, so that each
// dword holds one value of the four rows, and one vpdpbusd per plane sums the four rows' products (weights unsigned, values
// signed, |v| <= 15: no overflow in a block). Lane L of a pass's 64 values is the 16 values of quarter blk[L], so each row
// set's weight dword is spread by lane. Per block the planes rejoin in float (hi 2^16 + mid 2^8 + lo) and a 4 x 4 transpose
// of 128-bit lanes restores the values' order. The rounding is 2^-24 of the block's largest weight, float32's own. Measured
// against accum<1> (nbs/34_attention.cpu, "What the numbers say"): 10-12% less time at D 256, 5-8% at D 128; at D 64, where
// a row is one pass and the per-block work weighs more, and with more heads (float FMAs run on two ports, vpdpbusd not
// faster), accum stays. A negative scale (the encoder's least squares never makes one for a nonzero quarter, but nothing
// excludes it) sends the block to accum too.
template<bool LOADS> static void accum_int1(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float* scr) {
    const int D = (int)f.D, n4 = (n + 3) & ~3;
    if (D < 128) return accum<1, LOADS>(f, base, stride, n, p, acc, scr);
    alignas(64) float sc[4 * BLK + 8];
    alignas(64) int32_t wt[3][BLK / 4][4];      // [plane][row set][quarter]: the four rows' weight bytes
    float back[4];                              // each quarter's weight of one unit
    scales(base, stride, n, f, sc);
    for (int q = 0; q < 4; ++q) {
        __m512 mx = _mm512_setzero_ps();
        for (int i = 0; i < n; i += 16) {
            const __m512 scq = _mm512_load_ps(sc + q * BLK + i);
            if (_mm512_mask_cmp_ps_mask(head_mask(n - i), scq, _mm512_setzero_ps(), _CMP_LT_OQ)) return accum<1, LOADS>(f, base, stride, n, p, acc, scr);
            mx = _mm512_max_ps(mx, _mm512_maskz_mul_ps(head_mask(n - i), _mm512_loadu_ps(p + i), scq));
        }
        const float m = _mm512_reduce_max_ps(mx) * 0.25f, k = m > 0 ? 16777215.f / m : 0.f;
        back[q] = m / 16777215.f;
        for (int i = 0; i < n4; i += 16) {         // rows past n: weight 0 (their codes repeat row n - 1)
            const __m512 x = _mm512_maskz_mul_ps(head_mask(n - i), _mm512_loadu_ps(p + i), _mm512_load_ps(sc + q * BLK + i));
            const __m512i u = _mm512_cvtps_epu32(_mm512_min_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.25f * k)), _mm512_set1_ps(16777215.f)));
            for (int k8 = 0; k8 < 3; ++k8) {
                alignas(16) int32_t b4[4];
                _mm_store_si128((__m128i*)b4, _mm512_cvtepi32_epi8(_mm512_srli_epi32(u, 8 * k8)));
                for (int r = 0; r < 4 && i + 4 * r < n4; ++r) wt[k8][i / 4 + r][q] = b4[r];
            }
        }
    }
    for (int c = 0; c < D / 64; ++c) {
        int ql[4]; bool same = true;
        for (int L = 0; L < 4; ++L) { ql[L] = f.blk[(64 * c + 16 * L) / 8]; same &= ql[L] == ql[0]; }
        const __m512i lanes = _mm512_setr_epi32(ql[0], ql[0], ql[0], ql[0], ql[1], ql[1], ql[1], ql[1], ql[2], ql[2], ql[2], ql[2], ql[3], ql[3], ql[3], ql[3]);
        __m512i a[3][4];
        for (int k8 = 0; k8 < 3; ++k8) for (int m = 0; m < 4; ++m) a[k8][m] = _mm512_setzero_si512();
        for (int r = 0; r < n4 / 4; ++r) {
            if (c == 0) ahead_rows(f.ahead, 2);
            const uint8_t* row = base + 16 * c;
            const __m512i A = codes8<LOADS>(row + std::min(4 * r, n - 1) * stride), B = codes8<LOADS>(row + std::min(4 * r + 1, n - 1) * stride),
                          C = codes8<LOADS>(row + std::min(4 * r + 2, n - 1) * stride), E = codes8<LOADS>(row + std::min(4 * r + 3, n - 1) * stride);
            const __m512i ab0 = _mm512_unpacklo_epi8(A, B), ab1 = _mm512_unpackhi_epi8(A, B), ce0 = _mm512_unpacklo_epi8(C, E), ce1 = _mm512_unpackhi_epi8(C, E);
            const __m512i x[4] = {_mm512_unpacklo_epi16(ab0, ce0), _mm512_unpackhi_epi16(ab0, ce0), _mm512_unpacklo_epi16(ab1, ce1), _mm512_unpackhi_epi16(ab1, ce1)};
            for (int k8 = 0; k8 < 3; ++k8) {      // lane L, dword j of x[m]: value 16L + 4m + j of the four rows
                const int32_t* wr = wt[k8][r];
                const __m512i wv = same ? _mm512_set1_epi32(wr[ql[0]]) : _mm512_permutexvar_epi32(lanes, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)wr)));
                for (int m = 0; m < 4; ++m) a[k8][m] = _mm512_dpbusd_epi32(a[k8][m], wv, x[m]);
            }
        }
        const __m512 bk = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_loadu_ps(back)));
        __m512 y[4];
        for (int m = 0; m < 4; ++m) {
            const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[2][m]), _mm512_set1_ps(256.f), _mm512_cvtepi32_ps(a[1][m]));
            y[m] = _mm512_mul_ps(_mm512_fmadd_ps(hi, _mm512_set1_ps(256.f), _mm512_cvtepi32_ps(a[0][m])), bk);
        }
        const __m512 t0 = _mm512_shuffle_f32x4(y[0], y[1], 0x44), t1 = _mm512_shuffle_f32x4(y[0], y[1], 0xEE),
                     t2 = _mm512_shuffle_f32x4(y[2], y[3], 0x44), t3 = _mm512_shuffle_f32x4(y[2], y[3], 0xEE);
        const __m512 z[4] = {_mm512_shuffle_f32x4(t0, t2, 0x88), _mm512_shuffle_f32x4(t0, t2, 0xDD), _mm512_shuffle_f32x4(t1, t3, 0x88), _mm512_shuffle_f32x4(t1, t3, 0xDD)};
        for (int L = 0; L < 4; ++L) _mm512_storeu_ps(acc + 64 * c + 16 * L, _mm512_add_ps(_mm512_loadu_ps(acc + 64 * c + 16 * L), z[L]));
    }
}

// bf16 rows (the pages' bf16 format, and every format's exact window rows), D a multiple of 16: 16 values widened per
// load (twice the AVX2 path's 8), as avx::score/accum otherwise; other head sizes go to avx's
static inline __m512 bf16x16(const uint8_t* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16)); }
template<int G> static void score_bf16(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* q, float* s, float* sc) {
    if (f.D % 16) return avx::score<avx::BF16, G>(f, base, stride, n, q, s, sc);
    constexpr int RB = 8 / G;                 // RB rows x G heads: 8 sums share one hadd tree
    const int C = (int)(f.D / 16);
    int i = 0;
    avx::prefetch_rows(base, stride, f.row_bytes, 0, std::min(n, avx::AHEAD));
    for (; i < n; i += RB) {
        const int rb = std::min(RB, n - i);   // the block's last rows: fewer than RB
        avx::prefetch_rows(base, stride, f.row_bytes, std::min(n, i + avx::AHEAD), std::min(n, i + avx::AHEAD + RB));
        ahead_rows(f.ahead, (RB + 1) / 2);
        __m512 acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_ps();
        for (int c = 0; c < C; ++c)
            for (int r = 0; r < rb; ++r) {
                const __m512 k = bf16x16(base + (i + r) * stride + 32 * c);
                for (int g = 0; g < G; ++g) acc[r * G + g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * f.D + 16 * c), k, acc[r * G + g]);
            }
        alignas(32) float t[8];
        _mm256_store_ps(t, avx::hsum8(fold(acc[0]), fold(acc[1]), fold(acc[2]), fold(acc[3]), fold(acc[4]), fold(acc[5]), fold(acc[6]), fold(acc[7])));
        for (int r = 0; r < rb; ++r) for (int g = 0; g < G; ++g) s[g * BLK + i + r] = t[r * G + g];
    }
}
// acc[g] += sum_i p[g][i] v_i: CB chunks of 16 values at a time (G x CB <= 16 accumulators in registers), then one at a time
template<int G> static void accum_bf16(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float* sc) {
    if (f.D % 16) return avx::accum<avx::BF16, G>(f, base, stride, n, p, acc, sc);
    constexpr int CB = G == 1 ? 16 : G == 2 ? 8 : G <= 4 ? 4 : 2;
    const int C = (int)(f.D / 16);
    auto pass = [&](int c0, auto cb) {
        constexpr int K = decltype(cb)::value;
        __m512 a[G][K];
        for (int g = 0; g < G; ++g) for (int k = 0; k < K; ++k) a[g][k] = _mm512_loadu_ps(acc + g * f.D + 16 * (c0 + k));
        for (int i = 0; i < n; ++i) {
            if (c0 == 0) avx::prefetch_rows(base, stride, f.row_bytes, std::min(n, i + avx::AHEAD), std::min(n, i + avx::AHEAD + 1));
            if (c0 == 0 && (i & 1) == 0) ahead_rows(f.ahead, 1);
            const uint8_t* row = base + i * stride + 32 * c0;
            for (int k = 0; k < K; ++k) {
                const __m512 v = bf16x16(row + 32 * k);
                for (int g = 0; g < G; ++g) a[g][k] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * BLK + i]), v, a[g][k]);
            }
        }
        for (int g = 0; g < G; ++g) for (int k = 0; k < K; ++k) _mm512_storeu_ps(acc + g * f.D + 16 * (c0 + k), a[g][k]);
    };
    int c0 = 0;
    for (; c0 + CB <= C; c0 += CB) pass(c0, std::integral_constant<int, CB>{});
    for (; c0 < C; ++c0) pass(c0, std::integral_constant<int, 1>{});
}

// tbq rows 16 values at a time (blocks a multiple of 16 values, else avx's 8): the 16 indices (2 BITS bytes; tbq3 reads the
// 2 bytes before them too, the block's scale or earlier indices, to make 8: nothing outside the block is read) broadcast to
// every quadword, each lane's index moved to its low byte by one vpmultishiftqb (VBMI), and looked up by one register
// permute (vpermps reads 4 bits) from the centroids repeated with period 2^BITS over the 16 lanes, so the bits above an index
// need no mask. One load and two shuffles per 16 values, as bf16's widen and shift (accum_tbq, whose weights take the block's
// fp16 scale once per row and block; score_tbq, below, looks up 16 rows' values at a time instead)
// the byte offsets of rows i0 .. i0 + 15 for a gather (rows past n: the last row again)
static inline __m512i rows_off(int i0, int n, int64_t stride) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_mullo_epi32(_mm512_min_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(i0)), _mm512_set1_epi32(n - 1)),
                              _mm512_set1_epi32((int)stride));
}
template<int BITS> static inline __m512 tbq_table(const Fmt& f) {
    return _mm512_permutexvar_ps(_mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                  _mm512_set1_epi32((1 << BITS) - 1)), _mm512_loadu_ps(f.tab));
}
template<int BITS> static inline __m512i tbq_shifts() {      // lane j: the bit offset of index j in the broadcast word
    alignas(64) int32_t o[16];
    for (int j = 0; j < 16; ++j) o[j] = (BITS == 3 ? 16 : 0) + BITS * j;
    return _mm512_load_si512(o);
}
template<int BITS> static inline __m512 tbq16(const uint8_t* ix, __m512i shifts, __m512 tab) {   // ix: the 16 values' indices
    __m512i x;
    if (BITS == 2) { int32_t w; memcpy(&w, ix, 4); x = _mm512_set1_epi32(w); }
    else { int64_t w; memcpy(&w, ix - (BITS == 3 ? 2 : 0), 8); x = _mm512_set1_epi64(w); }
    return _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(shifts, x), tab);
}
// s[g][i] = q_g . k_i with 16 rows in the lanes (as hq-e8-2b's integer keys, so no sum across lanes): per group of 8 values
// one gather of the 16 rows' 4 index bytes that end with the group's (nothing outside the block is read), then per value a
// shift and the permute above give the 16 rows' centroids, and one FMA per head with the query value broadcast; per block
// the 16 rows' fp16 scales (one gather) multiply the block's sums
template<int BITS, int G> static void score_tbq(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* q, float* s, float* sc) {
    if (f.block % 8 || 16 * stride > INT32_MAX) return avx::score<avx::TBQ<BITS>, G>(f, base, stride, n, q, s, sc);
    const int NB = (int)(f.D / f.block), GPB = (int)(f.block / 8);
    const __m512 tab = tbq_table<BITS>(f);
    for (int i0 = 0; i0 < n; i0 += 16) {      // rows past n: the last row again (s has room for them; never read)
        ahead_rows(f.ahead, 8);
        const __m512i off = rows_off(i0, n, stride);
        __m512 tot[G];
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) tot[g] = _mm512_setzero_ps();
        for (int bk = 0; bk < NB; ++bk) {
            const uint8_t* bb = base + bk * f.block_bytes;
            __m512 acc[G];
            #pragma GCC unroll 8
            for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
            for (int c = 0; c < GPB; ++c) {
                const __m512i x = _mm512_i32gather_epi32(off, (const int*)(bb + c * BITS + BITS - 2), 1);   // the group's bits at 8 (4 - BITS)
                const float* qc = q + 8 * (bk * GPB + c);
                #pragma GCC unroll 8
                for (int t = 0; t < 8; ++t) {
                    const __m512 v = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 8 * (4 - BITS) + BITS * t), tab);
                    #pragma GCC unroll 8
                    for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(qc[g * f.D + t]), v, acc[g]);
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(off, (const int*)bb, 1)));   // the rows' block scales
            #pragma GCC unroll 8
            for (int g = 0; g < G; ++g) tot[g] = _mm512_fmadd_ps(acc[g], d, tot[g]);
        }
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + g * BLK + i0, tot[g]);
    }
}
// tbq2 keys as integers (hqkv.attention_cpu.integer_keys), with the query rounded to int8 as for hq-e8-2b's integer keys.
// Index i = lo + 2 hi picks centroid c_i = c_0 + (c_1 - c_0) lo + (c_2 - c_0) hi, exactly when c_0 + c_3 = c_1 + c_2 (levels
// symmetric about 0, as Lloyd-Max's are: int_tbq2 checks it), so a block's q . c = s (c_0 sum q8 + (c_1 - c_0) sum q8 lo +
// (c_2 - c_0) sum q8 hi), s the query's scale: two integer dots and a constant, with no level rounded to an integer grid.
// Sixteen rows in the lanes, as score_tbq: per 16 values the rows' 4 index bytes (rows16's loads, 64 values at a time, or
// a gather where a block is not a multiple of 64), then per 4 values one vpmultishiftqb puts each row's 4 indices in its 4 bytes, an AND gives lo, a shift and an AND hi, and two vpdpbusd per head
// (the query's 4 bytes broadcast) add them up in int32; per block two converts and three FMAs per head, with the rows' fp16
// scales. Against score_tbq's shift, permute and FMA per value and head: ~2x fewer instructions at 7 heads per KV head.
// X[k]'s lane r = dword k of the 16 bytes at p[r] (16 rows): 16 loads, four rows to a register (rows j, j + 4, j + 8,
// j + 12 in register j's 128-bit lanes), then two rounds of unpacks. On an EPYC (Zen 4) one gather of 16 dwords per 16
// values took a quarter of score_tbq2_int's samples (perf), as it did for hq-e8-2b's patterns (codes8's LOADS)
static inline void rows16(const uint8_t* const* p, __m512i X[4]) {
    __m512i R[4];
    for (int j = 0; j < 4; ++j) {
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)p[j]));
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i*)p[4 + j]), 1);
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i*)p[8 + j]), 2);
        R[j] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i*)p[12 + j]), 3);
    }
    const __m512i a = _mm512_unpacklo_epi32(R[0], R[1]), b = _mm512_unpackhi_epi32(R[0], R[1]);
    const __m512i c = _mm512_unpacklo_epi32(R[2], R[3]), d = _mm512_unpackhi_epi32(R[2], R[3]);
    X[0] = _mm512_unpacklo_epi64(a, c); X[1] = _mm512_unpackhi_epi64(a, c);
    X[2] = _mm512_unpacklo_epi64(b, d); X[3] = _mm512_unpackhi_epi64(b, d);
}
template<int G> static void score_tbq2_int(const Fmt& f, const uint8_t* base, int64_t stride, int n, const uint8_t* qs8, const float* qscale,
                                           const int32_t*, float* s, float*) {
    const int NB = (int)(f.D / f.block), CPB = (int)(f.block / 16);
    const float c0 = f.tab[0], dl = f.tab[1] - c0, dh = f.tab[2] - c0;
    alignas(64) float wl[8 * 8], wh[8 * 8], w0[8 * 8];   // [block][g]: each sum's weight, and the constant c_0 s sum q8
    for (int bk = 0; bk < NB; ++bk)
        for (int g = 0; g < G; ++g) {
            const int8_t* qb = (const int8_t*)qs8 + g * f.D + bk * f.block;
            int sum = 0;
            for (int j = 0; j < f.block; ++j) sum += qb[j];
            wl[bk * G + g] = dl * qscale[g]; wh[bk * G + g] = dh * qscale[g]; w0[bk * G + g] = c0 * qscale[g] * (float)sum;
        }
    const __m512i one = _mm512_set1_epi8(1);
    const bool loads = f.block % 64 == 0;      // 64 values' indices (16 bytes) of each row by loads (rows16), else a gather per 16
    for (int i0 = 0; i0 < n; i0 += 16) {      // rows past n: the last row again (s has room for them; never read)
        ahead_rows(f.ahead, 8);
        const __m512i off = rows_off(i0, n, stride);
        __m512 tot[G];
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) tot[g] = _mm512_setzero_ps();
        for (int bk = 0; bk < NB; ++bk) {
            const uint8_t* bb = base + bk * f.block_bytes;
            __m512i lo[G], hi[G];
            #pragma GCC unroll 8
            for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm512_setzero_si512();
            __m512i X[4];
            for (int c = 0; c < CPB; ++c) {
                if (loads && c % 4 == 0) {
                    const uint8_t* p[16];
                    for (int r = 0; r < 16; ++r) p[r] = base + std::min(i0 + r, n - 1) * stride + bk * f.block_bytes + 2 + 4 * c;
                    rows16(p, X);
                }
                // 16 indices of each row
                const __m512i x = loads ? X[c % 4] : _mm512_i32gather_epi32(off, (const int*)(bb + 2 + 4 * c), 1);
                const uint8_t* qc = qs8 + bk * f.block + 16 * c;
                #pragma GCC unroll 4
                for (int t = 0; t < 4; ++t) {
                    // byte k of a quadword (row 2m + k / 4): the bit offset of index 4 t + k % 4 (vpmultishiftqb reads 6 bits)
                    const __m512i m = _mm512_multishift_epi64_epi8(_mm512_add_epi8(_mm512_set1_epi64(0x2624222006040200), _mm512_set1_epi8((char)(8 * t))), x);
                    const __m512i l = _mm512_and_si512(m, one), h = _mm512_and_si512(_mm512_srli_epi16(m, 1), one);
                    #pragma GCC unroll 8
                    for (int g = 0; g < G; ++g) {
                        int32_t w; memcpy(&w, qc + g * f.D + 4 * t, 4);
                        const __m512i q4 = _mm512_set1_epi32(w);
                        lo[g] = _mm512_dpbusd_epi32(lo[g], l, q4); hi[g] = _mm512_dpbusd_epi32(hi[g], h, q4);
                    }
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(off, (const int*)bb, 1)));   // the rows' block scales
            #pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                const int k = bk * G + g;
                const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[g]), _mm512_set1_ps(wl[k]),
                                                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[g]), _mm512_set1_ps(wh[k]), _mm512_set1_ps(w0[k])));
                tot[g] = _mm512_fmadd_ps(v, d, tot[g]);
            }
        }
        #pragma GCC unroll 8
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + g * BLK + i0, tot[g]);
    }
}
// acc[g] += sum_i p[g][i] v_i: the weights p x the row's block scale made once per block, then CB chunks of 16 values at a
// time for all rows (G x CB <= 16 accumulators in registers), as accum_bf16
template<int BITS, int G> static void accum_tbq(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float* sc) {
    if (f.D % 16 || f.block % 16 || f.D / f.block > 8) return avx::accum<avx::TBQ<BITS>, G>(f, base, stride, n, p, acc, sc);
    constexpr int CB = G == 1 ? 16 : G == 2 ? 8 : G <= 4 ? 4 : 2;
    const int NB = (int)(f.D / f.block), CPB = (int)(f.block / 16), C = (int)(f.D / 16);
    alignas(64) float w[8 * 8 * BLK];          // [block][g][row]: at most 8 blocks (D 512, blocks of 64) x 8 heads
    for (int bk = 0; bk < NB; ++bk)
        for (int i = 0; i < n; ++i) {
            const float d = _cvtsh_ss(ld16(base + i * stride + bk * f.block_bytes));
            for (int g = 0; g < G; ++g) w[(bk * G + g) * BLK + i] = p[g * BLK + i] * d;
        }
    const __m512 tab = tbq_table<BITS>(f); const __m512i sh = tbq_shifts<BITS>();
    auto pass = [&](int c0, auto cb) {
        constexpr int K = decltype(cb)::value;
        int64_t off[K]; const float* wk[K];      // chunk c0 + k: its indices in the row, its block's weights
        for (int k = 0; k < K; ++k) { const int c = c0 + k, bk = c / CPB; off[k] = bk * f.block_bytes + 2 + 2 * BITS * (c - bk * CPB); wk[k] = w + bk * G * BLK; }
        const bool one = wk[0] == wk[K - 1];     // the K chunks share a block: each head's weight once per row
        __m512 a[G][K];
        for (int g = 0; g < G; ++g) for (int k = 0; k < K; ++k) a[g][k] = _mm512_loadu_ps(acc + g * f.D + 16 * (c0 + k));
        for (int i = 0; i < n; ++i) {
            if (c0 == 0 && (i & 1) == 0) ahead_rows(f.ahead, 1);
            const uint8_t* row = base + i * stride;
            __m512 w1[G];
            if (one) for (int g = 0; g < G; ++g) w1[g] = _mm512_set1_ps(wk[0][g * BLK + i]);
            for (int k = 0; k < K; ++k) {
                const __m512 v = tbq16<BITS>(row + off[k], sh, tab);
                for (int g = 0; g < G; ++g) a[g][k] = _mm512_fmadd_ps(one ? w1[g] : _mm512_set1_ps(wk[k][g * BLK + i]), v, a[g][k]);
            }
        }
        for (int g = 0; g < G; ++g) for (int k = 0; k < K; ++k) _mm512_storeu_ps(acc + g * f.D + 16 * (c0 + k), a[g][k]);
    };
    int c0 = 0;
    for (; c0 + CB <= C; c0 += CB) pass(c0, std::integral_constant<int, CB>{});
    for (; c0 < C; ++c0) pass(c0, std::integral_constant<int, 1>{});
}

// The online softmax of a block for G heads, 16 lanes at a time (as avx::softmax, whose exp polynomial it shares, lane for
// lane); the G rescale factors come from one vector exp
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
static void softmax(float* s, int n, int G, float* m, float* l, float* acc, int64_t D) {
    alignas(64) float mn[16], alpha[16];
    for (int g0 = 0; g0 < G; g0 += 16) {
        const int gn = std::min(16, G - g0);
        for (int g = 0; g < gn; ++g) {
            const float* sg = s + (g0 + g) * BLK;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int i = 0; i < n; i += 16) vmax = _mm512_mask_max_ps(vmax, head_mask(n - i), vmax, _mm512_loadu_ps(sg + i));
            const float mb = _mm512_reduce_max_ps(vmax);
            mn[g] = mb > m[g0 + g] ? mb : m[g0 + g];
        }
        const __mmask16 k = head_mask(gn);
        const __m512 mo = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, m + g0), vn = _mm512_mask_load_ps(_mm512_setzero_ps(), k, mn);
        // a head with nothing yet (m = -inf) gets 0, as expf(-inf) would
        _mm512_store_ps(alpha, _mm512_maskz_mov_ps(k & _mm512_cmp_ps_mask(mo, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ), exp512(_mm512_sub_ps(mo, vn))));
        for (int g = 0; g < gn; ++g) {
            float* sg = s + (g0 + g) * BLK; const __m512 vm = _mm512_set1_ps(mn[g]); __m512 vs = _mm512_setzero_ps();
            for (int i = 0; i < n; i += 16) {
                const __mmask16 t = head_mask(n - i);
                const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, sg + i), vm));
                _mm512_mask_storeu_ps(sg + i, t, e); vs = _mm512_mask_add_ps(vs, t, vs, e);
            }
            const int gg = g0 + g; const float a = alpha[g];
            l[gg] = l[gg] * a + _mm512_reduce_add_ps(vs); m[gg] = mn[g];
            if (a != 1.0f) {
                const __m512 va = _mm512_set1_ps(a); float* o = acc + gg * D;
                for (int64_t d = 0; d < D; d += 16) { const __mmask16 t = head_mask((int)(D - d)); _mm512_mask_storeu_ps(o + d, t, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(t, o + d))); }
            }
        }
    }
}
}  // namespace v512
#pragma GCC pop_options

// ---------------------------------------------------------------- AVX2 integer paths ('avx2-int8', 'avx-vnni'): hq-e8-2b rows as int8 in 256-bit registers
// For CPUs with AVX2 but no AVX-512 VNNI. The same int8 query as v512 (rounded once per call), here kept signed; the key
// codes are offset instead (4k + 11, 0..22, unsigned: vpmaddubsw and vpdpbusd multiply unsigned by signed bytes), which
// costs one byte add per 32 values and row, shared by the G heads. vpmaddubsw gives int16 sums of two products
// (|pair| <= 2 * 22 * 127 = 5588: no saturation), vpmaddwd with ones int32 sums of four. sum (4k + 11) q = sum 4k q +
// 11 sum q: the 11 sum q of each lane is fixed for the call (qlane, from quantize) and taken off once per row and head.
// Keys: one gather from the int8 table per 32 values and row (4 codewords), as ggml's AVX2 IQ2 dots look 4 codewords up
// per 32 values. Values: each codeword's 8 int8 values widened to float (vpmovsxbd from the table) and accumulated with
// the weight p * scale / 4 folded per row and quarter, as v512 does.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace v2 {

// s[g][i] = q_g . k_i for G heads (1-8), D >= 128 a multiple of 64. A row's 32-value chunk j holds codeword j of each
// quarter (the query is stored in that order by quantize), so lane l (4 values) is always in quarter l / 2 and the lanes add
// up over the whole row in integers: Dot sums 4 chunks (v2: vpmaddubsw pairs in int16, 4 x 5588 < 32767, then vpmaddwd;
// v2vnni: vpdpbusd), the lanes' offset (qlane) comes off, then one convert and one multiply by the quarter scales per row
// and head. Defined once here and compiled twice (v2, v2vnni), each under its own target.
#define HQKV_V2_SCORE                                                                                                          \
template<int G> static void score(const Fmt& f, const uint8_t* base, int64_t stride, int n, const uint8_t* qs8, const float* qscale, \
                                  const int32_t* qlane, float* s, float* sc) {                                                 \
    constexpr int RB = 8 / G;                                                                                                  \
    const int Qg = (int)(f.D / 32);                   /* codewords per quarter, chunks per row */                              \
    avx::E8::prep(base, stride, n, f, sc);                                                                                     \
    const __m256i lanes = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);                                                           \
    for (int i0 = 0; i0 < n; i0 += RB) {                                                                                       \
        const int rb = std::min(RB, n - i0);                                                                                   \
        __m256 acc[8];                                                                                                         \
        for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();                                                              \
        for (int r = 0; r < rb; ++r) {                                                                                         \
            if (((i0 + r) & 1) == 0) ahead_rows(f.ahead, 1);                                                                   \
            const uint8_t* row = base + (i0 + r) * stride;                                                                     \
            __m256i d[G];                                                                                                      \
            for (int g = 0; g < G; ++g) d[g] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i*)(qlane + 8 * g))); \
            for (int j0 = 0; j0 < Qg; j0 += 4) {                                                                               \
                const __m256i w = v2::words4(row, j0, Qg);                                                                     \
                __m256i h[G];                                                                                                  \
                for (int g = 0; g < G; ++g) h[g] = _mm256_setzero_si256();                                                     \
                for (int j = j0; j < std::min(Qg, j0 + 4); ++j) {                                                              \
                    const __m256i k = v2::keys(w, j - j0);                                                                     \
                    for (int g = 0; g < G; ++g) h[g] = Dot::step(h[g], k, _mm256_loadu_si256((const __m256i*)(qs8 + g * f.D + 32 * j))); \
                }                                                                                                              \
                for (int g = 0; g < G; ++g) d[g] = _mm256_add_epi32(d[g], Dot::widen(h[g]));                                  \
            }                                                                                                                  \
            const __m256 kl = _mm256_permutevar8x32_ps(_mm256_broadcast_ps((const __m128*)(sc + 4 * (i0 + r))), lanes);        \
            for (int g = 0; g < G; ++g) acc[r * G + g] = _mm256_mul_ps(_mm256_cvtepi32_ps(d[g]), kl);                          \
        }                                                                                                                      \
        alignas(32) float t[8];                                                                                                \
        _mm256_store_ps(t, avx::hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));                        \
        for (int r = 0; r < rb; ++r) for (int g = 0; g < G; ++g) s[g * BLK + i0 + r] = 0.25f * qscale[g] * t[r * G + g];      \
    }                                                                                                                          \
}
// codewords j0 + 0..3 of each quarter of a row, one 64-bit word per quarter: loads (and a shuffle) for D = 128, 256, else a gather
static inline __m256i words4(const uint8_t* row, int j0, int Qg) {
    if (Qg == 4) return _mm256_loadu_si256((const __m256i*)row);
    if (Qg == 8) {                                                                            // words 0, 2, 4, 6 or 1, 3, 5, 7
        const __m256i a = _mm256_loadu_si256((const __m256i*)row), b = _mm256_loadu_si256((const __m256i*)(row + 32));
        return _mm256_permute4x64_epi64(j0 ? _mm256_unpackhi_epi64(a, b) : _mm256_unpacklo_epi64(a, b), 0xd8);
    }
    return _mm256_i64gather_epi64((const long long*)(row + 2 * j0), _mm256_setr_epi64x(0, 2 * Qg, 4 * Qg, 6 * Qg), 1);
}
static inline __m256i keys(__m256i w, int j) {   // codeword j of each word -> 32 values as 4k + 11 (unsigned)
    const __m256i cw = _mm256_and_si256(_mm256_srlv_epi64(w, _mm256_set1_epi64x(16 * j)), _mm256_set1_epi64x(0xffff));
    return _mm256_add_epi8(_mm256_i64gather_epi64((const long long*)E8_INT8, cw, 8), _mm256_set1_epi8(11));
}
struct Dot {                                      // int16 pairs; widened to int32 after 4 chunks
    static inline __m256i step(__m256i h, __m256i k, __m256i q) { return _mm256_add_epi16(h, _mm256_maddubs_epi16(k, q)); }
    static inline __m256i widen(__m256i h) { return _mm256_madd_epi16(h, _mm256_set1_epi16(1)); }
};
HQKV_V2_SCORE

// acc[g] += sum_i p[g][i] v_i: CB codewords (8 values each) at a time for all rows, the G x CB accumulators in registers
template<int G> static void accum(const Fmt& f, const uint8_t* base, int64_t stride, int n, const float* p, float* acc, float* sc) {
    constexpr int CB = 8 / G;
    const int C = (int)(f.D / 8);
    avx::E8::prep(base, stride, n, f, sc);
    alignas(32) float w[BLK * 4 * G];
    for (int i = 0; i < n; ++i) for (int q = 0; q < 4; ++q) for (int g = 0; g < G; ++g) w[(4 * i + q) * G + g] = 0.25f * p[g * BLK + i] * sc[4 * i + q];
    for (int c0 = 0; c0 < C; c0 += CB) {          // C = D / 8 is a multiple of 8
        __m256 a[G][CB];
        for (int g = 0; g < G; ++g) for (int k = 0; k < CB; ++k) a[g][k] = _mm256_loadu_ps(acc + g * f.D + 8 * (c0 + k));
        int qk[CB]; for (int k = 0; k < CB; ++k) qk[k] = f.blk[c0 + k] * G;
        const bool one = qk[0] == qk[CB - 1];       // the CB codewords share a quarter: each head's weight once per row
        for (int i = 0; i < n; ++i) {
            if (c0 == 0 && (i & 1) == 0) ahead_rows(f.ahead, 1);
            const uint8_t* row = base + i * stride; const float* wi = w + 4 * G * i;
            __m256 w1[G];
            if (one) for (int g = 0; g < G; ++g) w1[g] = _mm256_broadcast_ss(wi + qk[0] + g);
            for (int k = 0; k < CB; ++k) {
                const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(E8_INT8 + ld16(row + 2 * (c0 + k))))));
                for (int g = 0; g < G; ++g) a[g][k] = _mm256_fmadd_ps(one ? w1[g] : _mm256_broadcast_ss(wi + qk[k] + g), v, a[g][k]);
            }
        }
        for (int g = 0; g < G; ++g) for (int k = 0; k < CB; ++k) _mm256_storeu_ps(acc + g * f.D + 8 * (c0 + k), a[g][k]);
    }
}
}  // namespace v2
#pragma GCC pop_options

// the same kernel with AVX-VNNI (vpdpbusd on 256-bit registers: Alder Lake and later, Zen 5): one instruction per 32 values
// and head instead of two. Compilers older than GCC 11 / clang 12 do not know AVX-VNNI: there 'avx-vnni' is refused (as on a
// CPU without it) and everything else builds.
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define HQKV_AVXVNNI 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace v2vnni {
struct Dot {
    static inline __m256i step(__m256i h, __m256i k, __m256i q) { return _mm256_dpbusd_avx_epi32(h, k, q); }
    static inline __m256i widen(__m256i h) { return h; }
};
HQKV_V2_SCORE
}  // namespace v2vnni
#pragma GCC pop_options
#else
namespace v2vnni { using v2::score; }        // never chosen (hqkv_cpu_isa refuses 4)
#endif

// ---------------------------------------------------------------- dispatch
typedef void (*ScoreFn)(const Fmt&, const uint8_t*, int64_t, int, const float*, float*, float*);
typedef void (*AccumFn)(const Fmt&, const uint8_t*, int64_t, int, const float*, float*, float*);
static ScoreFn SCORE[FMT_COUNT][8];            // per group size G = 1..8, at G - 1 (more heads: 8 at a time)
static AccumFn ACCUM[FMT_COUNT][8];
template<class F, int... Gs> static void fill_groups(int kind, std::integer_sequence<int, Gs...>) {
    ((SCORE[kind][Gs] = avx::score<F, Gs + 1>, ACCUM[kind][Gs] = avx::accum<F, Gs + 1>), ...);
}
template<class F> static void fill(int kind) { fill_groups<F>(kind, std::make_integer_sequence<int, 8>{}); }
template<int BITS, int... Gs> static void fill_tbq_keys(int kind, std::integer_sequence<int, Gs...>) {   // rows in the lanes
    ((SCORE[kind][Gs] = avx::score_tbq<BITS, Gs + 1>), ...);
}
template<int... Gs> static void fill_512(std::integer_sequence<int, Gs...>) {
    ((SCORE[FMT_BF16][Gs] = v512::score_bf16<Gs + 1>, ACCUM[FMT_BF16][Gs] = v512::accum_bf16<Gs + 1>), ...);
    ((SCORE[FMT_TBQ4][Gs] = v512::score_tbq<4, Gs + 1>, ACCUM[FMT_TBQ4][Gs] = v512::accum_tbq<4, Gs + 1>), ...);
    ((SCORE[FMT_TBQ3][Gs] = v512::score_tbq<3, Gs + 1>, ACCUM[FMT_TBQ3][Gs] = v512::accum_tbq<3, Gs + 1>), ...);
    ((SCORE[FMT_TBQ2][Gs] = v512::score_tbq<2, Gs + 1>, ACCUM[FMT_TBQ2][Gs] = v512::accum_tbq<2, Gs + 1>), ...);
}
static int g_isa = -1;                        // hqkv_cpu_isa's numbers; 2, 3, 4: hq-e8-2b rows as int8 (v512, v2, v2vnni), AVX2 for the rest
static int g_e8_loads = -1;                   // v512's hq-e8-2b patterns: 1 by scalar loads, 0 by a gather, -1 not chosen yet (hqkv_cpu_e8_loads)

extern "C" void hqkv_cpu_e8_init(const int8_t* grid4) {   // once, at load
    memcpy(E8_INT8, grid4, sizeof E8_INT8);
    for (int p = 0; p < 256; ++p) {             // low byte 1: no sign set, shift +1/4 (x4: +1), so 4|pattern| = image - 1
        int8_t b[8]; memcpy(b, &E8_INT8[(p << 8) | 1], 8);
        for (int k = 0; k < 8; ++k) b[k] = (int8_t)(b[k] - 1);
        memcpy(&E8_ABS4[p], b, 8);
    }
}
extern "C" void hqkv_cpu_e8_int8(uint64_t* out) { memcpy(out, E8_INT8, sizeof E8_INT8); }   // the table (for tests)

// how the AVX-512 kernels fetch hq-e8-2b patterns (codes8's LOADS): want 1 loads, 0 a gather, -1 by the CPU (loads on AMD);
// returns the choice
extern "C" int hqkv_cpu_e8_loads(int want) {
    __builtin_cpu_init();
    g_e8_loads = want >= 0 ? (want > 0) : __builtin_cpu_is("amd") ? 1 : 0;
    return g_e8_loads;
}
static inline int e8_row() { return g_isa == 2 && g_e8_loads == 1 ? 3 : g_isa - 2; }   // SCORE_E8_INT / ACCUM_E8_INT row

// want: -1 best available, 0 portable, 1 AVX2 (float), 2 AVX-512 VNNI, 3 AVX2 int8 (vpmaddubsw), 4 AVX-VNNI (-1: the CPU lacks it)
extern "C" int hqkv_cpu_isa(int want) {
    __builtin_cpu_init();
    bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    bool has512 = has && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
                  && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
#ifdef HQKV_AVXVNNI
    bool hasvnni = has && __builtin_cpu_supports("avxvnni");
#else
    bool hasvnni = false;
#endif
    if (((want == 1 || want == 3) && !has) || (want == 2 && !has512) || (want == 4 && !hasvnni)) return -1;
    g_isa = want == -1 ? (has512 ? 2 : hasvnni ? 4 : has ? 3 : 0) : want;
    if (g_isa >= 1) { fill<avx::BF16>(FMT_BF16); fill<avx::E8>(FMT_E8); fill<avx::Q8>(FMT_Q8_0); fill<avx::Q4>(FMT_Q4_0);
                      fill<avx::TBQ<4>>(FMT_TBQ4); fill<avx::TBQ<3>>(FMT_TBQ3); fill<avx::TBQ<2>>(FMT_TBQ2);
                      fill_tbq_keys<4>(FMT_TBQ4, std::make_integer_sequence<int, 8>{}); fill_tbq_keys<3>(FMT_TBQ3, std::make_integer_sequence<int, 8>{});
                      fill_tbq_keys<2>(FMT_TBQ2, std::make_integer_sequence<int, 8>{}); }
    if (g_isa == 2) fill_512(std::make_integer_sequence<int, 8>{});   // bf16 and tbq rows 16 values at a time
    if (g_e8_loads < 0) hqkv_cpu_e8_loads(-1);
    return g_isa;
}

struct Ctx { std::vector<float> s, tmp, sc; };   // scores [Gp, BLK], a decoded row, per-row scales [BLK, 4]
typedef void (*IntScoreFn)(const Fmt&, const uint8_t*, int64_t, int, const uint8_t*, const float*, const int32_t*, float*, float*);
#define HQKV_G8(f) {f<1>, f<2>, f<3>, f<4>, f<5>, f<6>, f<7>, f<8>}
#define HQKV_G8L(f, L) {f<1, L>, f<2, L>, f<3, L>, f<4, L>, f<5, L>, f<6, L>, f<7, L>, f<8, L>}
#define HQKV_A8L(L) {v512::accum_int1<L>, v512::accum<2, L>, v512::accum<3, L>, v512::accum<4, L>, v512::accum<5, L>, v512::accum<6, L>, v512::accum<7, L>, v512::accum<8, L>}
// rows 0-2: g_isa 2-4; row 3: v512 with the patterns by loads (g_e8_loads)
static const IntScoreFn SCORE_E8_INT[4][8] = {HQKV_G8L(v512::score, false), HQKV_G8(v2::score), HQKV_G8(v2vnni::score), HQKV_G8L(v512::score, true)};
static const IntScoreFn SCORE_TBQ2_INT[8] = HQKV_G8(v512::score_tbq2_int);
static const AccumFn ACCUM_E8_INT[4][8] = {HQKV_A8L(false),
                                             HQKV_G8(v2::accum), HQKV_G8(v2::accum), HQKV_A8L(true)};
#undef HQKV_G8
#undef HQKV_G8L
#undef HQKV_A8L
// hq-e8-2b as int8 (hqkv.attention_cpu.integer_keys): D a multiple of 64; on AVX2 (v2, v2vnni) also D >= 128, where they are
// faster than the AVX2 floats (at D 64 with GQA 4 they were 10-15% slower: per row and head overheads over 2 chunks)
static bool int_rows(const Fmt& f) { return f.kind == FMT_E8 && f.D % 64 == 0 && (g_isa == 2 || (g_isa >= 3 && f.D >= 128)); }
// the rows the kernels prefetch for the next head (Ahead): hq-e8-2b as integers, every row under 128 bytes, and bf16 rows
// (pages and windows: their first AHEAD rows of each head otherwise stalled on DRAM; on an EPYC Zen 4, 2 threads, 32K tokens,
// bf16 pages D 64 GQA 8 took 25.4 ms without, 7.9 ms with; D 64 GQA 1 7.8 -> 5.2 ms, D 128 GQA 1 10.9 -> 9.0 ms)
static int64_t ahead_of(const Fmt& f) { return int_rows(f) || (g_isa >= 1 && (f.row_bytes < 128 || f.kind == FMT_BF16)) ? f.row_bytes : 0; }
// tbq2 keys as int8 (v512::score_tbq2_int): AVX-512 VNNI and VBMI, blocks of 16 values, levels symmetric about 0, D a multiple
// of 32 (the query's rounding, quantize)
static bool int_tbq2(const Fmt& f) {
    return f.kind == FMT_TBQ2 && g_isa == 2 && f.D % 32 == 0 && f.block % 16 == 0 && f.D / f.block <= 8 && f.tab[0] + f.tab[3] == f.tab[1] + f.tab[2];
}
static bool int_keys(const Fmt& kf) { return int_rows(kf) || int_tbq2(kf); }
static bool int_values(const Fmt& vf) { return int_rows(vf); }

// a turned mean's score term: s[g][i] += qt_g . (cos, sin)((p + i) omega) for the rows of a block. Position 64 k + o: the
// query's pairs turned by 64 k omega once per run of rows with the same k (turn_base), then 16 rows at a time in the lanes.
// A pair whose angle moves little over a run (|32 omega| <= 2, hqkv.attention_cpu.TURN_RHO) is a polynomial there:
// cos and sin of (32 + 32 t) omega, t = (o - 32) / 32, by 16 terms of the series of exp(i 32 omega t) (what is left
// is below 2e-8 of the pair's weight), so those pairs' part of every row is one polynomial per run and head,
// P[m] = sum over their channels of c[ch] poly[ch][m], evaluated by Horner's rule: 15 FMAs per 16 rows and head.
// The other pairs (RoPE's fastest; turn_order's first turn_exact channels) read their values from the table: one FMA
// per channel. turn_tab is [D, TURN_W]: channel ch's values at o = 0..63, then 16 zeros, then its 16 coefficients
static const int TURN_W = 96, TURN_POLY = 80;
typedef float tvec __attribute__((vector_size(64)));
// GN heads (1 to 8) from qt's head g0: their turned coefficients c [GN, D], then each column of the table read once for all
template<int GN> __attribute__((always_inline)) static inline void turn_heads(const float* __restrict qt, const float* __restrict tab, const float* __restrict cb,
                                              int o0, int m, int64_t D, const int32_t* __restrict ord, int64_t nex, float* __restrict s) {
    const int64_t h = D / 2;
    alignas(64) float c[GN][512];
    for (int g = 0; g < GN; ++g) {
        const float* __restrict x = qt + g * D;
        for (int64_t j = 0; j < h; ++j) {
            c[g][j] = x[j] * cb[j] + x[h + j] * cb[h + j];
            c[g][h + j] = x[h + j] * cb[j] - x[j] * cb[h + j];
        }
    }
    tvec P[GN];
    for (int g = 0; g < GN; ++g) P[g] = tvec{};
    for (int64_t e = nex; e < D; ++e) {         // the slow pairs' channels: their polynomials, summed
        const int ch = ord[e]; tvec pv; memcpy(&pv, tab + ch * TURN_W + TURN_POLY, 64);
        for (int g = 0; g < GN; ++g) P[g] += c[g][ch] * pv;
    }
    alignas(64) float pc[GN][16];
    for (int g = 0; g < GN; ++g) memcpy(pc[g], &P[g], 64);
    const tvec lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int i = 0; i < m; i += 16) {
        tvec acc[GN];
        const tvec t = (lane + (float)(o0 + i - 32)) * (1.0f / 32);   // exact: small integers, a power of 2
        for (int g = 0; g < GN; ++g) {
            tvec a = tvec{} + pc[g][15];
            for (int k = 14; k >= 0; --k) a = a * t + pc[g][k];
            acc[g] = a;
        }
        const float* __restrict tt = tab + o0 + i;
        for (int64_t e = 0; e < nex; ++e) {
            const int ch = ord[e]; tvec tv; memcpy(&tv, tt + ch * TURN_W, 64);
            for (int g = 0; g < GN; ++g) acc[g] += c[g][ch] * tv;
        }
        const int r = std::min(16, m - i);
        for (int g = 0; g < GN; ++g) {
            float* sg = s + g * BLK + i;
            if (r == 16) { tvec x; memcpy(&x, sg, 64); x += acc[g]; memcpy(sg, &x, 64); }
            else for (int l = 0; l < r; ++l) sg[l] += acc[g][l];
        }
    }
}
__attribute__((target_clones("avx512f", "avx2", "default")))
static void turn_scores(const float* __restrict qt, const Args& a, int64_t p, int n, int64_t G, int64_t D, float* __restrict s) {
    for (int i0 = 0; i0 < n;) {
        const int64_t pos = p + i0, k = pos / 64, o0 = pos % 64;
        const int m = (int)std::min<int64_t>(n - i0, 64 - o0);
        const float* cb = a.turn_base + k * D;
        for (int64_t g0 = 0; g0 < G; g0 += 8) {      // G: 1 to 8, or a multiple of 8 (the plan pads it)
            const float* q = qt + g0 * D; float* sg = s + g0 * BLK + i0;
            switch (std::min<int64_t>(G - g0, 8)) {
#define HQKV_TURN(n) case n: turn_heads<n>(q, a.turn_tab, cb, (int)o0, m, D, a.turn_order, a.turn_exact, sg); break;
                HQKV_TURN(1) HQKV_TURN(2) HQKV_TURN(3) HQKV_TURN(4) HQKV_TURN(5) HQKV_TURN(6) HQKV_TURN(7) HQKV_TURN(8)
#undef HQKV_TURN
            }
        }
        i0 += m;
    }
}

// qu, qs: the int8 query and its scales (int_keys only); qt: this (sequence, KV head)'s turned-mean query side, rows from pos (or null)
static void block(Ctx& cx, const Fmt& kf, const Fmt& vf, const uint8_t* kb, int64_t ks, const uint8_t* vb, int64_t vs, int n,
                  const float* q, const uint8_t* qu, const float* qs, const int32_t* qk, int64_t G, int64_t D, float* m, float* l, float* acc,
                  const float* qt, int64_t pos, const Args& a) {
    float* s = cx.s.data();
    if (g_isa >= 1) {
        const int gi = (int)std::min<int64_t>(G, 8) - 1;   // G > 8: a multiple of 8 (the plan pads it), 8 heads at a time
        for (int64_t g0 = 0; g0 < G; g0 += 8)
            if (qu && int_keys(kf) && (kf.kind == FMT_E8 || 16 * ks <= INT32_MAX))   // else q: the rounded query in floats
                (kf.kind == FMT_E8 ? SCORE_E8_INT[e8_row()] : SCORE_TBQ2_INT)[gi](kf, kb, ks, n, qu + g0 * D, qs + g0, qk + 8 * g0, s + g0 * BLK, cx.sc.data());
            else SCORE[kf.kind][gi](kf, kb, ks, n, q + g0 * D, s + g0 * BLK, cx.sc.data());
        if (qt) turn_scores(qt, a, pos, n, G, D, s);
        if (g_isa == 2) v512::softmax(s, n, (int)G, m, l, acc, D); else avx::softmax(s, n, (int)G, m, l, acc, D);
        for (int64_t g0 = 0; g0 < G; g0 += 8) (int_values(vf) ? ACCUM_E8_INT[e8_row()] : ACCUM[vf.kind])[gi](vf, vb, vs, n, s + g0 * BLK, acc + g0 * D, cx.sc.data());
    } else {
        score_scalar(kf, kb, ks, n, q, (int)G, s, cx.tmp.data());
        if (qt) turn_scores(qt, a, pos, n, G, D, s);
        softmax_scalar(s, n, (int)G, m, l, acc, D);
        accum_scalar(vf, vb, vs, n, s, (int)G, acc, cx.tmp.data());
    }
}

struct Blk { const uint8_t *kb, *vb; int64_t ks, vs, n; const Fmt *kf, *vf; const int64_t *ko, *vo; };   // the first token; ks/vs: bytes a token, ko/vo: each head's offset

// the next block of positions [p, p1) of sequence b: one span (sinks, codes, ring) and one page
static Blk next_block(const Args& a, int64_t b, int64_t p, int64_t p1) {
    const int64_t H = a.H, D = a.D, P = a.page_size, BL = a.block_rows, BW = a.window_block_rows;
    const int64_t L = a.spans[4 * b], s = a.spans[4 * b + 1], r = a.spans[4 * b + 2], slot = a.spans[4 * b + 3];
    Blk k;
    if (p < s) {                               // sinks: exact rows of the window
        k.n = std::min<int64_t>({BW, s - p, p1 - p});
        int64_t o = (slot * a.S + p) * H * D;
        k.kb = (const uint8_t*)(a.k_sink + o); k.vb = (const uint8_t*)(a.v_sink + o);
    } else if (p < r) {                        // codes, in place in their page
        int64_t pg = a.indices[a.indptr[b] + p / P], t = p % P;
        k.n = std::min<int64_t>({BL, P - t, r - p, p1 - p});
        k.kb = a.k_pages + (pg * P + t) * a.k_tok_bytes; k.ks = a.k_tok_bytes; k.ko = a.k_off;
        k.vb = a.v_pages + (pg * P + t) * a.v_tok_bytes; k.vs = a.v_tok_bytes; k.vo = a.v_off;
        k.kf = a.kf; k.vf = a.vf;
        return k;
    } else {                                   // the recent ring: position p in row p % R
        int64_t t = p % a.R;
        k.n = std::min<int64_t>({BW, a.R - t, L - p, p1 - p});
        int64_t o = (slot * a.R + t) * H * D;
        k.kb = (const uint8_t*)(a.k_ring + o); k.vb = (const uint8_t*)(a.v_ring + o);
    }
    k.ks = k.vs = H * D * 2; k.ko = k.vo = a.w_off; k.kf = k.vf = a.wf;   // window rows: bf16, heads one after another
    return k;
}

// positions [p0, p1) of sequence b for every KV head: a block's rows of all heads are contiguous, so heads are the inner loop
// (the kernels prefetch a few rows ahead of the one they read)
// qu, qs, qf, qk: the int8 queries, their scales, the rounded float queries and their quarter sums (integer keys), else null
static void item(const Args& a, Ctx& cx, int64_t b, int64_t p0, int64_t p1, float* w, const uint8_t* qu, const float* qs, const float* qf,
                 const int32_t* qk) {
    const int64_t H = a.H, D = a.D, G = a.Gp, W = G * (D + 2);
    for (int64_t h = 0; h < H; ++h) {
        float* wh = w + h * W;
        for (int64_t g = 0; g < G; ++g) { wh[g] = -INFINITY; wh[G + g] = 0; }
        memset(wh + 2 * G, 0, sizeof(float) * G * D);
    }
    if (p0 >= p1) return;
    Blk cur = next_block(a, b, p0, p1), nxt = cur;
    Ahead* ah = a.kf[0].ahead;
    for (int64_t p = p0; p < p1;) {
        int64_t pn = p + cur.n;
        if (pn < p1) nxt = next_block(a, b, pn, p1);
        for (int64_t h = 0; h < H; ++h) {
            ahead_rows(ah, BLK);                  // what the last head's kernels did not get to (a window block's)
            if (ah) ah->n = ah->next = 0;
            if (ah && (h + 1 < H || pn < p1)) {           // the next head's rows: this block's, or the next block's first head's
                const Blk& t = h + 1 < H ? cur : nxt; const int64_t hn = (h + 1) % H;
                ah->base[0] = t.kb + t.ko[hn]; ah->base[1] = t.vb + t.vo[hn]; ah->stride[0] = t.ks; ah->stride[1] = t.vs;
                ah->rb[0] = ahead_of(t.kf[hn]); ah->rb[1] = ahead_of(t.vf[hn]);
                ah->n = (int)t.n;
            }
            float* wh = w + h * W;
            const bool iq = qu && int_keys(a.kf[h]);   // this head's keys as integers: the rounded query, as its codes see it
            block(cx, cur.kf[h], cur.vf[h], cur.kb + cur.ko[h], cur.ks, cur.vb + cur.vo[h], cur.vs, (int)cur.n,
                  (iq ? qf : a.q) + (b * H + h) * G * D, iq ? qu + (b * H + h) * G * D : nullptr, iq ? qs + (b * H + h) * G : nullptr,
                  iq ? qk + (b * H + h) * G * 8 : nullptr, G, D, wh, wh + G, wh + 2 * G, a.qt ? a.qt + (b * H + h) * G * D : nullptr, p, a);
        }
        p = pn; cur = nxt;
    }
}

// One call's shared state: each head's formats (block boundaries included), the items of each sequence and the int8 queries
struct Call {
    Args a; int64_t W = 0, items = 0; bool quant = false;
    std::vector<Fmt> kf, vf, wf; std::vector<int64_t> woff, first;   // first[b] .. first[b+1]-1: sequence b's items, one per split
    std::vector<uint8_t> qu; std::vector<float> qs, qf; std::vector<int32_t> qk;
    explicit Call(const Args* ap) : a(*ap) {
        if (g_isa < 0) hqkv_cpu_isa(-1);
        const int64_t H = a.H, G = a.Gp, D = a.D; W = G * (D + 2);
        kf.resize(H); vf.resize(H); wf.resize(H); woff.resize(H);
        const size_t mirrored = offsetof(Fmt, nsb);   // the size of one ctypes _Fmt
        for (int64_t h = 0; h < H; ++h) {
            kf[h] = with_blocks((const char*)ap->kf + h * mirrored); vf[h] = with_blocks((const char*)ap->vf + h * mirrored);
            memset(&wf[h], 0, sizeof(Fmt)); wf[h].kind = FMT_BF16; wf[h].D = D; wf[h].row_bytes = 2 * D; wf[h].nsb = 1; wf[h].sb[1] = (int32_t)(D / 8);
            woff[h] = h * 2 * D;
        }
        a.kf = kf.data(); a.vf = vf.data(); a.wf = wf.data(); a.w_off = woff.data();
        auto rows_for = [&](int64_t bytes) { return std::max<int64_t>(8, std::min<int64_t>(BLK, (131072 / bytes) & ~7)); };   // bytes: a token
        a.block_rows = rows_for(a.k_tok_bytes + a.v_tok_bytes); a.window_block_rows = rows_for(4 * H * D);   // window rows are bf16
        first.assign(a.B + 1, 0);
        for (int64_t b = 0; b < a.B; ++b) { int64_t L = a.spans[4 * b]; first[b + 1] = first[b] + std::max<int64_t>(1, (L + a.chunk - 1) / a.chunk); }
        items = first[a.B];
        for (int64_t h = 0; h < H; ++h) quant = quant || int_keys(kf[h]);   // the int8 query of every (sequence, KV head), once per call
        if (quant) { qu.resize(a.B * H * G * D); qs.resize(a.B * H * G); qf.resize(a.B * H * G * D); qk.resize(a.B * H * G * 8); }
    }
};

// merge the splits of (b, h) by log-sum-exp into a.out (and a.lse)
static void merge(const Call& c, const float* work, int64_t bh) {
    const Args& a = c.a; const int64_t H = a.H, G = a.Gp, D = a.D, W = c.W;
    int64_t b = bh / H, h = bh % H, ns = c.first[b + 1] - c.first[b];
    const float* w0 = work + (c.first[b] * H + h) * W;
    const int64_t st = H * W;                   // from one split to the next
    float* o = a.out + bh * G * D;
    for (int64_t g = 0; g < G; ++g) {
        float M = -INFINITY, Lsum = 0;
        for (int64_t j = 0; j < ns; ++j) M = std::max(M, w0[j * st + g]);
        for (int64_t d = 0; d < D; ++d) o[g * D + d] = 0;
        for (int64_t j = 0; j < ns; ++j) {
            const float* w = w0 + j * st; if (w[G + g] == 0) continue;
            float e = expf(w[g] - M); Lsum += e * w[G + g];
            for (int64_t d = 0; d < D; ++d) o[g * D + d] += e * w[2 * G + g * D + d];
        }
        if (Lsum == 0) { if (a.lse) a.lse[bh * G + g] = -INFINITY; continue; }   // an empty sequence (a prefill with no prefix): o = 0
        float inv = 1.0f / Lsum;
        for (int64_t d = 0; d < D; ++d) o[g * D + d] *= inv;
        if (a.lse) a.lse[bh * G + g] = M + logf(Lsum);
    }
}

// the call's work, run by every thread of a parallel region (or by one thread alone): its `omp for` loops share the
// queries' rounding, the items and the merge among the region's threads, with a barrier after each
static void run_call(Call& c, float* work) {
    const Args& a = c.a; const int64_t H = a.H, G = a.Gp, D = a.D;
    Ctx cx; cx.s.assign(G * BLK, 0.f); cx.tmp.assign(D, 0.f); cx.sc.assign(4 * BLK, 0.f);
    Ahead ahead; std::vector<Fmt> tk(c.kf), tv(c.vf), tw(c.wf);   // this thread's formats: the same, with its prefetch cursor
    for (auto* fs : {&tk, &tv, &tw}) for (Fmt& f : *fs) f.ahead = &ahead;
    Args ta = a; ta.kf = tk.data(); ta.vf = tv.data(); ta.wf = tw.data();
    if (c.quant) {
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < a.B * H; ++bh)
            quantize(a.q + bh * G * D, G, D, g_isa == 2, c.qu.data() + bh * G * D, c.qs.data() + bh * G, c.qf.data() + bh * G * D,
                     c.qk.data() + bh * G * 8);
    }
    #pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < c.items; ++it) {
        int64_t b = std::upper_bound(c.first.begin(), c.first.end(), it) - c.first.begin() - 1, j = it - c.first[b];
        int64_t L = a.spans[4 * b], p0 = j * a.chunk, p1 = std::min(L, p0 + a.chunk);
        item(ta, cx, b, p0, p1, work + it * H * c.W, c.quant ? c.qu.data() : nullptr, c.qs.data(), c.quant ? c.qf.data() : nullptr,
             c.qk.data());
    }
    #pragma omp for schedule(static)
    for (int64_t bh = 0; bh < a.B * H; ++bh) merge(c, work, bh);
}

extern "C" int hqkv_cpu_decode(const Args* ap, float* work) {   // work: [items, H, Gp, D + 2] floats
    Call c(ap);
    #pragma omp parallel num_threads((int)c.a.threads) if (c.a.threads > 1)
    run_call(c, work);
    return 0;
}

// ---------------------------------------------------------------- a folded decode step (hqkv.layer_maps): maps, window write, decode, map back
// One call per layer of a decode-only step: the model's q/k/v as they are, the layer's fixed maps (key profile, rotations,
// softmax scale folded into one D x D matrix each, per KV head or shared; null: the identity) applied here, and the new
// tokens written to the window (a sink row or the ring's), instead of four small torch products and an indexed write.
struct Fold {                                 // mirrored by hqkv.attention_cpu._Fold
    const float* q; const float* k; const float* v;   // the model's rows, float32: q [B, H, G, D], k and v [B, H, D]
    const float* qm; const float* km; const float* kb; const float* vm; const float* om;   // [Hm, D, D] (kb: [H, D]) or null
    int64_t qm_heads, km_heads, vm_heads, om_heads;   // Hm: 1 (one map for every KV head) or H
    int64_t G;                                // query heads per KV head (the plan pads to Gp)
    const int64_t* lanes; const int64_t* pos; // [B]: each row's window lane and position (null: no window)
    int64_t* lens;                            // the window's lengths [slots]: pos + 1 after the write
    float* out;                               // [B, H, G, D]: the output, back in the model's domain
    float scale;                              // the softmax scale, when qs is null
    // a turned mean (hqkv.keyprofile): the new keys lose RoPE_p(tm) before their map, and the kernel adds its score term
    // from a.qt, which is written here (turn_query of q, times the scale); tm null: none
    const float* tm;                          // [H, D]: the keys' mean before RoPE (KeyProfile.turn of the layer)
    const double* omega;                      // [D/2]: RoPE's angle per position of each channel pair
    const int64_t* tpos;                      // [B]: each row's position
    float tscale;                             // the softmax scale (qs has it folded in; the term's side does not)
    // queries and keys: x qm (km), times qs (ks) [H, D] per channel (null: the scale; keys: 1), then x rm (the codecs'
    // rotation [Hm, D, D], or null), plus kb. rm, vm and om are one tensor for every layer of a codec (the engine's maps):
    // they stay in cache, where a matrix per layer and head was read from memory at every layer of every step
    const float* qs; const float* ks; const float* rm;
    int64_t rm_heads;
};

// y = x M (M [D, D] row-major) or y = s x (M null), D <= 512: accumulated in a local row (restrict: no aliasing, so the
// j loop vectorizes), for the CPU at hand
__attribute__((target_clones("avx512f", "avx2", "default")))
static void map_row(const float* __restrict x, const float* __restrict M, float s, int64_t D, float* __restrict y) {
    if (!M) { for (int64_t j = 0; j < D; ++j) y[j] = s * x[j]; return; }
    alignas(64) float acc[512];
    for (int64_t j = 0; j < D; ++j) acc[j] = 0;
    for (int64_t i = 0; i < D; ++i) {
        const float xi = x[i]; const float* __restrict r = M + i * D;
        for (int64_t j = 0; j < D; ++j) acc[j] += xi * r[j];
    }
    for (int64_t j = 0; j < D; ++j) y[j] = acc[j];
}
// y[r] = x[r] M for R rows that share M (D a multiple of 16): two rows and 32 columns at a time with the sums in registers
// (map_row keeps its row in memory, a load and a store per FMA) and M read once per two rows; each sum adds the same
// products in the same order as map_row's
typedef float vf16 __attribute__((vector_size(64)));
template<int JN, bool TWO> static inline void map_block(const float* __restrict x0, const float* __restrict x1, const float* __restrict M,
                                                        int64_t D, int64_t j0, float* __restrict y0, float* __restrict y1) {   // TWO: x1, y1 too
    vf16 a0[JN], a1[JN];
    for (int k = 0; k < JN; ++k) { a0[k] = vf16{}; a1[k] = vf16{}; }
    for (int64_t i = 0; i < D; ++i) {
        const float u = x0[i], w = TWO ? x1[i] : 0.0f;
        for (int k = 0; k < JN; ++k) { vf16 m; memcpy(&m, M + i * D + j0 + 16 * k, 64); a0[k] += u * m; if (TWO) a1[k] += w * m; }
    }
    for (int k = 0; k < JN; ++k) { memcpy(y0 + j0 + 16 * k, &a0[k], 64); if (TWO) memcpy(y1 + j0 + 16 * k, &a1[k], 64); }
}
template<bool TWO> static inline void map_pair(const float* x0, const float* x1, const float* M, int64_t D, float* y0, float* y1) {
    int64_t j0 = 0;
    for (; j0 + 32 <= D; j0 += 32) map_block<2, TWO>(x0, x1, M, D, j0, y0, y1);
    for (; j0 < D; j0 += 16) map_block<1, TWO>(x0, x1, M, D, j0, y0, y1);
}
__attribute__((target_clones("avx512f", "avx2", "default")))
static void map_rows(const float* __restrict x, int64_t R, int64_t xs, const float* __restrict M, float s, int64_t D, float* __restrict y, int64_t ys) {
    if (!M || D % 16) { for (int64_t r = 0; r < R; ++r) map_row(x + r * xs, M, s, D, y + r * ys); return; }
    int64_t r = 0;
    for (; r + 2 <= R; r += 2) map_pair<true>(x + r * xs, x + (r + 1) * xs, M, D, y + r * ys, y + (r + 1) * ys);
    if (r < R) map_pair<false>(x + r * xs, nullptr, M, D, y + r * ys, nullptr);   // an odd row alone (keys and values: one each)
}
// y = (x M1 (M1 null: x)) times sv [D] (null: s), then times M2 (null: as is), for R rows: map_rows twice, 8 rows at a time
static void map3(const float* x, int64_t R, int64_t xs, const float* M1, const float* sv, float s, const float* M2, int64_t D,
                 float* y, int64_t ys) {
    alignas(64) float t[8 * 512];
    for (int64_t r0 = 0; r0 < R; r0 += 8) {
        const int64_t n = std::min<int64_t>(8, R - r0), us = M2 ? D : ys;
        float* u = M2 ? t : y + r0 * ys;
        map_rows(x + r0 * xs, n, xs, M1, M1 || sv ? 1.0f : s, D, u, us);
        if (sv || (M1 && s != 1.0f))
            for (int64_t r = 0; r < n; ++r) for (int64_t d = 0; d < D; ++d) u[r * us + d] *= sv ? sv[d] : s;
        if (M2) map_rows(t, n, D, M2, 1.0f, D, y + r0 * ys, ys);
    }
}
static inline uint16_t f2bf(float f) {       // float -> bf16, round to nearest even (as torch's .to(bfloat16))
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// the maps before the kernel, one item of (b, h): it = 2 (b H + h) writes the new key and value rows to the window (kd:
// the token's row of its heads there, null: no window; cs, sn: the token's angles for a turned mean), it + 1 maps the
// G queries and writes the turned mean's query side
static void fold_item(const Args& a, const Fold& f, int64_t it, uint16_t* kd, uint16_t* vd, const float* cs, const float* sn) {
    const int64_t H = a.H, Gp = a.Gp, G = f.G, D = a.D, DD = D * D, hf = D / 2, b = it / 2 / H, h = it / 2 % H;
    const float* rm = f.rm ? f.rm + (f.rm_heads > 1 ? h : 0) * DD : nullptr;
    float y[512], x[512];
    if (it % 2 == 0) {
        if (!kd) return;
        const float* kh = f.k + (b * H + h) * D;
        if (f.tm) {                        // k - RoPE_p(tm): pairs (j, j + D/2) turned by p omega_j
            const float* m = f.tm + h * D;
            for (int64_t j = 0; j < hf; ++j) {
                x[j] = kh[j] - (m[j] * cs[j] - m[hf + j] * sn[j]); x[hf + j] = kh[hf + j] - (m[hf + j] * cs[j] + m[j] * sn[j]);
            }
            kh = x;
        }
        map3(kh, 1, D, f.km ? f.km + (f.km_heads > 1 ? h : 0) * DD : nullptr, f.ks ? f.ks + h * D : nullptr, 1.0f, rm, D, y, D);
        for (int64_t d = 0; d < D; ++d) kd[h * D + d] = f2bf(f.kb ? y[d] + f.kb[h * D + d] : y[d]);
        map_rows(f.v + (b * H + h) * D, 1, D, f.vm ? f.vm + (f.vm_heads > 1 ? h : 0) * DD : nullptr, 1.0f, D, y, D);
        for (int64_t d = 0; d < D; ++d) vd[h * D + d] = f2bf(y[d]);
        return;
    }
    const float* qm = f.qm ? f.qm + (f.qm_heads > 1 ? h : 0) * DD : nullptr;   // the G heads share qm, qs and rm
    map3(f.q + (b * H + h) * G * D, G, D, qm, f.qs ? f.qs + h * D : nullptr, f.scale, rm, D, const_cast<float*>(a.q) + (b * H + h) * Gp * D, D);
    if (!f.tm) return;
    const float* m = f.tm + h * D;         // the term's query side: per pair (q m + q' m', q' m - q m'), times the scale
    for (int64_t g = 0; g < G; ++g) {
        const float* q = f.q + ((b * H + h) * G + g) * D; float* t = const_cast<float*>(a.qt) + ((b * H + h) * Gp + g) * D;
        for (int64_t j = 0; j < hf; ++j) {
            t[j] = f.tscale * (q[j] * m[j] + q[hf + j] * m[hf + j]); t[hf + j] = f.tscale * (q[hf + j] * m[j] - q[j] * m[hf + j]);
        }
    }
}

// the output map after the kernel (a.out holds the values' domain): one (b, h)
static void unfold_item(const Args& a, const Fold& f, int64_t bh) {
    const int64_t D = a.D;
    const float* om = f.om ? f.om + (f.om_heads > 1 ? bh % a.H : 0) * D * D : nullptr;
    map_rows(a.out + bh * a.Gp * D, f.G, D, om, 1.0f, D, f.out + bh * f.G * D, D);
}

// One parallel region for the whole layer, even at batch 1: its threads share the maps of the (b, h) pairs (a matrix per
// KV head, read from memory every step: the weights evict them), then the kernel's phases, then the output maps
extern "C" int hqkv_cpu_decode_folded(const Args* ap, const Fold* fp, float* work) {   // a.q: the padded query buffer, written here
    const Args& a = *ap; const Fold& f = *fp;
    const int64_t B = a.B, H = a.H, G = f.G, D = a.D, hf = D / 2;
    if (D > 512 || G > a.Gp) return 1;
    uint16_t* ks = const_cast<uint16_t*>(a.k_sink); uint16_t* vs = const_cast<uint16_t*>(a.v_sink);
    uint16_t* kr = const_cast<uint16_t*>(a.k_ring); uint16_t* vr = const_cast<uint16_t*>(a.v_ring);
    std::vector<uint16_t*> kd(B, nullptr), vd(B, nullptr);   // each token's window rows, as window_put places them (none: no window)
    std::vector<float> cs(f.tm && f.lanes ? B * hf : 0), sn(cs.size());
    for (int64_t b = 0; b < B && f.lanes; ++b) {
        const int64_t lane = f.lanes[b], p = f.pos[b];
        if (p < a.S) { kd[b] = ks + (lane * a.S + p) * H * D; vd[b] = vs + (lane * a.S + p) * H * D; }
        else if (a.R) { kd[b] = kr + (lane * a.R + p % a.R) * H * D; vd[b] = vr + (lane * a.R + p % a.R) * H * D; }
        f.lens[lane] = p + 1;
        if (f.tm && kd[b])                 // the token's angles, once for its heads
            for (int64_t j = 0; j < hf; ++j) { const double t = (double)f.tpos[b] * f.omega[j]; cs[b * hf + j] = (float)cos(t); sn[b * hf + j] = (float)sin(t); }
    }
    Call c(ap);
    #pragma omp parallel num_threads((int)a.threads) if (a.threads > 1)
    {
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < 2 * B * H; ++it) {
            const int64_t b = it / 2 / H;
            fold_item(a, f, it, kd[b], vd[b], cs.empty() ? nullptr : cs.data() + b * hf, sn.empty() ? nullptr : sn.data() + b * hf);
        }
        run_call(c, work);
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) unfold_item(a, f, bh);
    }
    return 0;
}
