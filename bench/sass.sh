#!/usr/bin/env bash
# The SASS of the CUDA kernels in one source file, on the development machine (its toolkit has nvcc and ptxas
# but no cuobjdump or nvdisasm: they come from NVIDIA's PyPI wheels, unpacked once into $SASS_TOOLS).
#   bench/sass.sh SOURCE [REGEX]    # e.g. bench/sass.sh src/backend/cuda/matmul_decode.cu 'matvec_kernel.*E12ELi1ELi2E'
#   bench/sass.sh PROGRAM.bin [REGEX]  # an OpenCL program NVIDIA's driver cached (PTX; h200_carry.sh ocl returns
#                                      # them in $OUT/ocl_ptx.tar): ptxas' registers and spills, and the SASS
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
if [[ $src == *.bin || $src == *.ptx ]]; then  # OpenCL C compiled by NVIDIA's driver: PTX, NUL-terminated
  base=$(basename "$src"); base=${base%.*}
  tr -d '\000' <"$src" >"$out/$base.ptx"
  /usr/local/cuda/bin/ptxas -arch=sm_90 -v "$out/$base.ptx" -o "$out/$base.cubin" 2>&1 |
    awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
         /spill stores/ {s = $5 " spill stores"} /Used [0-9]+ registers/ {print $5, s, n}' | grep -E "$regex" || true
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
