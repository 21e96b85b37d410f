# Seventh session, call 2: the seed bench on the committed configs (whole-row one-row tiles, pending-sum
# vocoder), then the talker's kernels with PDL on their PDL-swept configs. GPU 1 (when lent), after GPU
# 0's first bench: the frame steps' per-bucket costs and kernel profiles at 1 and 32 rows.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
NGPU=$(nvidia-smi -L | wc -l)
S=docs/gpu-2026-11-30-s7
F="grep -v requests$\|capturing"
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
B="python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32"
MB="python3 -m omni_tts.microbench --model /tmp/ck17 --modes default+cudagraph --buckets 1 32 --skip-codec --profile-buckets 1 32 --json $OUT/mb.json"
if [ "$NGPU" -ge 2 ]; then (while [ ! -e /tmp/done1 ]; do sleep 2; done; CUDA_VISIBLE_DEVICES=1 timeout 240 $MB 2>&1 | grep -v capturing | tail -40 > $OUT/gpu1.log 2>&1) & fi
export CUDA_VISIBLE_DEVICES=0
(
 timeout 230 $B --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u; touch /tmp/done1
 OMNI_TTS_KERNEL_CONFIGS=$S/call1_kc_tpdl.json timeout 170 $B --set talker_kernel_pdl=true --json $OUT/bench_tpdl.json 2>&1 | $F | tail -24
 date -u
 if [ "$NGPU" -lt 2 ]; then timeout 150 $MB 2>&1 | grep -v capturing | tail -40; fi
) > $OUT/gpu0.log 2>&1
wait
date -u
