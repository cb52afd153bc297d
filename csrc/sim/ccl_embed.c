/*
 * The collective engine (csrc/ccl/ccl.c) compiled into a simulator library for its
 * HCCL / BKCL / RCCL front ends, with private symbols (ccl.h lets an embedder define
 * CCL_EXPORT), so the library exports only vendor names and the documented
 * anychip_sim_* controls, like the core.
 */
#pragma GCC optimize("O3")      /* as libanychip_ccl is built; the core stays at -O2 */
#define CCL_EXPORT __attribute__((visibility("hidden")))
#include "ccl/ccl.c"
