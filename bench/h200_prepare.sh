#!/usr/bin/env bash
# On the development machine, what a GPU-machine call carries (see bench/h200_carry.sh, which runs there):
#   bench/h200_prepare.sh devbin [BUILD] [NAME=BINARY ...]
#                                         # xpert (+ tests/xpert_cuda_tests and bench/bench_cuda_floor
#                                         # when built) and the shared libraries ldd lists,
#                                         # stripped and xz-compressed into .lcpbin/devbin.txz
#                                         # (BUILD: default build; build-dev from `cmake --preset dev`, sm_90 alone);
#                                         # each NAME=BINARY adds another xpert build as .devbin/NAME, for
#                                         # `h200_carry.sh ab` with BINS (compile-time variants side by side);
#                                         # also .lcpbin/nsyslib, libdw for bench/h200_nsys.sh
#   bench/h200_prepare.sh lcp [VERSION]   # llama.cpp's source from the llama-cpp-python sdist (PyPI), trimmed
#                                         # to what llama-bench's CUDA build needs (~29 MB), into .lcp/
# A call then carries [".lcpbin"] (xpert, plus llama-bench's prebuilt parts once `h200_carry.sh pack` has
# made them) or [".lcpbin", ".lcp"] for a call that builds llama-bench (`h200_carry.sh llama`). Both
# folders are build outputs: keep them out of git (.git/info/exclude).
set -euo pipefail
case "${1:-}" in
  devbin)
    b=${2:-build}
    [[ -x $b/xpert ]] || { echo "no $b/xpert: build it first" >&2; exit 1; }
    for extra in "${@:3}"; do
      [[ $extra == *=* && -x ${extra#*=} ]] || { echo "not NAME=BINARY (an executable): $extra" >&2; exit 1; }
    done
    rm -rf .devbin && mkdir -p .devbin/lib .lcpbin
    cp "$b/xpert" .devbin/
    if [[ -x $b/tests/xpert_cuda_tests ]]; then cp "$b/tests/xpert_cuda_tests" .devbin/; fi
    if [[ -x $b/bench/bench_cuda_floor ]]; then cp "$b/bench/bench_cuda_floor" .devbin/; fi
    for extra in "${@:3}"; do cp "${extra#*=}" ".devbin/${extra%%=*}"; done
    for bin in .devbin/xpert .devbin/xpert_cuda_tests; do
      [[ -x $bin ]] || continue
      ldd "$bin" | awk '/=> \//{print $3}' | grep -v -E 'lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt)\.so' |
        while read -r l; do cp -L "$l" .devbin/lib/; done
    done
    # Stripped, and xz -9e: its 64 MiB window sees the device code xpert and the test binary share (~9 MB
    # for both with bench_cuda_floor, against ~18 MB at -6), so llama-bench's parts fit in the same carry.
    strip .devbin/xpert* .devbin/bench_cuda_floor 2>/dev/null || true
    tar -cf - .devbin | xz -T"$(nproc)" -9e > .lcpbin/devbin.txz
    ls -l .lcpbin/devbin.txz
    # elfutils' libdw (Debian libdw1) and what it needs, for bench/h200_nsys.sh's QdstrmImporter there (~1 MB)
    mkdir -p .lcpbin/nsyslib
    for l in libdw.so.1 libelf.so.1 libbz2.so.1.0 liblzma.so.5; do
      p=$(ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')
      if [[ -n $p ]]; then cp -L "$p" .lcpbin/nsyslib/; else echo "no $l here (apt-get install libdw1)" >&2; fi
    done
    ;;
  lcp)
    v=${2:-0.3.36}
    t=$(mktemp -d)
    pip download --no-deps --no-binary :all: "llama-cpp-python==$v" -d "$t" >/dev/null
    tar -xzf "$t"/llama_cpp_python-"$v".tar.gz -C "$t"
    rm -rf .lcp && cp -r "$t/llama_cpp_python-$v/vendor/llama.cpp" .lcp && rm -rf "$t"
    (cd .lcp && rm -rf docs models media benches gguf-py conversion pocs tests tools/ui .git* examples/*/ &&
      cd ggml/src && rm -rf ggml-virtgpu ggml-cann ggml-openvino ggml-webgpu ggml-et ggml-metal ggml-hexagon \
        ggml-sycl ggml-vulkan ggml-opencl ggml-zdnn ggml-musa ggml-rpc)
    du -sh .lcp
    ;;
  *) echo "usage: $0 devbin [BUILD] [NAME=BINARY ...] | lcp [VERSION]" >&2; exit 2 ;;
esac
