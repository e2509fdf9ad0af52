#!/usr/bin/env bash
# From a fresh clone: install what is needed, build, and run every test: the tar reader's
# libFuzzer target for a bounded time (clang), then unit, PyTorch parity and multi-process
# tests with ctest, and the numerics tests once more under another BLAS kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/python_env.sh > /dev/null
bash scripts/build.sh
bash scripts/prepare_demo_data.sh

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DDTRAIN_FUZZ=ON > build-fuzz.log 2>&1 || {
  cat build-fuzz.log >&2
  exit 1
}
rm -f build-fuzz.log
ninja -C build-fuzz tar_fuzz
(cd build-fuzz && ctest -R '^fuzz\.tar$' --output-on-failure)

cd build
ctest --output-on-failure --timeout 900 -j 2

# Float results depend on the GEMM kernel OpenBLAS picks for the CPU. The numerics tests run
# again under the Haswell kernel (any AVX2 CPU runs it) unless the environment already chose
# one, so an assertion that holds under one kernel only fails everywhere, not on some machines.
if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then
  echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE} is set: the numerics tests ran under that kernel"
elif ! grep -qw avx2 /proc/cpuinfo; then
  echo "WARNING: no AVX2 on this CPU, so the numerics tests do not run again under" \
    "OPENBLAS_CORETYPE=Haswell; run them on an AVX2 machine before merging" >&2
else
  echo "The numerics tests again, under OPENBLAS_CORETYPE=Haswell"
  OPENBLAS_CORETYPE=Haswell ctest -L numerics --output-on-failure --timeout 900 -j 2
fi
