#!/usr/bin/env bash
# Usage: git worktree add ../widelimit-before a148990 && BEFORE=$(realpath ../widelimit-before) bash benchmarks/before_after.sh
# The three foundation benchmarks on the tree before this round (a148990) and on main, each run with its own code.
set -u
OUT=$(realpath -m "${OUT:-benchmarks/results/before_after_0.2}"); mkdir -p "$OUT"
for tree in before main; do
  d=${BEFORE:-../widelimit-before}; [ $tree = main ] && d=$(pwd)
  export PYTHONPATH=$d
  ( cd $d && python3 -c "import widelimit,sys; print(widelimit.__file__)" > $OUT/which_$tree.txt )
  ( cd $d && python3 benchmarks/scale.py --N 1000000 --repeat 3 > $OUT/scale_$tree.txt 2>&1 )
  ( cd $d && python3 benchmarks/exact_vs_cvxpy.py --sizes 2000 20000 > $OUT/cvxpy_$tree.txt 2>&1 )
  ( cd $d && python3 benchmarks/streaming.py --N 4000000 --dir /tmp/wl-stream-$tree --out $OUT/stream_$tree > $OUT/stream_$tree.txt 2>&1 )
done
echo done
