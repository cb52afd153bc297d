// What the PyTorch extension's two parts share: device.cpp (the PrivateUse1 device) and
// c10d.cpp (the c10d backend's direct ops). See docs/torch.md.
#pragma once

#include <cstdint>
#include <string>

#include <torch/extension.h>

#include "anychip/plugin.h"

namespace anychip_torch {

extern anychip_plugin g_plugin;                 // the device's plugin.h library (set by _init)
const std::string &backend_name();              // the anychip backend the device is
std::string status_text(anychip_status st);     // a status code with the library's text and detail
int dtype_of(at::ScalarType t);                 // plugin.h's anychip_dtype of a torch dtype; -1: none
// the handle of `device`'s current torch stream; *id: its id (0: the device's default stream)
void *current_stream_of(int device, int64_t *id);
// whether Python may be entered from any thread: false once the interpreter is finalizing
// (a thread other than the main one that takes the GIL then is ended inside our frames)
inline bool python_usable()
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsInitialized() && !Py_IsFinalizing();
#else
    return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}
// c10d.cpp's names in the extension module
void bind_c10d(pybind11::module_ &m);

int device_count();                             // the devices the backend has here
// the CPU fallback of device.cpp (inputs copied to the host, the CPU kernel, outputs copied back)
void fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
// random.cpp: the device's generators (its Philox seed and offset) and its names in the module
const at::Generator &default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
void bind_random(pybind11::module_ &m);

}  // namespace anychip_torch
