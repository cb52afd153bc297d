// The device's random number generators (see docs/torch.md, "Random numbers").
//
// Each device has its own default generator, and torch.Generator("anychip:N") makes more:
// a Philox state as CUDA's, a seed and an offset (get_state / set_state: 16 bytes, the seed
// then the offset), so torch.random.fork_rng, activation checkpointing and DTensor's
// offset-based tracker (torch/distributed/tensor/_random.py) work on it as on CUDA.
//
// Random ops run on the CPU, through the fallback, as the device's other compute ops: an op
// that draws from a device generator runs with a fresh CPU generator whose Mersenne Twister
// state is filled from the Philox stream (seed, subsequence = the generator's offset), and
// advances the offset by the op's elements, rounded up to 4 (CUDA's rule). The values are a
// function of the seed and the offset only: the same on every rank and in every run, never
// drawn from the CPU's generator nor from another device's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <c10/core/GeneratorImpl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "device.h"

namespace py = pybind11;

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

struct PhiloxGenerator final : c10::GeneratorImpl {
    explicit PhiloxGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
        : c10::GeneratorImpl(c10::Device(kType, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
          seed_(seed)
    {
    }
    static c10::DeviceType device_type() { return kType; }

    void set_current_seed(uint64_t seed) override
    {
        seed_ = seed;
        offset_ = 0;
    }
    void set_offset(uint64_t offset) override
    {
        TORCH_CHECK(offset % 4 == 0, "the offset of an anychip generator must be a multiple of 4, got ", offset);
        offset_ = offset;
    }
    uint64_t get_offset() const override { return offset_; }
    uint64_t current_seed() const override { return seed_; }
    uint64_t seed() override
    {
        uint64_t s = c10::detail::getNonDeterministicRandom(true);
        set_current_seed(s);
        return s;
    }
    // the state as CUDA's Philox generator gives it: 16 bytes, the seed then the offset
    c10::intrusive_ptr<c10::TensorImpl> get_state() const override
    {
        at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
        std::memcpy(state.data_ptr(), &seed_, 8);
        std::memcpy(static_cast<char *>(state.data_ptr()) + 8, &offset_, 8);
        return state.getIntrusivePtr();
    }
    void set_state(const c10::TensorImpl &state) override
    {
        TORCH_CHECK(state.device().is_cpu() && state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                        state.numel() == 16 && state.is_contiguous(),
                    "an anychip generator's state is a contiguous CPU ByteTensor of 16 bytes (the seed, then the "
                    "offset), got ", state.numel(), " elements of ", state.dtype().name(), " on ", state.device());
        uint64_t seed = 0, offset = 0;
        std::memcpy(&seed, state.data(), 8);
        std::memcpy(&offset, static_cast<const char *>(state.data()) + 8, 8);
        set_current_seed(seed);
        set_offset(offset);
    }
    PhiloxGenerator *clone_impl() const override
    {
        auto *g = new PhiloxGenerator(device().index(), seed_);
        g->offset_ = offset_;
        return g;
    }

    // a CPU generator for an op that draws `draws` numbers: its state the Philox stream of
    // (seed, offset); the offset then moves past them (the caller holds the mutex)
    at::Generator take(int64_t draws)
    {
        at::philox_engine philox(seed_, offset_, 0);
        at::mt19937_data_pod pod{};
        for (auto &word : pod.state_)
            word = philox();
        pod.seed_ = seed_;
        pod.seeded_ = true;
        pod.left_ = 1;        // (the first draw turns the state over, as after seeding)
        pod.next_ = 0;
        at::mt19937 engine;
        engine.set_data(pod);
        at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>(seed_);
        at::check_generator<at::CPUGeneratorImpl>(cpu)->set_engine(engine);
        offset_ += static_cast<uint64_t>((std::max<int64_t>(draws, 1) + 3) / 4 * 4);
        return cpu;
    }

    uint64_t seed_;
    uint64_t offset_ = 0;
};

std::once_flag g_defaults_once;
std::vector<at::Generator> g_defaults;        // one per device, made on first use

int resolve(c10::DeviceIndex device)
{
    int index = device < 0 ? c10::impl::VirtualGuardImpl(kType).getDevice().index() : device;
    int count = anychip_torch::device_count();
    TORCH_CHECK(index >= 0 && index < count, "anychip device index ", index, " is out of range: ",
                anychip_torch::backend_name(), " has ", count, " device(s) here (0..", count - 1, ")");
    return index;
}

// The ops that draw random numbers and have a CPU kernel (every other random op of aten
// decomposes into these): the fallback, with the device generator's draw handed in as a
// CPU generator. A CPU generator handed to an op on the device is refused, as on CUDA.
void random_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack)
{
    const auto &args = op.schema().arguments();
    size_t base = stack->size() - args.size();
    std::optional<c10::Device> device;
    int64_t draws = 0;
    int slot = -1;
    for (size_t i = 0; i < args.size(); ++i) {
        const c10::IValue &v = (*stack)[base + i];
        if (v.isTensor() && v.toTensor().defined()) {
            const at::Tensor &t = v.toTensor();
            if (t.device().type() == kType && !device)
                device = t.device();
            draws = std::max<int64_t>(draws, t.numel());
        }
        const c10::TypePtr &type = args[i].type();
        if (type->kind() == c10::TypeKind::OptionalType &&
            type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
            slot = static_cast<int>(i);
    }
    TORCH_INTERNAL_ASSERT(slot >= 0 && device, op.schema().name(), " has no generator or no anychip tensor");
    c10::IValue &arg = (*stack)[base + slot];
    at::Generator gen = arg.isNone() ? anychip_torch::default_generator(device->index()) : arg.toGenerator();
    TORCH_CHECK(gen.device().type() == kType, "Expected a '", c10::get_privateuse1_backend(),
                "' device type for generator but found '", gen.device().type(), "'");
    at::Generator cpu;
    {
        std::lock_guard<std::mutex> lock(gen.mutex());
        cpu = at::check_generator<PhiloxGenerator>(gen)->take(draws);
    }
    arg = c10::IValue(cpu);
    anychip_torch::fallback(op, stack);
}

// native_dropout has no generator argument (its CPU kernel draws from the CPU's): the CPU
// kernel's steps, whose bernoulli_ draws from the device's generator
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor &input, double p, std::optional<bool> train)
{
    if (input.numel() == 0)
        return std::make_tuple(input, at::empty_like(input, input.options()));
    if (train.has_value() && !*train)
        return std::make_tuple(input.clone(), at::ones_like(input, input.options().dtype(at::kBool)));
    double p1m = 1. - p;
    double scale = p1m == 0 ? 0. : 1. / p1m;
    at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.bernoulli_(p1m);
    return std::make_tuple(input.mul(mask).mul_(scale), mask);
}

// torch.anychip.default_generators[N]: the device's default generator as a torch.Generator
py::object default_generator_object(int device)
{
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        anychip_torch::default_generator(static_cast<c10::DeviceIndex>(device))));
}

