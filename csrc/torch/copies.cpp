// Copies of anychip's PrivateUse1 device (see docs/torch.md; device.h lists the parts): between
// the host and the device (pinned host memory without waiting), within a device, between devices,
// and through the host where the layouts differ.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include "anychip/plugin.h"
#include "device.h"

namespace anychip_torch {

// ---- copies ----------------------------------------------------------------------------

namespace {

// copy_async on `stream`, bracketed by the profiler's events while it traces the device
anychip_status traced_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind,
                           void *stream)
{
    TraceMark mark = trace_begin(device, stream);
    anychip_status st = g_plugin.copy_async(device, dst, src, nbytes, kind, static_cast<anychip_stream>(stream));
    trace_end(mark, TraceKind::memcpy,
              kind == ANYCHIP_COPY_H2D ? "Memcpy HtoD" : kind == ANYCHIP_COPY_D2H ? "Memcpy DtoH" : "Memcpy DtoD",
              "copy_async");
    return st;
}

}  // namespace

// Whether the host reads and writes device memory itself: the plugin's device memory is host
// memory (plugin.h's ANYCHIP_PLUGIN_HOST_MEMORY), and the profiler is not tracing the device (its
// trace shows each copy as the stream's work, so they stay on the stream then). The host then
// waits for the stream, as it waits for a copy it enqueued, and moves the bytes itself: no
// hand-off to the library's stream, and the CPU fallback's inputs are not copied at all.
bool host_addressable()
{
    return (g_plugin.flags & ANYCHIP_PLUGIN_HOST_MEMORY) && !g_tracing.load(std::memory_order_relaxed);
}

// nbytes between host and device (or within one device) on the device's current stream;
// host memory is not kept alive, so a copy touching the host is waited for
void raw_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind)
{
    if (nbytes == 0)
        return;
    void *s = current_stream(device);
    if (kind != ANYCHIP_COPY_D2D && host_addressable()) {
        sync_stream(device, s);         // (the stream's earlier work on the device memory is done)
        std::memmove(dst, src, nbytes);
        return;
    }
    const char *what = kind == ANYCHIP_COPY_H2D ? "copy (host to device)"
                       : kind == ANYCHIP_COPY_D2H ? "copy (device to host)" : "copy (device to device)";
    if (g_plugin.copy_async) {
        check(traced_copy(device, dst, src, nbytes, kind, s), what, device);
        if (kind != ANYCHIP_COPY_D2D)
            sync_stream(device, s);
    } else {
        sync_stream(device, s);
        check(g_plugin.copy(device, dst, src, nbytes, kind), what, device);
    }
}

namespace {

// a copy between the host and the device: with non_blocking and pinned host memory, enqueued
// on the current stream and not waited for (ordered with the stream's work); else raw_copy
void host_copy(int device, void *dst, const void *src, size_t nbytes, anychip_copy_kind kind, bool non_blocking)
{
    const void *host = kind == ANYCHIP_COPY_H2D ? src : dst;
    if (!non_blocking || nbytes == 0 || !can_record() || !is_pinned(host)) {
        raw_copy(device, dst, src, nbytes, kind);
        return;
    }
    void *s = current_stream(device);
    check(traced_copy(device, dst, src, nbytes, kind, s),
          kind == ANYCHIP_COPY_H2D ? "copy (pinned host to device)" : "copy (device to pinned host)", device);
    record_pinned_use(host, device, s);
}

}  // namespace

int dev_index(const at::Tensor &t) { return t.device().index() < 0 ? current_device() : t.device().index(); }

namespace {

// elements from the first to the last one the tensor addresses (strides are >= 0)
int64_t span_of(const at::Tensor &t)
{
    if (t.numel() == 0)
        return 0;
    int64_t span = 1;
    for (int64_t i = 0; i < t.dim(); ++i)
        span += (t.size(i) - 1) * t.stride(i);
    return span;
}

}  // namespace

bool dense(const at::Tensor &t) { return t.is_non_overlapping_and_dense(); }

namespace {

// the lazy conjugate and negative bits of `like` on a host view of the same memory
at::Tensor with_bits(at::Tensor host, const at::Tensor &like)
{
    if (like.is_conj())
        host = at::_conj(host);
    if (like.is_neg())
        host = at::_neg_view(host);
    return host;
}

}  // namespace

