#!/bin/bash
# Alternate before/after bench_proxy runs from two plain trees with the same bench_proxy.py.
# usage: run.sh BEFORE_COMMIT AFTER_COMMIT N   (writes /tmp/ab3/{before,after}-N.{txt,json} and /tmp/ab3/run.log)
set -e
cd /work/main
rm -rf /tmp/ab3 && mkdir -p /tmp/ab3/before /tmp/ab3/after
git archive "$1" | tar -x -C /tmp/ab3/before
git archive "$2" | tar -x -C /tmp/ab3/after
git show "$2:benchmarks/bench_proxy.py" > /tmp/ab3/before/benchmarks/bench_proxy.py
for i in $(seq 1 "${3:-3}"); do
  for arm in before after; do
    dir=/tmp/ab3/$arm
    echo "== $arm $i $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/ab3/run.log
    (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python benchmarks/bench_proxy.py --requests 2500 --streams 4 \
        > /tmp/ab3/$arm-$i.txt 2>&1; cp benchmarks/results/proxy.json /tmp/ab3/$arm-$i.json 2>/dev/null)
    grep -v '^$' /tmp/ab3/$arm-$i.txt | tail -11 >> /tmp/ab3/run.log
  done
done
