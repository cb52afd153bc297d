# placeholder, replaced shortly by the real registry
BUILTIN_BACKENDS = {
    "cuda": "anychip.devices.cuda:CUDAPlugin",
    "opencl": "anychip.devices.opencl:OpenCLPlugin",
    "ascend": "anychip.devices.ascend:AscendPlugin",
    "kunlun": "anychip.devices.kunlun:KunlunPlugin",
    "hygon": "anychip.devices.hygon:HygonPlugin",
    "cpu": "anychip.devices.cpu:CPUPlugin",
}
