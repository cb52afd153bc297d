// What torch's composite ops take on a device other than the CPU, where the CPU takes another
// path (see docs/torch.md, "The CPU's computation"):
//
// - scaled_dot_product_attention asks the device's _fused_sdp_choice_stub which kernel to run,
//   and runs the math decomposition where a device registers none; the CPU runs its fused
//   flash-attention kernel for the inputs it takes. The device answers the CPU's choice, so it
//   runs the same kernel (through the CPU fallback) and gives the CPU's values.
// - the LSTM and GRU cells call the fused cell ops (_thnn_fused_lstm_cell, _thnn_fused_gru_cell)
//   for every device but the CPU, and torch has kernels for them on CUDA and XPU only: here they
//   are the cells' formulas over aten ops (the CPU's unfused cell's steps), and their backwards.
#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include "device.h"

namespace anychip_torch {
namespace {

// ---- attention ------------------------------------------------------------------------------

// the CPU's choice (its stub's kernel), made from the inputs' sizes, strides, dtypes and flags
// (it reads no values)
int64_t fused_sdp_choice(const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,
                         const std::optional<at::Tensor> &attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa)
{
    return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

// ---- the fused RNN cells ----------------------------------------------------------------------

at::Tensor biased(const at::Tensor &gates, const std::optional<at::Tensor> &bias)
{
    return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// (hy, cy, workspace): workspace holds the activated gates [i, f, g, o] (what CUDA's kernel keeps)
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor &input_gates,
                                                               const at::Tensor &hidden_gates, const at::Tensor &cx,
                                                               const std::optional<at::Tensor> &input_bias,
                                                               const std::optional<at::Tensor> &hidden_bias)
{
    at::Tensor gates = biased(input_gates, input_bias) + biased(hidden_gates, hidden_bias);
    auto chunks = gates.chunk(4, 1);
    at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
    at::Tensor cy = f * cx + i * g;
    at::Tensor hy = o * cy.tanh();
    return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// (the gates' gradient, cx's, the bias's): the cell's derivative through the kept gates
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor> &grad_hy,
                                                                        const std::optional<at::Tensor> &grad_cy,
                                                                        const at::Tensor &cx, const at::Tensor &cy,
                                                                        const at::Tensor &workspace, bool has_bias)
{
    bool ghy = grad_hy.has_value() && grad_hy->defined(), gcy = grad_cy.has_value() && grad_cy->defined();
    if (!ghy && !gcy)
        return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto gates = workspace.chunk(4, 1);
    const at::Tensor &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
    at::Tensor tanh_cy = cy.tanh();
    at::Tensor go = ghy ? *grad_hy * tanh_cy : at::zeros_like(o);
    at::Tensor gc = ghy ? *grad_hy * o * (1 - tanh_cy * tanh_cy) : at::zeros_like(cy);
    if (gcy)
        gc = gc + *grad_cy;
    at::Tensor grad_gates = at::cat({gc * g * i * (1 - i), gc * cx * f * (1 - f), gc * i * (1 - g * g),
                                     go * o * (1 - o)}, 1);
    at::Tensor grad_cx = gc * f;
    return {grad_gates, grad_cx, has_bias ? grad_gates.sum(0) : at::Tensor()};
}

// (hy, workspace): workspace holds [r, z, n, hx, the hidden gates' n part] (what CUDA's kernel keeps)
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor &input_gates, const at::Tensor &hidden_gates,
                                                  const at::Tensor &hx, const std::optional<at::Tensor> &input_bias,
                                                  const std::optional<at::Tensor> &hidden_bias)
{
    auto ig = biased(input_gates, input_bias).chunk(3, 1);
    auto hg = biased(hidden_gates, hidden_bias).chunk(3, 1);
    at::Tensor r = (ig[0] + hg[0]).sigmoid(), z = (ig[1] + hg[1]).sigmoid();
    at::Tensor n = (ig[2] + r * hg[2]).tanh();
    at::Tensor hy = n + z * (hx - n);
    return {hy, at::cat({r, z, n, hx, hg[2]}, 1)};
}

// (input gates', hidden gates', hx's, input bias's, hidden bias's gradients)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor &grad_hy, const at::Tensor &workspace, bool has_bias)
{
    auto ws = workspace.chunk(5, 1);
    const at::Tensor &r = ws[0], &z = ws[1], &n = ws[2], &hx = ws[3], &hn = ws[4];
    at::Tensor gn = grad_hy * (1 - z) * (1 - n * n);
    at::Tensor gz = grad_hy * (hx - n) * (1 - z) * z;
    at::Tensor gr = gn * hn * (1 - r) * r;
    at::Tensor grad_input = at::cat({gr, gz, gn}, 1);
    at::Tensor grad_hidden = at::cat({gr, gz, gn * r}, 1);
    at::Tensor grad_hx = grad_hy * z;
    if (!has_bias)
        return {grad_input, grad_hidden, grad_hx, at::Tensor(), at::Tensor()};
    return {grad_input, grad_hidden, grad_hx, grad_input.sum(0), grad_hidden.sum(0)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)
{
    m.impl("_fused_sdp_choice", fused_sdp_choice);
    m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
    m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward);
    m.impl("_thnn_fused_gru_cell", fused_gru_cell);
    m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

}  // namespace anychip_torch

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &anychip_torch::fused_sdp_choice)
}  // namespace at::native
