/*
 * sampler_kernels.c: scalar and AVX2 kernels of the sampler (see sampler_kernels.h).
 */
#include "engine/kernels/sampler_kernels.h"
#include "common/common.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ENG_SMP_X86 1
#endif

/* Constants of the exponential: e^x = 2^n * e^r with n = round(x * log2(e)), r = x - n * ln2 (ln2 split in a
 * high part exact in float and a low correction), e^r by a degree-7 Taylor-like minimax polynomial (Cephes
 * expf coefficients). */
#define EXP_HI 88.0f
#define EXP_LO (-87.3365478515625f) /* below: the result would be denormal; flushed to 0 */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define P0 1.9875691500E-4f
#define P1 1.3981999507E-3f
#define P2 8.3334519073E-3f
#define P3 4.1665795894E-2f
#define P4 1.6666665459E-1f
#define P5 5.0000001201E-1f

float eng_smp_exp(float x) {
    if (!(x >= EXP_LO)) return 0.0f; /* also NaN and -inf */
    if (x > EXP_HI) x = EXP_HI;
    float n = rintf(x * LOG2E);
    float r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    float rr = r * r;
    float y = p * rr + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
}

/* ---- scalar ------------------------------------------------------------------------------------------------ */
static float max_scalar(const float *x, int32_t n) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static int32_t first_eq_scalar(const float *x, int32_t n, float v) {
    for (int32_t i = 0; i < n; i++) if (x[i] == v) return i;
    return -1;
}

static double expsum_scalar(const float *x, int32_t n, float m, float scale, float *out) {
    double s = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float e = eng_smp_exp((x[i] - m) * scale);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

void eng_smp_kernels_scalar(eng_smp_kernels *k) {
    k->max = max_scalar;
    k->first_eq = first_eq_scalar;
    k->expsum = expsum_scalar;
    k->name = "scalar";
}

/* ---- AVX2 -------------------------------------------------------------------------------------------------- */
#ifdef ENG_SMP_X86
#define AVX2 __attribute__((target("avx2")))

AVX2 static float max_avx2(const float *x, int32_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m); /* NaN in the first operand: m */
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float r = -INFINITY;
    for (int j = 0; j < 8; j++) r = lanes[j] > r ? lanes[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

AVX2 static int32_t first_eq_avx2(const float *x, int32_t n, float v) {
    const __m256 vv = _mm256_set1_ps(v);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++) if (x[i] == v) return i;
    return -1;
}

/* The same operations as eng_smp_exp, eight at a time. */
AVX2 static inline __m256 exp8(__m256 x) {
    const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ); /* false for NaN */
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)); /* keeps the exponent bits in range for invalid lanes */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
    __m256 p = _mm256_set1_ps(P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(P5));
    __m256 rr = _mm256_mul_ps(r, r);
    __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, rr), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    return _mm256_and_ps(y, valid);
}

AVX2 static double expsum_avx2(const float *x, int32_t n, float m, float scale, float *out) {
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs));
        if (out) _mm256_storeu_ps(out + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) {
        float e = eng_smp_exp((x[i] - m) * scale);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

bool eng_smp_kernels_avx2(eng_smp_kernels *k) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return false;
    k->max = max_avx2;
    k->first_eq = first_eq_avx2;
    k->expsum = expsum_avx2;
    k->name = "avx2";
    return true;
}
#else
bool eng_smp_kernels_avx2(eng_smp_kernels *k) {
    (void)k;
    return false;
}
#endif

void eng_smp_kernels_for(eng_smp_kernels *k, int simd) {
    if (simd < KVS_CPU_AVX2 || !eng_smp_kernels_avx2(k)) eng_smp_kernels_scalar(k);
}

void eng_smp_kernels_best(eng_smp_kernels *k) { eng_smp_kernels_for(k, kvs_cpu_detect()); }
