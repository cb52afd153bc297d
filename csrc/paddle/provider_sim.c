/* The Paddle device types of the simulated chips (anychip_ascend, anychip_kunlun,
 * anychip_hygon): the bridge over the plugin.h face of the simulated chip ANYCHIP_PADDLE
 * names (the Ascend when it is unset), anychip/_lib/lib<chip>_sim, two directories up from
 * paddle_custom_device/. */
#define ANYCHIP_PADDLE_SIMULATORS "../anychip/_lib/lib%s_sim" ANYCHIP_EXT_SUFFIX
/* the reductions a chip's library lacks (HCCL and BKCL: average; BKCL: int8) run on the engine */
#define ANYCHIP_PADDLE_CCL "../anychip/_lib/libanychip_ccl" ANYCHIP_EXT_SUFFIX
/* and phi kernels from the face's kernel table (plugin.h minor 1: the simulator's own tensor
 * kernels), as for any C plugin that fills one (anychip/paddle/kernels.c) */
#define ANYCHIP_PADDLE_KERNELS 1
#define ANYCHIP_PADDLE_BEFORE_GEMM give_blas
#include "anychip/paddle/bridge.c"

#include <link.h>

/* The simulator's GEMM calls a CBLAS when given one, as a chip's runtime links its BLAS; in
 * anychip's own processes the Python side hands over NumPy's OpenBLAS. Paddle imports NumPy,
 * so its OpenBLAS is loaded here too: found among the loaded objects at the first matmul. */
static int find_numpy_blas(struct dl_phdr_info *info, size_t size, void *path)
{
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libscipy_openblas64_"))
        return 0;
    snprintf(path, PATH_MAX, "%s", info->dlpi_name);
    return 1;
}

static void give_blas(void)
{
    static atomic_int given;
    if (atomic_exchange(&given, 1))
        return;
    char path[PATH_MAX] = "";
    dl_iterate_phdr(find_numpy_blas, path);
    void *blas = path[0] ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void (*set)(void *, void *) = (void (*)(void *, void *))dlsym(g_lib, "anychip_simk_set_blas");
    void *sgemm = blas ? dlsym(blas, "scipy_cblas_sgemm64_") : NULL;
    void *dgemm = blas ? dlsym(blas, "scipy_cblas_dgemm64_") : NULL;
    if (set && sgemm && dgemm)
        set(sgemm, dgemm);
}
