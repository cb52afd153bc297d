/* The Paddle device type anychip_ascend: the bridge over the simulated chip's plugin.h face
 * (anychip/_lib/libascend_sim, two directories up from paddle_custom_device/). */
#define ANYCHIP_PADDLE_TARGET "../anychip/_lib/libascend_sim" ANYCHIP_EXT_SUFFIX
#include "anychip/paddle/bridge.c"
