export PYTHONUNBUFFERED=1
date -u
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
(
 export CUDA_VISIBLE_DEVICES=1
 ST="python3 -m omni_tts.microbench --model /tmp/ck17 --buckets 1 --frames 2 --skip-codec --stress-slots 32 --stress-clients 64 --fixed-frames 75"
 timeout 70 $ST --modes eager --json $OUT/st_eager.json 2>&1 | grep "concurrency\|Error\|error" | head
 date -u
 timeout 120 $ST --modes default --json $OUT/st_default.json 2>&1 | grep "concurrency\|Error\|error" | head
 date -u
 timeout 175 $ST --modes reduce-overhead --json $OUT/st_ro.json 2>&1 | grep "concurrency\|Error\|error\|ready" | head
 date -u
) > $OUT/gpu1.log 2>&1 &
export CUDA_VISIBLE_DEVICES=0
timeout 55 python3 devcheck2.py $OUT/check.json $OUT/kc.json 2>&1 | tail -12
date -u
KC=$( [ -f $OUT/kc.json ] && echo $OUT/kc.json ); OMNI_TTS_KERNEL_CONFIGS=$KC timeout 320 python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32 --json $OUT/bench.json 2>&1 | grep -v "requests$\|capturing" | tail -32
date -u
wait
date -u
