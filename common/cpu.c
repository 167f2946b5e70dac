/* cpu.c: kvs_cpu_detect, the one CPU-feature detection of kvserve (see common.h). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#if defined(__x86_64__) || defined(__i386__)
static void cpuid1(uint32_t *ecx) {
    uint32_t eax, ebx, edx;
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(*ecx), "=d"(edx) : "a"(1), "c"(0));
}

/* The register state the OS saves (XCR0), 0 when xgetbv is not usable (no OSXSAVE). */
static uint32_t os_saved_state(void) {
    uint32_t ecx;
    cpuid1(&ecx);
    if (!(ecx & (1u << 27))) return 0;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}

/* l lowered to the level named by the environment variable KVSERVE_SIMD_MAX ("scalar", "avx2"), if set: a
 * test hook that runs this CPU as an older one would run (unknown values and higher levels change nothing). */
static kvs_cpu_level cap_level(kvs_cpu_level l) {
    const char *cap = getenv("KVSERVE_SIMD_MAX");
    if (!cap) return l;
    if (strcmp(cap, "scalar") == 0) return KVS_CPU_SCALAR;
    if (strcmp(cap, "avx2") == 0 && l > KVS_CPU_AVX2) return KVS_CPU_AVX2;
    return l;
}
#endif

kvs_cpu_level kvs_cpu_detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    uint32_t xcr0 = os_saved_state(), ecx;
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && (xcr0 & 0x6) == 0x6;
    /* f16c has no __builtin_cpu_supports name in every compiler: read it from cpuid leaf 1 (ecx bit 29) */
    cpuid1(&ecx);
    bool f16c = (ecx >> 29) & 1;
    if (!avx2 || !f16c) return KVS_CPU_SCALAR;
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vnni") &&
                  (xcr0 & 0xE6) == 0xE6; /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM */
    return cap_level(avx512 ? KVS_CPU_AVX512 : KVS_CPU_AVX2);
#else
    return KVS_CPU_SCALAR;
#endif
}
