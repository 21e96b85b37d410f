#!/bin/bash
# final device call: GPU0 = seed bench (default+cudagraph) then 64-client stress; GPU1 = reduce-overhead and eager load rows
cd "$(dirname "$0")"
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" > /tmp/ckpt.log 2>&1
B="--model /tmp/ck17 --preset graph-bs32 --concurrency 1 8 32 --fixed-frames 75"
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 230 python3 -m omni_tts.bench $B --modes reduce-overhead --num-prompts 8 --json $OUT/g1_ro.json > /tmp/g1_ro.log 2>&1
  grep -E "^\||Error|ready in" /tmp/g1_ro.log > $OUT/g1.log
  timeout 330 python3 -m omni_tts.bench $B --modes eager --num-prompts 2 --warmup 1 --json $OUT/g1_eager.json > /tmp/g1_eager.log 2>&1
  grep -E "^\||Error|ready in" /tmp/g1_eager.log >> $OUT/g1.log
) &
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m omni_tts.bench $B --modes default+cudagraph --num-prompts 32 --json $OUT/g0_bench.json > /tmp/g0_bench.log 2>&1
  grep -E "^\||Error|ready in" /tmp/g0_bench.log > $OUT/g0.log
  timeout 240 python3 -m omni_tts.microbench --model /tmp/ck17 --modes default+cudagraph --buckets 1 8 16 32 64 --frames 4 --skip-codec \
     --stress-slots 16 64 --stress-clients 64 --json $OUT/g0_stress.json > /tmp/g0_stress.log 2>&1
  grep -E "Error|stress|ready in" /tmp/g0_stress.log | cut -c1-300 | tail -20 >> $OUT/g0.log
) &
wait
