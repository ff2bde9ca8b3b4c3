#!/bin/bash
# The parsed turn over the same turn passed through, measured with the bench of 2170eef on the trees of earlier
# rounds (02d6e25: where the issue's +2.93 ms came from; e52dc0b: before the second round), two runs each.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
for c in 02d6e25 e52dc0b; do rm -rf /tmp/old-$c; mkdir -p /tmp/old-$c; git archive $c | tar -x -C /tmp/old-$c; git show 2170eef:benchmarks/bench_proxy.py > /tmp/old-$c/benchmarks/bench_proxy.py; done
for i in 1 2; do for c in 02d6e25 e52dc0b; do
  echo "== $c $i $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/older.log
  (cd /tmp/old-$c && PYTHONPATH=/tmp/old-$c /work/main/.venv/bin/python benchmarks/bench_proxy.py --requests 2500 --streams 4 > /tmp/old-$c/out-$i.txt 2>&1; cp benchmarks/results/proxy.json /tmp/old-$c/older-$c-$i.json)
  grep -E "passed through|Traceback|Error" /tmp/old-$c/out-$i.txt >> /tmp/older.log
done; done
