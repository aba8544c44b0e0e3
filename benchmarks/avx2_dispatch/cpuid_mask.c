// LD_PRELOAD shim: this process and its children see an AVX2-only x86-64 CPU through CPUID.
//
// Hidden: AVX-512 (all subsets), AVX512_VNNI, AVX-VNNI and the other CPUID leaf 7 subleaf 1 extensions,
// AVX512_BF16/FP16, AMX, and the AVX-512/AMX state components of leaf 0xD. Kept: SSE*, AVX, AVX2, FMA,
// F16C. Libraries that pick kernels at run time (oneDNN, XNNPACK, ONNX Runtime's MLAS, torch) then run
// their AVX2 code on this CPU, which is how an AVX2-only CPU such as an AMD EPYC (Zen 2/3) runs them.
//
// How: CPUID faulting (arch_prctl ARCH_SET_CPUID, Linux; the CPU or hypervisor must offer it, flag
// "cpuid_fault" in /proc/cpuinfo). Every CPUID instruction then raises SIGSEGV; the handler turns faulting
// off for this thread, runs the real CPUID, turns it back on, clears the hidden bits and steps over the
// instruction. The setting is per thread, inherited by new threads and processes, reset by execve (the
// constructor runs again in every process that preloads this library).
// Used by benchmarks/avx2_dispatch/run.py; not part of the library.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static int set_cpuid_enabled(int enabled) {
    return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, (unsigned long)enabled);
}

static void hide_features(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
    if (leaf == 7 && subleaf == 0) {
        // EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL.
        r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
        // ECX: AVX512_VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ.
        r[2] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        // EDX: AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8.
        r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && subleaf == 1) {
        // AVX-VNNI, AVX512_BF16, AMX_FP16, AVX-IFMA, AVX-VNNI-INT8, AVX-NE-CONVERT, ...: none on AVX2 CPUs.
        r[0] = r[1] = r[2] = r[3] = 0;
    } else if (leaf == 0xD && subleaf == 0) {
        // XSAVE state components: opmask, ZMM_Hi256, Hi16_ZMM, XTILECFG, XTILEDATA.
        r[0] &= ~(BIT(5) | BIT(6) | BIT(7) | BIT(17) | BIT(18));
    } else if (leaf == 0x1D || leaf == 0x1E) {
        r[0] = r[1] = r[2] = r[3] = 0;  // AMX tile and TMUL information
    }
}

static void on_sigsegv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    (void)info;
    if (ip[0] != 0x0F || ip[1] != 0xA2) {
        // Not a CPUID: a genuine crash. Restore the default action; the instruction faults again.
        signal(sig, SIG_DFL);
        return;
    }
    uint32_t leaf = (uint32_t)regs[REG_RAX], subleaf = (uint32_t)regs[REG_RCX], r[4];
    set_cpuid_enabled(1);
    __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]);
    set_cpuid_enabled(0);
    hide_features(leaf, subleaf, r);
    regs[REG_RAX] = r[0];
    regs[REG_RBX] = r[1];
    regs[REG_RCX] = r[2];
    regs[REG_RDX] = r[3];
    regs[REG_RIP] += 2;  // CPUID is 0F A2
}

__attribute__((constructor)) static void install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigsegv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, NULL) == 0) {
        set_cpuid_enabled(0);
    }
}
