/* The Paddle device types of the simulated chips (anychip_ascend, anychip_kunlun,
 * anychip_hygon): the bridge over the plugin.h face of the simulated chip ANYCHIP_PADDLE
 * names (the Ascend when it is unset), anychip/_lib/lib<chip>_sim, two directories up from
 * paddle_custom_device/. setup.py links this file with the bridge's units, every unit compiled
 * with
 *   -DANYCHIP_PADDLE_SIMULATORS='"../anychip/_lib/lib%s_sim<EXT_SUFFIX>"'
 * the reductions a chip's library lacks (HCCL and BKCL: average; BKCL: int8) on the engine,
 *   -DANYCHIP_PADDLE_CCL='"../anychip/_lib/libanychip_ccl<EXT_SUFFIX>"'
 * and phi kernels from the face's kernel table (plugin.h minor 1: the simulator's own tensor
 * kernels), as for any C plugin that fills one (kernels.c),
 *   -DANYCHIP_PADDLE_KERNELS=1
 * This file adds the BLAS the simulator's GEMM calls (bridge_before_gemm, below). */
#include "bridge.h"

#include <link.h>

/* The simulator's GEMM calls a CBLAS when given one, as a chip's runtime links its BLAS. It runs
 * on the simulated stream's worker thread, so that BLAS must not start threads of its own: a
 * threaded GEMM splits each call between the worker and its pool and returns when the last
 * thread is done, and on a machine whose cores Paddle's threads and the stream workers already
 * keep busy every call waits for a pool thread to be scheduled (a small LM's step took 0.4 to
 * 5 s with NumPy's OpenBLAS on 2 cores, 80 ms single-threaded). OpenBLAS's thread count is
 * process-wide (its `_local` setter too, in its pthreads builds), so setting it would change
 * NumPy's own matmul for the whole program. MKL's is per thread: Paddle's x86 wheels load
 * libmklml_intel.so for their CPU kernels, so its GEMM is used, one thread on each stream
 * worker (MKL_Set_Num_Threads_Local); dimensions beyond its 32-bit ints, and wheels without
 * MKL, take NumPy's OpenBLAS (ILP64), found among the loaded objects at the first matmul. */
typedef void (*cblas_s64)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                          int64_t, float, float *, int64_t);
typedef void (*cblas_d64)(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t,
                          const double *, int64_t, double, double *, int64_t);
typedef void (*cblas_s32)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                          int);
typedef void (*cblas_d32)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                          double *, int);
static cblas_s64 g_ob_sgemm;
static cblas_d64 g_ob_dgemm;
static cblas_s32 g_mkl_sgemm;
static cblas_d32 g_mkl_dgemm;
static int (*g_mkl_local)(int);
static __thread int t_one_thread;

static int find_lib(struct dl_phdr_info *info, size_t size, void *want)
{
    (void)size;
    char *path = want;                    /* in: the name's fragment; out: the loaded path */
    if (!info->dlpi_name || !strstr(info->dlpi_name, path))
        return 0;
    snprintf(path, PATH_MAX, "%s", info->dlpi_name);
    return 1;
}

static void *loaded(const char *fragment)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fragment);
    return dl_iterate_phdr(find_lib, path) ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
}

static int fits(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc)
{
    return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX;
}

static void mkl_sgemm(int order, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (!fits(m, n, k, lda, ldb, ldc)) {
        g_ob_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if (!t_one_thread)
        t_one_thread = (g_mkl_local(1), 1);
    g_mkl_sgemm(order, ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

static void mkl_dgemm(int order, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                      int64_t lda, const double *b, int64_t ldb, double beta, double *c, int64_t ldc)
{
    if (!fits(m, n, k, lda, ldb, ldc)) {
        g_ob_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if (!t_one_thread)
        t_one_thread = (g_mkl_local(1), 1);
    g_mkl_dgemm(order, ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* before a matmul's first GEMM (kernels.c): the simulator's GEMM is given a BLAS, once */
void bridge_before_gemm(void)
{
    static atomic_int given;
    if (atomic_exchange(&given, 1))
        return;
    void (*set)(void *, void *) = (void (*)(void *, void *))dlsym(g_lib, "anychip_simk_set_blas");
    void *ob = loaded("libscipy_openblas64_");
    g_ob_sgemm = ob ? (cblas_s64)dlsym(ob, "scipy_cblas_sgemm64_") : NULL;
    g_ob_dgemm = ob ? (cblas_d64)dlsym(ob, "scipy_cblas_dgemm64_") : NULL;
    if (!set || !g_ob_sgemm || !g_ob_dgemm)
        return;                           /* the simulator's own GEMM loop */
    void *mkl = NULL;
    const char *want = getenv("ANYCHIP_PADDLE_BLAS");
    if (!want || strcmp(want, "openblas") != 0) {
        /* Paddle opens MKL at its first CPU kernel that needs it: beside its libphi_core.so */
        char path[PATH_MAX] = "libphi_core.so";
        if (!(mkl = loaded("libmklml_intel.so")) && dl_iterate_phdr(find_lib, path)) {
            char *slash = strrchr(path, '/');
            if (slash && (size_t)(slash - path) + sizeof "/libmklml_intel.so" <= sizeof path) {
                strcpy(slash, "/libmklml_intel.so");
                mkl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            }
        }
    }
    g_mkl_sgemm = mkl ? (cblas_s32)dlsym(mkl, "cblas_sgemm") : NULL;
    g_mkl_dgemm = mkl ? (cblas_d32)dlsym(mkl, "cblas_dgemm") : NULL;
    g_mkl_local = mkl ? (int (*)(int))dlsym(mkl, "MKL_Set_Num_Threads_Local") : NULL; /* by value (the lower-case name is the Fortran one) */
    if (g_mkl_sgemm && g_mkl_dgemm && g_mkl_local)
        set((void *)mkl_sgemm, (void *)mkl_dgemm);
    else
        set((void *)g_ob_sgemm, (void *)g_ob_dgemm);
}
