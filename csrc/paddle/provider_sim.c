/* The Paddle device types of the simulated chips (anychip_ascend, anychip_kunlun,
 * anychip_hygon): the bridge over the plugin.h face of the simulated chip ANYCHIP_PADDLE
 * names (the Ascend when it is unset), anychip/_lib/lib<chip>_sim, two directories up from
 * paddle_custom_device/. */
#define ANYCHIP_PADDLE_SIMULATORS "../anychip/_lib/lib%s_sim" ANYCHIP_EXT_SUFFIX
/* the reductions a chip's library lacks (HCCL and BKCL: average; BKCL: int8) run on the engine */
#define ANYCHIP_PADDLE_CCL "../anychip/_lib/libanychip_ccl" ANYCHIP_EXT_SUFFIX
/* and phi kernels on the simulator's own tensor kernels (csrc/paddle/kernels_sim.c) */
#define ANYCHIP_PADDLE_KERNELS 1
#include "anychip/paddle/bridge.c"
#include "paddle/kernels_sim.c"