// a host tensor with the device tensor's sizes, strides, bits and values, `lead` elements into
// its block
at::Tensor download(const at::Tensor &t, int64_t lead)
{
    int64_t span = span_of(t);
    at::Tensor host = at::empty({lead + span}, t.options().device(c10::kCPU));
    raw_copy(dev_index(t), static_cast<char *>(host.data_ptr()) + lead * t.element_size(), t.data_ptr(),
             span * t.element_size(), ANYCHIP_COPY_D2H);
    return with_bits(host.as_strided(t.sizes(), t.strides(), lead), t);
}

namespace {

// a CPU tensor over the device tensor's own memory (host_addressable), with its layout and bits.
// Its storage is `host`: one per device storage within an op (made here when undefined), so that
// two arguments over the same memory overlap on the host as they do on the device (the CPU kernel's
// overlap checks see it); it keeps the device memory alive, and it is resizable, so that a CPU
// kernel that resizes an out= argument past it writes host memory of its own (which the fallback
// then copies back, resizing the device tensor). Undefined where the memory's block does not start
// on the CPU allocator's alignment (the CPU kernel could take another path over it than over the
// CPU's tensor)
at::Tensor host_alias(const at::Tensor &t, c10::Storage &host)
{
    constexpr uintptr_t kCpuAlignment = 64;        // c10's gAlignment: where a CPU block starts
    const c10::Storage &storage = t.storage();
    if (t.numel() == 0 || reinterpret_cast<uintptr_t>(storage.data()) % kCpuAlignment != 0)
        return {};
    if (!host) {
        auto *keep = new c10::Storage(storage);
        c10::DataPtr ptr(storage.mutable_data(), keep, [](void *ctx) { delete static_cast<c10::Storage *>(ctx); },
                         c10::Device(c10::kCPU));
        host = c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(ptr), c10::GetCPUAllocator(),
                            /*resizable=*/true);
    }
    at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(host),
                                                                c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return with_bits(alias, t);
}

}  // namespace

std::vector<at::Tensor> download_all(const std::vector<at::Tensor> &ts, const std::vector<int64_t> &leads,
                                     bool may_alias)
{
    std::vector<at::Tensor> out(ts.size());
    if (may_alias && host_addressable()) {
        std::vector<std::pair<int, void *>> synced;
        std::vector<std::pair<const c10::StorageImpl *, c10::Storage>> hosts;    // (device storage, its alias)
        for (size_t i = 0; i < ts.size(); ++i) {
            int device = dev_index(ts[i]);
            void *stream = current_stream(device);
            if (std::find(synced.begin(), synced.end(), std::make_pair(device, stream)) == synced.end()) {
                sync_stream(device, stream);
                synced.emplace_back(device, stream);
            }
            const c10::StorageImpl *impl = ts[i].storage().unsafeGetStorageImpl();
            auto h = std::find_if(hosts.begin(), hosts.end(), [&](const auto &p) { return p.first == impl; });
            if (h == hosts.end())
                h = hosts.insert(hosts.end(), {impl, c10::Storage()});
            out[i] = host_alias(ts[i], h->second);
            if (!out[i].defined())
                out[i] = download(ts[i], leads[i]);
        }
        return out;
    }
    if (!g_plugin.copy_async) {       // (copies that return when done)
        for (size_t i = 0; i < ts.size(); ++i)
            out[i] = download(ts[i], leads[i]);
        return out;
    }
    std::vector<std::pair<int, void *>> streams;     // the (device, stream) pairs to wait for
    auto wait = [&] {
        for (auto [device, stream] : streams)
            sync_stream(device, stream);
    };
    try {
        for (size_t i = 0; i < ts.size(); ++i) {
            const at::Tensor &t = ts[i];
            int64_t span = span_of(t);
            at::Tensor host = at::empty({leads[i] + span}, t.options().device(c10::kCPU));
            out[i] = with_bits(host.as_strided(t.sizes(), t.strides(), leads[i]), t);
            if (span == 0)
                continue;
            int device = dev_index(t);
            void *stream = current_stream(device);
            if (std::find(streams.begin(), streams.end(), std::make_pair(device, stream)) == streams.end())
                streams.emplace_back(device, stream);
            check(traced_copy(device, static_cast<char *>(host.data_ptr()) + leads[i] * t.element_size(),
                              t.data_ptr(), span * t.element_size(), ANYCHIP_COPY_D2H, stream),
                  "copy (device to host)", device);
        }
    } catch (...) {
        try {               // (the copies enqueued write into host memory freed with out)
            wait();
        } catch (...) {
        }
        throw;
    }
    wait();
    return out;
}

