# Sixth session, call 4 (final): the Triton SnakeBeta writing the conv padding, fan-in codec weights (gain
# 0.5). Runs on one H200, or on two when lent (default mode at concurrency 8 then runs on the second).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
F="grep -v requests$\|capturing"
D8="python3 -m omni_tts.bench --model /tmp/ck17 --concurrency 8 --num-prompts 16 --fixed-frames 75 --preset default-bs8 --modes default --json $OUT/default8.json"
NGPU=$(nvidia-smi -L | wc -l)
if [ "$NGPU" -ge 2 ]; then (CUDA_VISIBLE_DEVICES=1 timeout 200 $D8 2>&1 | $F | tail -16 > $OUT/gpu1.log) & fi
export CUDA_VISIBLE_DEVICES=0
(
 timeout 60 python3 docs/gpu-2026-11-30-s6/call1_devcheck.py $OUT/check.json /tmp/ck17 codec 2>&1 | grep -v "^---" | tail -40
 date -u
 timeout 200 python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32 --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u
 if [ "$NGPU" -lt 2 ]; then timeout 150 $D8 2>&1 | $F | tail -16; date -u; fi
 # the same seed bench again (warm compile caches): run-to-run spread
 timeout 130 python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32 --json $OUT/bench_again.json 2>&1 | $F | tail -24
 date -u
) > $OUT/gpu0.log 2>&1
wait
date -u
