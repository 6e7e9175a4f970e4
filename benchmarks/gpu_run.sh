#!/bin/bash
# The measurements of one lent GPU run (docs/gpu.md), from the repository root: each piece time-guarded,
# its results tarred into $OUT after each piece so that a run stopped at its limit still returns them. The
# --chunk-size 16384 runs are the CPU-sized chunk, beside the default sized for the device.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/res; mkdir -p $R
finish() { (cd /tmp && tar czf "$OUT/res.tgz" res); }
nvidia-smi -L; nproc
python -c "import torch, botorch, gpytorch; print(torch.__version__, botorch.__version__, gpytorch.__version__)"
L="python -m benchmarks.launches --device cuda"
timeout 150 $L --cases bkb_anchor bbkb_anchor bkb_large bkb_large_all --out $R/l5 2>&1 | tail -8
finish
# the fixed-capacity update (the GPU's default) beside the eager one, at 10^6 and 10^7 arms
timeout 90 $L --cases bkb_anchor_eager bbkb_anchor_eager bkb_large_eager --out $R/l5e 2>&1 | tail -6
finish
timeout 90 $L --cases bkb_large_fixed bkb_large_eager bkb_large_all_eager --arms 1000000 --out $R/l6f 2>&1 | tail -6
finish
timeout 120 $L --cases bkb_large_fixed bkb_large_eager --arms 10000000 --out $R/l7f 2>&1 | tail -6
finish
timeout 60 $L --cases bkb_large bkb_large_all --arms 1000000 --out $R/l6 2>&1 | tail -4
finish
timeout 60 $L --cases bkb_large bkb_large_all --arms 1000000 --chunk-size 16384 --out $R/l6c 2>&1 | tail -4
finish
timeout 80 $L --cases bkb_large bkb_large_all --arms 10000000 --out $R/l7 2>&1 | tail -4
finish
timeout 60 $L --cases bkb_large bkb_large_all --arms 10000000 --chunk-size 16384 --out $R/l7c 2>&1 | tail -4
finish
for dev in cuda cpu; do
  timeout 60 python -m benchmarks.batch --device $dev --threads 2 --methods BBKB:constant --seeds 3 \
    --out $R/batch_$dev 2>&1 | grep -E "median|BBKB" | tail -6
  finish
done
timeout 90 python -m benchmarks.botorch_peer --device cuda --sizes 500 1000 2000 5000 --out $R/peer 2>&1 | tail -12
finish
timeout 200 python -m pytest -q -n 14 -p no:cacheprovider -o addopts="" tests 2>&1 | tail -15
finish
