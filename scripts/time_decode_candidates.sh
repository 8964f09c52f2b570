#!/bin/bash
# scripts/time_decode_candidates.sh -- time explicit decode plans per shape on the GPU machine (session 38,
# bench/results/logs/session38_h200.txt call 4). Each line of candidates.txt:
#   "q_heads kv_heads group scale page batch context I:W:R:V[,I:W:R:V...]"
# (head dim 128; context includes the 320 window tokens; I:W:R:V = int2_splits:window_splits:requests_per_cta:int2_warps).
# All candidates of a line are timed in one oscar_tune process, taking turns (graph replay; the first timing is the
# binary's own heuristic). Bundle: ../shared/tools/gpu-bundle -o .gpu build/tools/oscar_tune -- \
#   scripts/time_decode_candidates.sh candidates.txt; on the GPU machine: .gpu/time_decode_candidates.sh (log in $OUT).
cd "$(dirname "$0")"; export LD_LIBRARY_PATH=$PWD/lib:$LD_LIBRARY_PATH OSCAR_CACHE_DIR=/tmp/oscar-jit OSCAR_TUNE_VERBOSE=1
mkdir -p /tmp/res; L=${OUT:-/tmp}/candidates_log.txt; : > $L
while read hq hkv G sc pg b ctx cands; do
  [ -n "$cands" ] || continue
  echo "== $hq/$hkv G$G $sc p$pg $b x $ctx: $cands" >> $L
  OSCAR_TUNE_DECODE_CANDIDATES="$cands" timeout 120 ./bin/oscar_tune --q-heads $hq --kv-heads $hkv --head-dim 128 \
    --group $G --batch $b --context $ctx --page $pg --scale $sc --window 320 --no-quantize --table /tmp/t.txt \
    --results /tmp/res >> $L 2>&1
  echo "rc=$? $hq/$hkv $b x $ctx $SECONDS"
done < candidates.txt