// the state of the CPU generator the next draw of device N's default generator runs with
// (its seed and offset unchanged): the tests run the CPU kernel with it and compare
at::Tensor next_draw_state(int device)
{
    at::Generator gen = anychip_torch::default_generator(static_cast<c10::DeviceIndex>(device));
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto *impl = at::check_generator<PhiloxGenerator>(gen);
    at::Generator copy = at::make_generator<PhiloxGenerator>(impl->device().index(), impl->seed_);
    auto *c = at::check_generator<PhiloxGenerator>(copy);
    c->offset_ = impl->offset_;
    return c->take(0).get_state();
}

}  // namespace

namespace anychip_torch {

const at::Generator &default_generator(c10::DeviceIndex device)
{
    int index = resolve(device);
    std::call_once(g_defaults_once, [] {
        for (int d = 0; d < device_count(); ++d)
            g_defaults.push_back(at::make_generator<PhiloxGenerator>(static_cast<c10::DeviceIndex>(d)));
    });
    return g_defaults[index];
}

at::Generator new_generator(c10::DeviceIndex device)
{
    return at::make_generator<PhiloxGenerator>(static_cast<c10::DeviceIndex>(resolve(device)));
}

void bind_random(py::module_ &m)
{
    m.def("default_generator", &default_generator_object);
    m.def("next_draw_state", &next_draw_state);
}

}  // namespace anychip_torch

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    for (const char *name : {"bernoulli.out", "bernoulli_.Tensor", "bernoulli_.float", "binomial", "cauchy_",
                             "exponential_", "geometric_", "log_normal_", "multinomial", "multinomial.out",
                             "normal.Tensor_Tensor", "normal.Tensor_Tensor_out", "normal.Tensor_float",
                             "normal.Tensor_float_out", "normal.float_Tensor", "normal.float_Tensor_out", "normal_",
                             "poisson", "random_", "random_.from", "random_.to", "randperm.generator_out",
                             "rrelu_with_noise", "rrelu_with_noise.out", "rrelu_with_noise_", "uniform_",
                             "_sample_dirichlet", "_standard_gamma"})
        m.impl(name, torch::CppFunction::makeFromBoxedFunction<&random_fallback>());
    m.impl("native_dropout", native_dropout);
}
