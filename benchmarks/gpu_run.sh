#!/bin/bash
# The measurements of one lent GPU run (docs/gpu.md), from the repository root: each piece time-guarded (about 1195 s
# if each ran to its limit; run it with timeout_s ~590), in the order of what matters most, its results tarred into
# $OUT after each piece so that a run stopped at its limit still returns them. `_fixed` cases run the GPU's defaults
# (the fixed-capacity update, BBKB's device loop with its picks replayed from CUDA graphs and its batch-end update
# read with the next batch), `_eager` ones the CPU's (the eager update, the lazy loop), on the same machine; on CUDA
# the fixed-capacity update replays from CUDA graphs, `--no-update-graphs` launches it operation by operation (the
# comparison at 10⁶ arms and on the anchor).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res; mkdir -p $R
finish() { (cd /tmp && tar czf "$OUT/res.tgz" res); }
nvidia-smi -L
python -c "import torch, botorch, gpytorch; print(torch.__version__, botorch.__version__, gpytorch.__version__)"
L="python -m benchmarks.launches --device cuda"
# (bkb_large_all_eager: the eager step without pruning, whose UCB bound costs a read)
timeout 100 $L --cases bkb_large_fixed bkb_large_eager bkb_large_all_eager --arms 1000000 --steps 10 \
  --timed-steps 30 --out $R/l1000000 2>&1 | tee $R/l1000000.log | tail -3
finish
# the suite with its CUDA variants early: its failures' names are what a session without a GPU can act on
timeout 200 python -m pytest -q -n 16 -p no:cacheprovider -o addopts="" --timeout 90 -rfE --tb=short tests \
  > $R/pytest.txt 2>&1
tail -4 $R/pytest.txt; grep FAILED $R/pytest.txt | head; finish
# at 10⁶ arms m_cap × A passes FIXED_ROWS_MAX, so `_fixed` runs the eager update past it: --fixed-rows-max 1e12
# measures the fixed-capacity update there as well
timeout 60 $L --cases bkb_large_fixed --fixed-rows-max 1e12 --arms 1000000 --steps 10 --timed-steps 30 \
  --out $R/lfx 2>&1 | tee $R/lfx.log | tail -3
finish
# the dictionary's rows streamed at 10⁶ arms (every update recomputes them; their finiteness read once a pass)
timeout 60 $L --cases bkb_large_eager --kernel-cache-bytes 0 --arms 1000000 --steps 10 --timed-steps 30 \
  --out $R/lst 2>&1 | tee $R/lst.log | tail -3
finish
# where the host's time goes in the eager step at 10⁶ arms and the anchor's fixed update (phase timers, CUDA events)
timeout 60 python -m benchmarks.step_phases --device cuda --cases bkb_large_eager bkb_anchor_fixed --arms 1000000 \
  --warmup 100 --steps 20 --out $R/sp 2>&1 | tee $R/sp.log | grep -E "self|device|step " | head -40
finish
timeout 30 $L --cases bkb_anchor_fixed --steps 10 --timed-steps 50 --out $R/la 2>&1 | tee $R/la.log \
  | tail -3
timeout 60 $L --cases bkb_anchor_fixed --compiled --steps 10 --timed-steps 50 --out $R/lac 2>&1 \
  | tee $R/lac.log | tail -3
timeout 30 $L --cases bkb_anchor_fixed --no-update-graphs --steps 10 --timed-steps 50 --out $R/lang 2>&1 \
  | tee $R/lang.log | tail -3
finish
timeout 80 $L --cases bkb_large_fixed bkb_large_eager --arms 10000000 --steps 10 --timed-steps 30 --out $R/l10000000 \
  2>&1 | tee $R/l10000000.log | tail -3
finish
timeout 60 $L --cases bbkb_cadata_fixed bbkb_cadata_eager --warmup 40 --steps 10 --timed-steps 10 --out $R/lc \
  2>&1 | tee $R/lc.log | tail -3
finish
timeout 45 $L --cases bbkb_cadata_fixed --host-rewards --warmup 40 --steps 10 --timed-steps 10 --out $R/lch \
  2>&1 | tee $R/lch.log | tail -3
finish
timeout 60 $L --cases bbkb_cadata_fixed --compiled-picks --warmup 40 --steps 10 --timed-steps 10 --out $R/lcc \
  2>&1 | tee $R/lcc.log | tail -3
finish
for dev in cuda cpu; do
  timeout 50 python -m benchmarks.batch --device $dev --threads 2 --methods BBKB:constant --seeds 3 \
    --out $R/batch_$dev 2>&1 | tee $R/batch_$dev.log | grep -E "median_wall|BBKB \(" | tail -4
  finish
done
timeout 60 python -m benchmarks.batch --device cuda --threads 2 --methods BBKB:constant --seeds 3 --compiled-picks \
  --out $R/batch_cuda_compiled 2>&1 | tee $R/batch_cuda_compiled.log | grep -E "median_wall|BBKB \(" | tail -4
finish
timeout 60 python -m benchmarks.pick_loop --device cuda --variants eager flagged graph graph_compiled --repeats 20 \
  --out $R/pl 2>&1 | tee $R/pl.log | tail -6
finish
timeout 130 python -m benchmarks.botorch_peer --device cuda --sizes 100 500 1000 2000 5000 --out $R/bp 2>&1 \
  | tee $R/bp.log | grep "^n="
finish
python - <<'P'
import json, glob
for f in sorted(glob.glob("/tmp/res/l*/launches.json")):
    for r in json.load(open(f))["rows"]:
        print(f, r["case"], r["update_graphs_built"], r["syncs_per_pick"], r["picks_per_step"], r["step_ms"])
        [print("  ", v, k) for k, v in r["sync_sites"].items()]
P
