#!/bin/bash
# Scratch driver for one device call (not committed).
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUCO_HOME=/tmp/h NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo "=== $* ($(date +%T))"; }
for part in "$@"; do
  case $part in
    doctor) step doctor; python -m cuco doctor 2>&1 | tail -4 ;;
    diag) step diag; python benchmarks/diagnose_ag_overlap.py 2>&1 | tail -12 ;;
    sweep8k) step sweep8k; python benchmarks/strategy_sweep.py --shape 8k --out $OUT --points 'ce/stream_overlap/chunk/cta/*' 'ce/split_put_wait/global/cta/*' 'ce/deferred/global/cta/1' 'lsa/stream_overlap/chunk/cta/2' 'lsa/split_put_wait/global/cta/1' 2>&1 | grep -v '^{' | tail -25 ;;
    evolveA) step evolveA; python benchmarks/evolve_gemm_allgather.py --out $OUT --plan 8k:40 4k:15 1k:15 decode:15 2>&1 | grep -v "^ *$" | tail -20 ;;
    evolveB) step evolveB; python benchmarks/evolve_gemm_allgather.py --out $OUT --plan 8k_ffn:10 2>&1 | tail -8 ;;
    coll) step coll; python benchmarks/collectives.py --out $OUT --ctas 64 > $OUT/coll.log 2>&1; tail -15 $OUT/coll.log ;;
    fastgpu) step fastgpu; python -m pytest -q -m gpu tests/test_fastpath_rewrite.py 2>&1 | tail -5 ;;
    transform) step transform; /usr/bin/time -f "transform wall %e s" python -m cuco transform gemm_allgather --out /tmp/t.cu 2>&1 | tail -8 ;;
    strat) step strat; timeout 330 python -m pytest -q tests/test_gpu_strategies.py 2>&1 | tail -5 ;;
    faults) step faults; python -m pytest -q tests/test_gpu_faults.py 2>&1 | tail -5 ;;
  esac
done
step done
