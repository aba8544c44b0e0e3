// Prints what CPUID reports for the features benchmarks/findings/avx2_dispatch hides and keeps, one "name 0|1"
// per line, and whether CPUID faulting is on in this process (the shim took effect). Used by run.py.
#include <asm/prctl.h>
#include <cpuid.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    unsigned a, b, c, d;
    __cpuid_count(1, 0, a, b, c, d);
    printf("avx %u\nfma %u\n", (c >> 28) & 1, (c >> 12) & 1);
    __cpuid_count(7, 0, a, b, c, d);
    printf("avx2 %u\navx512f %u\navx512_vnni %u\namx_int8 %u\n", (b >> 5) & 1, (b >> 16) & 1, (c >> 11) & 1,
           (d >> 25) & 1);
    __cpuid_count(7, 1, a, b, c, d);
    printf("avx_vnni %u\n", (a >> 4) & 1);
    // ARCH_GET_CPUID returns 0 while CPUID faults (the shim's state), 1 when CPUID runs natively.
    printf("faulting %d\n", syscall(SYS_arch_prctl, ARCH_GET_CPUID, 0) == 0);
    return 0;
}
