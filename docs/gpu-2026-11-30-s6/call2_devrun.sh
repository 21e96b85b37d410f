# Sixth session, call 2 (a fresh H200 x2 machine). Run from the repo root.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
F="grep -v requests$\|capturing"
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
echo '{"choose_sort_free": false}' > /tmp/sorted.json
(
 export CUDA_VISIBLE_DEVICES=1
 OMNI_TTS_KERNEL_CONFIGS=/tmp/sorted.json timeout 230 python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32 --json $OUT/bench_sorted.json 2>&1 | $F | tail -24
 date -u
) > $OUT/gpu1.log 2>&1 &
export CUDA_VISIBLE_DEVICES=0
(
 timeout 100 python3 docs/gpu-2026-11-30-s6/call1_devcheck.py $OUT/check.json /tmp/ck17 2>&1 | tail -45
 date -u
 timeout 200 python3 -m omni_tts.microbench --model /tmp/ck17 --buckets 1 8 32 --skip-codec --json $OUT/mb.json 2>&1 | grep -v "requests$\|capturing" | tail -30
 date -u
) > $OUT/gpu0.log 2>&1
wait
date -u
