/* XPU runtime include name; the codes (XPUError_t) are declared in xpu/runtime.h */
#include "runtime.h"
