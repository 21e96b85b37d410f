# Sixth session, call 1 (H200 x2: one process per GPU at the same time). Run from the repo root.
export PYTHONUNBUFFERED=1
date -u
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
F="grep -v requests$\|capturing"
(
 export CUDA_VISIBLE_DEVICES=1
 B="python3 -m omni_tts.bench --model /tmp/ck17 --concurrency 64 --num-prompts 64 --fixed-frames 75"
 timeout 330 $B --preset ro-bs32 --modes reduce-overhead --json $OUT/ro64.json 2>&1 | $F | tail -22
 date -u
 timeout 170 $B --preset default-bs32 --modes default --json $OUT/default64.json 2>&1 | $F | tail -22
 date -u
) > $OUT/gpu1.log 2>&1 &
export CUDA_VISIBLE_DEVICES=0
(
 timeout 80 python3 docs/gpu-2026-11-30-s6/call1_devcheck.py $OUT/check.json /tmp/ck17 2>&1 | tail -40
 date -u
 S="python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32"
 timeout 200 $S --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u
 timeout 190 $S --set priority_streams=false --json $OUT/bench_noprio.json 2>&1 | $F | tail -24
 date -u
 timeout 90 python3 -m omni_tts.bench --model /tmp/ck17 --preset eager-bs32 --modes eager --concurrency 64 --num-prompts 64 --fixed-frames 75 --json $OUT/eager64.json 2>&1 | $F | tail -22
 date -u
) > $OUT/gpu0.log 2>&1
wait
date -u
tail -5 $OUT/gpu0.log $OUT/gpu1.log
