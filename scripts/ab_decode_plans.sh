#!/bin/bash
# scripts/ab_decode_plans.sh -- A/B of two builds' decode plan heuristics on the GPU machine (session 36;
# bench/results/logs/session36_h200.txt). Build scripts/decode_plan_print.c against each tree's oscar.h
# (plan_print_old, plan_print_new), then bundle them with the new build's oscar_tune and a shape list:
#   ../shared/tools/gpu-bundle -o .gpu build/tools/oscar_tune plan_print_old plan_print_new -- \
#       scripts/ab_decode_plans.sh shapes.txt
# shapes.txt lines: "name q_heads kv_heads head_dim group batch context [page [f16|f32]]" (context includes the
# 320 window tokens; INT2 pages of 16 and f16 scale+min unless given). On the GPU machine: .gpu/ab_decode_plans.sh. Per shape whose plans differ, one oscar_tune process
# times the new heuristic (its default candidate), the old plan, the new plan again (a noise pair) and, with a
# third printer bin/plan_print_var bundled, a variant's plan, taking turns (OSCAR_TUNE_DECODE_CANDIDATES). Log and plans in /tmp/ab36, a tarball in $OUT.
cd "$(dirname "$0")"; export LD_LIBRARY_PATH=$PWD/lib:$LD_LIBRARY_PATH OSCAR_CACHE_DIR=/tmp/oscar-jit OSCAR_TUNE_VERBOSE=1
mkdir -p /tmp/ab36 /tmp/res; L=/tmp/ab36/log.txt; : > $L
awk '{print $2,$3,$4,$5,$6,$7-320,320,($8?$8:16),($9?$9:"f16")}' shapes.txt > /tmp/ab36/in.txt
./bin/plan_print_old < /tmp/ab36/in.txt > /tmp/ab36/old.txt 2>>$L
./bin/plan_print_new < /tmp/ab36/in.txt > /tmp/ab36/new.txt 2>>$L
# an optional third build (a variant of the new rules): its plan is timed as well
if [ -x ./bin/plan_print_var ]; then ./bin/plan_print_var < /tmp/ab36/in.txt > /tmp/ab36/var.txt 2>>$L
else cp /tmp/ab36/new.txt /tmp/ab36/var.txt; fi
awk '{print $1,$2,$3,$4,$5,$6,$7,($8?$8:16),($9?$9:"f16")}' shapes.txt | paste -d' ' - /tmp/ab36/old.txt /tmp/ab36/new.txt /tmp/ab36/var.txt > /tmp/ab36/plans.txt
echo "plans done $SECONDS"
while read name hq hkv D G batch ctx page scale old new var; do
  echo "== $name $batch x $ctx old $old new $new var $var (page $page, $scale)" >> $L
  [ "$old" = "$new" ] && [ "$new" = "$var" ] && continue
  OSCAR_TUNE_DECODE_CANDIDATES="$old,$new,$var" timeout 120 ./bin/oscar_tune --q-heads $hq --kv-heads $hkv --head-dim $D \
    --group $G --batch $batch --context $ctx --page $page --scale $scale --window 320 --no-quantize --table /tmp/t.txt --results /tmp/res >> $L 2>&1
  echo "rc=$? $name $batch $ctx $SECONDS"
done < /tmp/ab36/plans.txt
tar czf $OUT/ab36.tgz -C /tmp ab36
