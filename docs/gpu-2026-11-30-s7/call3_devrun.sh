# Seventh session, call 3 (final): the seed bench on the final commit (talker one-row PDL configs), run
# twice; GPU 1 (when lent), after the first: 64 concurrent requests on 32 and 64 slots in default+cudagraph
# (the pending-sum vocoder at up to 64 rows) and the frame steps at 1 and 32 rows.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
NGPU=$(nvidia-smi -L | wc -l)
F="grep -v requests$\|capturing"
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
B="python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32"
ST="python3 -m omni_tts.microbench --model /tmp/ck17 --modes default+cudagraph --buckets 1 32 --skip-codec --stress-slots 32 64 --stress-clients 64 --fixed-frames 75 --json $OUT/stress.json"
if [ "$NGPU" -ge 2 ]; then (while [ ! -e /tmp/done1 ]; do sleep 2; done; CUDA_VISIBLE_DEVICES=1 timeout 260 $ST 2>&1 | grep -v capturing | tail -30 > $OUT/gpu1.log 2>&1) & fi
export CUDA_VISIBLE_DEVICES=0
(
 timeout 230 $B --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u; touch /tmp/done1
 timeout 120 $B --json $OUT/bench_again.json 2>&1 | $F | tail -24
 date -u
 if [ "$NGPU" -lt 2 ]; then timeout 200 $ST 2>&1 | grep -v capturing | tail -30; fi
) > $OUT/gpu0.log 2>&1
wait
date -u
