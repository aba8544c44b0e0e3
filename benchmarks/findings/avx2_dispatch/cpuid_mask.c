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
// Handlers others install for SIGSEGV (Python's faulthandler, which pytest turns on, and crash reporters)
// are kept aside through sigaction()/signal() wrappers and called for every fault that is not a CPUID.
// Used by benchmarks/findings/avx2_dispatch/run.py; not part of the library.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
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

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static int installed;              // our handler holds SIGSEGV
static struct sigaction chained;   // what the process asked SIGSEGV to do (SIG_DFL until it asks)

static int call_real_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real_sigaction(sig, act, old);
}

// The process's own SIGSEGV handler is recorded, not installed: ours stays and forwards to it.
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig != SIGSEGV || !installed) return call_real_sigaction(sig, act, old);
    if (old) *old = chained;
    if (act) chained = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

static void forward(int sig, siginfo_t *info, void *context) {
    if (chained.sa_flags & SA_SIGINFO) {
        chained.sa_sigaction(sig, info, context);
    } else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN) {
        chained.sa_handler(sig);
    } else {
        // Default action: give SIGSEGV back to the kernel; the faulting instruction runs again and ends
        // the process as it would have without the shim.
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        installed = 0;
        call_real_sigaction(sig, &dfl, NULL);
    }
}

static void on_sigsegv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    // A faulting CPUID arrives as SI_KERNEL; page faults (SEGV_MAPERR, ...) and kill()/raise() do not,
    // and their RIP may not even be readable.
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    if (info->si_code != SI_KERNEL || ip[0] != 0x0F || ip[1] != 0xA2) {
        forward(sig, info, context);
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
    memset(&chained, 0, sizeof chained);
    chained.sa_handler = SIG_DFL;
    action.sa_sigaction = on_sigsegv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (call_real_sigaction(SIGSEGV, &action, NULL) == 0) {
        installed = 1;
        set_cpuid_enabled(0);
    }
}
