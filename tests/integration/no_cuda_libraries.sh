#!/usr/bin/env bash
# The dtrain binary starts on a machine without CUDA: ldd lists none of CUDA's libraries (the
# CUDA module, libdtrain_cuda.so, loads them at run time). Where the build made the module, it
# is beside the binary and does link them. Usage: no_cuda_libraries.sh DTRAIN_BINARY
set -euo pipefail
binary=$1
cuda='lib(cudart|cublas|cublasLt|nccl|cuda)\.so'
libraries=$(ldd "$binary")
if grep -E "$cuda" <<< "$libraries"; then
  echo "$binary links CUDA libraries (above): it would not start without them" >&2
  exit 1
fi
module=$(dirname "$binary")/libdtrain_cuda.so
# (ldd's output in a variable: grep -q closing the pipe early would fail ldd under pipefail.)
if [[ -e $module ]] && ! grep -qE 'libcudart\.so' <<< "$(ldd "$module")"; then
  echo "$module does not link libcudart" >&2
  exit 1
fi
echo "ok: $binary links no CUDA library"
