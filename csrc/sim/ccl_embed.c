/*
 * The collective engine (csrc/ccl/ccl.c) compiled into a simulator library for its
 * HCCL / BKCL / RCCL front ends. ccl.h marks the engine's functions with default
 * visibility (libanychip_ccl exports them); inside a simulator library they stay
 * private, like the core, so the library exports only vendor names and the
 * documented anychip_sim_* controls. The macro below turns the engine's
 * visibility("default") attributes into visibility("hidden") for this file only.
 */
#define visibility(v) visibility("hidden")
#include "ccl/ccl.c"
