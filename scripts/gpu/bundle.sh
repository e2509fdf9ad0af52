#!/usr/bin/env bash
# Gathers a build for a GPU machine that has the NVIDIA driver and CUDA's libraries but none of
# dtrain's Debian libraries (yaml-cpp, Abseil, Gloo, OpenBLAS, curl, ...) into one archive, as
# `scripts/gpu/check.sh --prebuilt ARCHIVE` takes it: built here with the toolkit (no GPU needed:
# CMAKE_CUDA_ARCHITECTURES names the targets, "80;90" unless the build folder says otherwise) for
# any x86-64-v3 processor, gathered, copied over and checked there.
#
# In the archive, bin/ holds the binaries (dtrain, libdtrain_cuda.so beside it, dtrain_gpu_tests),
# lib/ every shared library they load but those of the C library and of CUDA, NCCL and the
# driver, which must be the GPU machine's own (they match its driver), and data/ the demo text.
# dtrain and tests/dtrain_gpu_tests, where check.sh looks for them, are wrappers that run the
# binaries with lib/ first on LD_LIBRARY_PATH, then DTRAIN_LIBRARY_PATH (where check.sh puts the
# folders of the GPU machine's CUDA libraries that its loader misses), so that nothing else
# (PyTorch, the peer; Nsight Compute) loads those libraries.
# gzip, which every machine unpacks: about 40 MB (38 for sm_90 alone, 40 for 80;90).
#
# Usage: scripts/gpu/bundle.sh [BUILD_DIR] [ARCHIVE] (defaults build-gpu, configured here if new,
# and gpu-bundle.tar.gz, written over)
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build-gpu}
archive=$(realpath -m "${2:-$repo/gpu-bundle.tar.gz}")
# The CPU code must run on the GPU machine's processor too: x86-64-v3 (AVX2), not this one's.
if [[ ! -f $build/CMakeCache.txt ]]; then
  command -v nvcc > /dev/null || { echo "nvcc is not on PATH: install the CUDA toolkit" >&2; exit 1; }
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MARCH=x86-64-v3 \
    > /dev/null
fi
if [[ $(sed -n 's/^DTRAIN_MARCH:STRING=//p' "$build/CMakeCache.txt") == native ]]; then
  echo "$build is built for this machine's processor (DTRAIN_MARCH=native), which the GPU" \
    "machine's may not match: run cmake -B $build -DDTRAIN_MARCH=x86-64-v3 first" >&2
  exit 1
fi
# The demo text the GPU stages train on, which the GPU machine cannot make (no fortunes package).
[[ -f $repo/data/fortunes.txt ]] ||
  { echo "no $repo/data/fortunes.txt: run scripts/prepare_demo_data.sh first" >&2; exit 1; }
ninja -C "$build" dtrain dtrain_gpu_tests
binaries=("$build/dtrain" "$build/libdtrain_cuda.so" "$build/tests/dtrain_gpu_tests")
bundle=$(mktemp -d)
trap 'rm -rf "$bundle"' EXIT
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/tests" "$bundle/data"
cp "${binaries[@]}" "$bundle/bin/"
cp "$repo/data/fortunes.txt" "$bundle/data/"

# The GPU machine's own: the C library's parts and the loader, and everything of CUDA's and the
# driver's (libcuda, libcudart, libcublas, libcublasLt, libnccl, libnvidia-*).
c_library='linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libnsl|libutil|libanl'
own="^($c_library|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]+)\\.so"
while read -r name path; do
  if [[ $path == "not found" ]]; then
    [[ $name =~ $own ]] && continue
    echo "$name is not found here: ldd cannot gather it" >&2
    exit 1
  fi
  [[ $name =~ $own ]] || cp -L "$path" "$bundle/lib/"
done < <(ldd "${binaries[@]}" | sed -nE 's/^\s+(\S+) => (.*) \(0x[0-9a-f]+\)$/\1 \2/p;
                                         s/^\s+(\S+) => not found$/\1 not found/p' | sort -u)

# wrap WRAPPER BINARY UP: WRAPPER runs bin/BINARY of the bundle, which is UP from WRAPPER's folder.
wrap() {
  local wrapper=$1 binary=$2 up=$3
  cat > "$wrapper" <<EOF
#!/usr/bin/env bash
# Written by scripts/gpu/bundle.sh: the binary with the bundle's libraries, then
# DTRAIN_LIBRARY_PATH's.
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
bundle=\$(cd "\$here/$up" && pwd)
path=\$bundle/lib\${DTRAIN_LIBRARY_PATH:+:\$DTRAIN_LIBRARY_PATH}
export LD_LIBRARY_PATH=\$path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
exec "\$bundle/bin/$binary" "\$@"
EOF
  chmod +x "$wrapper"
}
wrap "$bundle/dtrain" dtrain .
wrap "$bundle/tests/dtrain_gpu_tests" dtrain_gpu_tests ..
tar -C "$bundle" -czf "$archive" .
echo "gathered $archive: the binaries and $(find "$bundle/lib" -type f | wc -l) libraries," \
  "$(du -h "$archive" | cut -f1)"
