// The one C++ piece of the simulated chips' Paddle kernels (kernels_sim.c): a kernel that
// cannot run raises, as Paddle's own kernels do, and Paddle turns the exception into the
// op's Python error. The C callers are compiled with -fexceptions, so it unwinds through them.
#include <stdexcept>

extern "C" void anychip_paddle_raise(const char *msg) __attribute__((noreturn));

extern "C" void anychip_paddle_raise(const char *msg) { throw std::runtime_error(msg); }
