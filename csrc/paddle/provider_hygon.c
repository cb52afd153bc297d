/* The Paddle device type anychip_hygon: the bridge over the simulated chip's plugin.h face
 * (anychip/_lib/libhygon_sim, two directories up from paddle_custom_device/). */
#define ANYCHIP_PADDLE_TARGET "../anychip/_lib/libhygon_sim" ANYCHIP_EXT_SUFFIX
#include "anychip/paddle/bridge.c"