// writes host values (any layout and dtype) into a device tensor (any layout)
void upload(const at::Tensor &dst, const at::Tensor &src)
{
    int device = dev_index(dst);
    if (dst.numel() == 0)
        return;
    if (dense(dst)) {      // every element of the span is the tensor's: write it whole
        at::Tensor host = with_bits(at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(c10::kCPU)), dst);
        host.copy_(src);
        raw_copy(device, dst.data_ptr(), host.data_ptr(), dst.numel() * dst.element_size(), ANYCHIP_COPY_H2D);
        return;
    }
    at::Tensor host = download(dst);       // the span holds other tensors' elements: read, modify, write
    host.copy_(src);
    raw_copy(device, dst.data_ptr(), host.data_ptr(), span_of(dst) * dst.element_size(), ANYCHIP_COPY_H2D);
}

namespace {

bool same_layout(const at::Tensor &a, const at::Tensor &b)
{
    return a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) && dense(a) &&
           a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

}  // namespace

at::Tensor copy_from(const at::Tensor &self, const at::Tensor &dst, bool non_blocking)
{
    refuse_in_forked_child();
    require_ready();
    // (a source of another shape broadcasts: it goes through the host, where copy_ expands it)
    if (dst.numel() == 0)
        return dst;
    bool from_dev = self.device().type() == kType, to_dev = dst.device().type() == kType;
    if (from_dev && to_dev) {
        int sd = dev_index(self), dd = dev_index(dst);
        if (same_layout(self, dst)) {
            size_t nbytes = self.numel() * self.element_size();
            if (sd == dd) {
                c10::DeviceGuard guard(dst.device());
                raw_copy(dd, dst.data_ptr(), self.data_ptr(), nbytes, ANYCHIP_COPY_D2D);
                return dst;
            }
            if (g_plugin.copy_peer) {     // ordered after both devices' earlier work, then waited for
                sync_stream(dd, current_stream(dd));
                void *s = current_stream(sd);
                check(g_plugin.copy_peer(dd, dst.data_ptr(), sd, self.data_ptr(), nbytes,
                                         static_cast<anychip_stream>(s)), "copy_peer", sd);
                sync_stream(sd, s);
                return dst;
            }
        }
        upload(dst, download(self));       // another layout, dtype or device: through the host
        return dst;
    }
    if (from_dev) {        // device -> host
        if (same_layout(self, dst)) {
            host_copy(dev_index(self), dst.data_ptr(), self.data_ptr(), self.numel() * self.element_size(),
                      ANYCHIP_COPY_D2H, non_blocking);
        } else {
            dst.copy_(download(self));
        }
        return dst;
    }
    TORCH_CHECK(to_dev, "_copy_from on the anychip device got ", self.device(), " -> ", dst.device());
    // a host view of dst's own memory (the CPU fallback's, host_addressable) that a CPU kernel wrote
    // in place: the values are there already
    if (host_addressable() && self.data_ptr() == dst.data_ptr() && self.dtype() == dst.dtype() &&
        self.sizes().equals(dst.sizes()) && self.strides().equals(dst.strides()) && self.is_conj() == dst.is_conj() &&
        self.is_neg() == dst.is_neg())
        return dst;
    if (same_layout(self, dst)) {          // host -> device
        host_copy(dev_index(dst), dst.data_ptr(), self.data_ptr(), self.numel() * self.element_size(),
                  ANYCHIP_COPY_H2D, non_blocking);
    } else {
        upload(dst, self);
    }
    return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor &self, const at::Tensor &dst)
{
    if (!dst.sizes().equals(self.sizes()))
        dst.resize_(self.sizes());
    return copy_from(self, dst, false);
}

}  // namespace anychip_torch
