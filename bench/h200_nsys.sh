#!/usr/bin/env bash
# On the GPU machine: a timeline of the decode graph's kernels as they ran (Nsight Systems from the
# nsight-compute install: its target nsys records, its desktop QdstrmImporter converts, nsys stats exports)
# for PRESET's synth file (bench/h200_carry.sh made it): $OUT/nsys_PRESET_cuda_gpu_trace.csv, one row a
# kernel with its start and duration in ns (GRAPH_TRACE=graph: a row a graph launch instead, which costs the
# host less). Usage: bench/h200_nsys.sh PRESET [N tokens, default 16]. Back here,
# `bench/nsys_path.py CSV [STEPS] [LAYERS]` sums each kernel's share of a step's critical path.
set -uo pipefail
H=$(ls -d /opt/nvidia/nsight-compute/*/host | head -1)
T=$H/target-linux-x64
D=$(ls -d "$H"/linux-desktop-* | head -1)
OUT=${OUT:-/tmp/xpw/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devbin/lib
f=/tmp/xpw/${1:?preset}.gguf
"$T/nsys" profile --cuda-graph-trace="${GRAPH_TRACE:-node}" -t cuda -o /tmp/nsys_p --force-overwrite true \
  .devbin/xpert bench -m "$f" -p 0 -n "${2:-16}" -r 1 2>&1 | grep -E '\|' | tail -1
# The importer needs elfutils' libdw, which the machine lacks: carried in .lcpbin/nsyslib (with libelf,
# libbz2, liblzma; bench/h200_prepare.sh devbin copies them from the development machine's Debian libdw1).
LD_LIBRARY_PATH=$PWD/.lcpbin/nsyslib "$D/QdstrmImporter" -i /tmp/nsys_p.qdstrm 2>&1 | tail -2
for n in "$D/nsys" "$T/nsys"; do
  [[ -x $n ]] || continue
  "$n" stats -r cuda_gpu_trace -f csv -o "$OUT/nsys_$1" /tmp/nsys_p.nsys-rep 2>&1 | tail -2 && break
done
ls -l "$OUT"
