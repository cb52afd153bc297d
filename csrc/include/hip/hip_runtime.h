/* ROCm include name; the runtime declarations are in hip/hip_runtime_api.h */
#include "hip_runtime_api.h"
