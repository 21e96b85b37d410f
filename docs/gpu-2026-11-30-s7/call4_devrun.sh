# Seventh session, call 4: reduce-overhead and default at concurrency 8 on the final commit (the issue's
# comparison with default+cudagraph), one after the other on GPU 0 (host-bound modes: no neighbour).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
F="grep -v requests$\|capturing"
export CUDA_VISIBLE_DEVICES=0
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
B="python3 -m omni_tts.bench --model /tmp/ck17 --concurrency 8 --num-prompts 16 --fixed-frames 75"
timeout 260 $B --preset ro-bs8 --modes reduce-overhead --json $OUT/ro8.json 2>&1 | $F | tail -14
date -u
timeout 200 $B --preset default-bs8 --modes default --json $OUT/default8.json 2>&1 | $F | tail -14
date -u
