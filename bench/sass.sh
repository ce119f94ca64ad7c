#!/usr/bin/env bash
# The SASS of the CUDA kernels in one source file, on the development machine (its toolkit has nvcc and ptxas
# but no cuobjdump or nvdisasm: they come from NVIDIA's PyPI wheels, unpacked once into $SASS_TOOLS).
#   bench/sass.sh SOURCE [REGEX]    # e.g. bench/sass.sh src/backend/cuda/matmul_decode.cu 'matvec_kernel.*E12ELi1ELi2E'
#   bench/sass.sh PROGRAM.bin [REGEX]  # an OpenCL program NVIDIA's driver cached (PTX; h200_carry.sh oclab returns
#                                      # them in $OUT/ocl_ptx.txz): ptxas' registers and spills, each kernel's
#                                      # code size (its .text section), and the SASS
#   bench/sass.sh PROGRAM.cl [REGEX]   # OpenCL C (a program's whole text; CL_OPTS: its -D options) through
#                                      # clang-15 and libclc (apt-get install clang-15 llvm-15 libclc-15) to PTX,
#                                      # then as above: an estimate of a variant's code size before a GPU run
#                                      # (NVIDIA's compiler differs: the decode attention 85 KB here, 93 there).
#                                      # The attention program's text: kClCommonSource, kAttentionSource and
#                                      # kAttentionSplitSource one after the other (program_texts.cpp), options
#                                      # -DATT_BKEEP=512 -DATT_BD=128 for heads of 128
# Compiles SOURCE for sm_90 with build-gpu's flags (build-gpu/compile_commands.json: configure with
# -DCMAKE_EXPORT_COMPILE_COMMANDS=ON), prints ptxas' registers per kernel, and writes the SASS of the kernels
# whose mangled names match REGEX (all without one) to $OUT/FILE.sass.
set -euo pipefail
src=${1:?usage: bench/sass.sh SOURCE [REGEX]}
regex=${2:-.}
tools=${SASS_TOOLS:-$HOME/.cache/xpert-sass-tools}
out=${OUT:-/tmp/xpert-sass}
mkdir -p "$tools" "$out"
if [[ ! -x $tools/nvdisasm || ! -x $tools/cuobjdump ]]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$tmp"
  for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
  find "$tmp/x" -type f \( -name cuobjdump -o -name nvdisasm \) -exec cp {} "$tools/" \;
  chmod +x "$tools/cuobjdump" "$tools/nvdisasm"
  rm -rf "$tmp"
fi
if [[ $src == *.bin || $src == *.ptx || $src == *.cl ]]; then  # the PTX of NVIDIA's driver (NUL-terminated), or OpenCL C
  base=$(basename "$src"); base=${base%.*}
  if [[ $src == *.cl ]]; then
    clc=/usr/lib/clc/nvptx64--nvidiacl.bc
    for t in clang-15 llvm-link-15 opt-15 llc-15 "$clc"; do
      [[ -s $t ]] || command -v "$t" >/dev/null || { echo "no $t: apt-get install clang-15 llvm-15 libclc-15" >&2; exit 1; }
    done
    # shellcheck disable=SC2086  # CL_OPTS: several options
    clang-15 -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -O3 ${CL_OPTS:-} -Xclang -finclude-default-header \
      -emit-llvm -c "$src" -o "$out/$base.bc"
    llvm-link-15 "$out/$base.bc" "$clc" -o "$out/$base.linked.bc" 2>/dev/null
    opt-15 -O3 "$out/$base.linked.bc" -o "$out/$base.opt.bc"
    llc-15 -march=nvptx64 -mcpu=sm_80 -mattr=+ptx75 "$out/$base.opt.bc" -o "$out/$base.ptx"
  else
    tr -d '\000' <"$src" >"$out/$base.ptx"
  fi
  /usr/local/cuda/bin/ptxas -arch=sm_90 -v "$out/$base.ptx" -o "$out/$base.cubin" 2>&1 |
    awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
         /spill stores/ {s = $5 " spill stores"} /Used [0-9]+ registers/ {print $5, s, n}' | grep -E "$regex" || true
  readelf -S -W "$out/$base.cubin" 2>/dev/null | sed -n 's/.* \.text\.\([^ ]*\) *[A-Z]* *[0-9a-f]* *[0-9a-f]* *\([0-9a-f]*\) .*/\1 \2/p' |
    while read -r k size; do echo "$k: $((16#$size)) bytes of code"; done | grep -E "$regex" || true
  "$tools/nvdisasm" --print-code "$out/$base.cubin" >"$out/$base.all.sass"
  awk -v re="$regex" '/^\.text\./ {keep = ($0 ~ re)} keep' "$out/$base.all.sass" >"$out/$base.sass"
  echo "SASS: $out/$base.sass ($(grep -c '^\.text\.' "$out/$base.sass") kernels)"
  exit 0
fi
cmd=$(python3 - "$src" <<'EOF'
import json, os, sys
src = os.path.abspath(sys.argv[1])
for e in json.load(open("build-gpu/compile_commands.json")):
    if os.path.abspath(e["file"]) == src:
        print(e["command"])
        break
else:
    sys.exit(f"{src} is not in build-gpu/compile_commands.json")
EOF
)
base=$(basename "$src" .cu)
obj=$out/$base.o
# the same command, its output redirected, ptxas made verbose
cmd=$(sed -E "s# -o [^ ]+# -o $obj#" <<<"$cmd")
(cd build-gpu && eval "$cmd -Xptxas -v") 2>&1 |
  awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)} /Used [0-9]+ registers/ {print $5, n}' |
  grep -E "$regex" || true
(cd "$out" && "$tools/cuobjdump" -xelf all "$obj" >/dev/null)
"$tools/nvdisasm" --print-code "$out/$base.sm_90.cubin" >"$out/$base.all.sass"
awk -v re="$regex" '/^\.text\./ {keep = ($0 ~ re)} keep' "$out/$base.all.sass" >"$out/$base.sass"
echo "SASS: $out/$base.sass ($(grep -c '^\.text\.' "$out/$base.sass") kernels)"
