// Elementwise activations of the MLP.
//
// GELU, tanh approximation (GPT-2's "gelu_new"):
//   y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// SwiGLU (Llama): gate_up (N, 2F) holds gate in [:, :F] and up in [:, F:];
//   out (N, F) = silu(gate) * up, silu(g) = g * sigmoid(g),
//   dgate = dout * up * sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dout * silu(g).
// Input gradients are written, not accumulated.
#pragma once

#include <cstddef>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

template <typename T>
void GeluForward(T* out, const T* inp, size_t n, ThreadPool* pool);
// dinp may be dout (the gradient carried back through the GELU in place).
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, ThreadPool* pool);

template <typename T>
void SwiGluForward(T* out, const T* gate_up, int n, int f, ThreadPool* pool);
template <typename T>
void SwiGluBackward(T* dgate_up, const T* gate_up, const T* dout, int n, int f, ThreadPool* pool);

}  // namespace dtrain::cpu
