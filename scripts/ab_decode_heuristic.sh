#!/bin/bash
# scripts/ab_decode_heuristic.sh CFG... -- A/B of two builds' decode plan heuristics on the GPU machine
# (session 35; bench/results/logs/session35_h200.txt). Bundle both oscar_tune builds first, the old one renamed:
#   ../shared/tools/gpu-bundle -o .gpu build/tools/oscar_tune /tmp/old/oscar_tune_old -- scripts/ab_decode_heuristic.sh
# then on the GPU machine: .gpu/ab_decode_heuristic.sh r4 r8 (configs: r2 r4 r7 r8 r16 d64 d256).
# Per config and shape set, each build's oscar_tune runs in turn with OSCAR_TUNE_VERBOSE=1: its default candidate
# is the heuristic alone (the table is suppressed for it), and the verbose log holds every candidate's median, so
# one run gives both the A/B and the curve around each choice. Logs go to /tmp/ab/CFG.log, a tarball to $OUT.
cd "$(dirname "$0")"; export LD_LIBRARY_PATH=$PWD/lib:$LD_LIBRARY_PATH OSCAR_CACHE_DIR=/tmp/oscar-jit OSCAR_TUNE_VERBOSE=1
mkdir -p /tmp/ab /tmp/res_old /tmp/res_new; L=/tmp/ab
args() { case $1 in
  r2) echo "--q-heads 16 --kv-heads 8 --head-dim 128";; r4) echo "--q-heads 32 --kv-heads 8 --head-dim 128";;
  r7) echo "--q-heads 28 --kv-heads 4 --head-dim 128";; r8) echo "--q-heads 64 --kv-heads 8 --head-dim 128";;
  r16) echo "--q-heads 128 --kv-heads 8 --head-dim 128";; d64) echo "--q-heads 32 --kv-heads 8 --head-dim 64 --group 64";;
  d256) echo "--q-heads 32 --kv-heads 8 --head-dim 256 --group 256";; esac; }
extra() { case $1 in
  r4) echo "8,16,64:16K,32K";; r8) echo "8,16,32,64:16K,32K 256:16K";; r16) echo "1:128K";;
  d64) echo "8:32K";; d256) echo "8:32K 1:128K";; esac; }
for cfg in "$@"; do
  for set in "2,6,12,24,48:6K,12K,24K,48K" "96:6K,12K,24K" "192:6K,12K" "4,8,32,64:4K,8K" $(extra $cfg); do
    b=${set%%:*}; c=${set##*:}
    for v in old new; do
      bin=./bin/oscar_tune; [ $v = old ] && bin=./bin/oscar_tune_old
      echo "== $cfg $v batch $b context $c" >> $L/$cfg.log
      rm -f /tmp/t_$v.txt
      $bin $(args $cfg) --batch $b --context $c --page 16 --window 320 --no-quantize --table /tmp/t_$v.txt --results /tmp/res_$v >> $L/$cfg.log 2>&1
      echo "rc=$? $cfg $v $b $c $SECONDS"
    done
  done
  tar czf $OUT/ab.tgz -C /tmp ab
done
