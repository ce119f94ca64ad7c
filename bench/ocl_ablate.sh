#!/usr/bin/env bash
# Timing-only builds of the whole-model OpenCL decode step: each cuts one kernel's serial tail (the work its
# last work-group does once the others are done) or another step, so a profile against main's gives what
# that part costs a launch. Their outputs are wrong by construction: the script reverts each edit after its
# build; never commit one.
#   bench/ocl_ablate.sh [BUILD] [OUTDIR] [NAME ...]   # BUILD: build-dev (`cmake --preset dev`); OUTDIR:
#                                                     # /tmp/xpert-ablate; NAMEs: those builds alone
# Builds OUTDIR/NAME for each NAME below, then:
#   bench/h200_prepare.sh devbin build-dev att=OUTDIR/att ...        (the carry, .lcpbin/devbin.txz)
#   XPERT_OPENCL_OPTS=profile .devbin/NAME bench -m FILE -p 0 -n 32 -r 1 --device opencl:0   (on the GPU)
#     att      `attention` without its rounding for the o-projection (round_head_blocks)
#     attsync  `attention` with the last group's count kept and the rounding's work cut
#     down     `moe_down_add` without the next layer's norm and rounding (the token's last group)
#     gu       `moe_gate_up` without the rounding of its rows for down (the slot's last group)
#     route    `moe_router_route`'s top-k without its k argmax trees (experts 0 .. k-1 taken)
#     all      att, down, gu and route together
#     downcnt  `moe_down_add` with its tail's work cut but every group's count and barriers kept (`last` 0 at
#              run time: get_local_size(2) is never 7)
#     gucnt    the same for `moe_gate_up`
#     attnone  `attention` returning at once (the launch's floor: its 32 groups of 64 on qwen3-30b-a3b)
#     attpro   `attention` returning after its prologue (q and k norms, RoPE, the k/v store and its barrier)
#     attp1    `attention` returning after pass 1 (the scores, the running max and sum, their tree), its
#              max and sum written so the pass is kept
#     gemvnone `gemv_multi` returning at once (its launch's floor)
set -euo pipefail
build=${1:-build-dev}
out=${2:-/tmp/xpert-ablate}
cd "$(dirname "$0")/.."
[[ -f $build/build.ninja ]] || { echo "no $build/build.ninja: configure it first (cmake --preset dev)" >&2; exit 1; }
files=(src/backend/opencl/kernels_attention.h src/backend/opencl/kernels_fused.h src/backend/opencl/kernels_ops.h)
git diff --quiet -- "${files[@]}" || { echo "uncommitted edits in ${files[*]}: commit or stash them first" >&2; exit 1; }
mkdir -p "$out"
trap 'git checkout -- "${files[@]}"' EXIT
names=(att attsync down gu route all downcnt gucnt attnone attpro attp1 gemvnone)
if (($# > 2)); then names=("${@:3}"); fi
for name in "${names[@]}"; do
  python3 - "$name" <<'EOF'
import sys
name = sys.argv[1]
A, F, O = (f"src/backend/opencl/kernels_{n}.h" for n in ("attention", "fused", "ops"))
edits = {
    "att": [(A, "  if (out_mode == 0 || out_mode == 1)  // the same for every group\n    round_head_blocks(",
             "  if (0)\n    round_head_blocks(")],
    "attsync": [(O, "  for (int b = 0; b < hpu * d / unit; ++b) round_block_group_v(out + row, outq + row, mode, b, wg, last, rv, ri);",
                 "  if (last) outq[row] = 0.0f;")],
    "down": [(F, "  const int last = last_group(counters + t, get_num_groups(0), &flag) && has_norm;",
              "  if (1) return;\n  const int last = last_group(counters + t, get_num_groups(0), &flag) && has_norm;")],
    "gu": [(F, "  const int last = last_group(counters + s, get_num_groups(0), &flag);",
            "  if (1) return;\n  const int last = last_group(counters + s, get_num_groups(0), &flag);")],
    "route": [(O, "  for (int j = 0; j < k; ++j) {\n    float best = -1.0f;",
               "  for (int j = 0; j < k; ++j) {\n    if (lid == 0 && active) {\n      const int s = t * k + j;\n"
               "      row_slot[s] = s, slot_row[s] = s, tasks[2 * s] = s, tasks[2 * s + 1] = j, weights[s] = p[j];\n"
               "    }\n    wsum += p[j];\n    continue;\n    float best = -1.0f;")],
}
edits["all"] = edits["att"] + edits["down"] + edits["gu"] + edits["route"]
never = " && get_local_size(2) == 7;"  # 0 at run time, not to the compiler
pro = "    qs[i] = round_f16(qs[i]);\n  }\n  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);\n"
p1 = "  mx = ps[0];\n  l = ls[0];\n  barrier(CLK_LOCAL_MEM_FENCE);\n"
edits["attnone"] = [(A, "  const int p = pos[t];\n  if (use_slots) {",
                     "  const int p = pos[t];\n  if (get_local_size(2) != 7) return;\n  if (use_slots) {")]
edits["gemvnone"] = [(F, "  int f = get_group_id(0) * MV_R + get_local_id(1);\n",
                      "  if (get_local_size(2) != 7) return;\n  int f = get_group_id(0) * MV_R + get_local_id(1);\n")]
edits["attpro"] = [(A, pro, pro + "  if (get_local_size(2) != 7) return;\n")]
edits["attp1"] = [(A, p1, p1 + "  if (lid == 0) out[(t * n_head + h) * d] = mx + l;\n  if (get_local_size(2) != 7) return;\n")]
edits["downcnt"] = [(F, edits["down"][0][1], edits["down"][0][1].replace(";", never))]
edits["gucnt"] = [(F, edits["gu"][0][1], edits["gu"][0][1].replace(";", never))]
for path, old, new in edits[name]:
    s = open(path).read()
    if s.count(old) != 1:
        sys.exit(f"ocl_ablate.sh: {name}: the text to cut is no longer in {path} once; update this script")
    open(path, "w").write(s.replace(old, new))
EOF
  ninja -C "$build" xpert > "$out/$name.log" 2>&1 || { echo "$name: the build failed ($out/$name.log)" >&2; exit 1; }
  cp "$build/xpert" "$out/$name"
  git checkout -- "${files[@]}"
  echo "$out/$name"
done
ninja -C "$build" xpert > /dev/null  # main's build back
