// PrivateUse1's hooks for anychip's device (see docs/torch.md; device.h lists the parts): whether
// it is available, each device's generators (random.cpp), pinned memory and storage resizing
// (allocator.cpp).
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "device.h"

namespace anychip_torch {
namespace {

struct Hooks final : at::PrivateUse1HooksInterface {
    bool isBuilt() const override { return true; }
    bool isAvailable() const override { return g_ready && g_count > 0; }
    bool hasPrimaryContext(c10::DeviceIndex device) const override { return g_ready && device >= 0 && device < g_count; }
    // each device's own generators (random.cpp)
    const at::Generator &getDefaultGenerator(c10::DeviceIndex device) const override
    {
        return anychip_torch::default_generator(device);
    }
    at::Generator getNewGenerator(c10::DeviceIndex device) const override { return anychip_torch::new_generator(device); }
    at::Device getDeviceFromPtr(void *data) const override
    {
        (void)data;
        return at::Device(kType, static_cast<c10::DeviceIndex>(current_device()));
    }
    bool isPinnedPtr(const void *data) const override { return is_pinned(data); }
    c10::Allocator *getPinnedMemoryAllocator() const override { return pinned_allocator(); }
    void resizePrivateUse1Bytes(const c10::Storage &storage, size_t newsize) const override
    {
        resize_bytes(storage.unsafeGetStorageImpl(), newsize);
    }
};

Hooks g_hooks;

}  // namespace

void register_hooks() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }

}  // namespace anychip_torch
