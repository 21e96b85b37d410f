# Sixth session, call 3 (a fresh single H200: no x2 machine was lent; the checkpoint maker now draws
# the codec's weights by fan-in). Run from the repo root.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
F="grep -v requests$\|capturing"
(
 timeout 60 python3 docs/gpu-2026-11-30-s6/call1_devcheck.py $OUT/check.json /tmp/ck17 codec 2>&1 | tail -45
 date -u
 S="python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32"
 timeout 200 $S --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u
 timeout 100 python3 -m omni_tts.bench --model /tmp/ck17 --concurrency 8 --num-prompts 16 --fixed-frames 75 --preset default-bs8 --modes default --json $OUT/default8.json 2>&1 | $F | tail -16
 date -u
 timeout 150 $S --set priority_streams=false --json $OUT/bench_noprio.json 2>&1 | $F | tail -24
 date -u
) > $OUT/gpu0.log 2>&1
date -u
