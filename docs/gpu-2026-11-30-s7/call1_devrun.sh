# Seventh session, call 1: the codec's pending-sum vocoder (check + timing), the projection sweep with
# whole-row tiles for one row (predictor with PDL, talker without and with), the seed bench on the
# sweep's configs. GPU 1 (when lent) takes the codec check and the talker-with-PDL sweep.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
date -u
NGPU=$(nvidia-smi -L | wc -l)
S=docs/gpu-2026-11-30-s7
F="grep -v requests$\|capturing"
python3 -c "from omni_tts.checkpoint_maker import make_checkpoint; make_checkpoint('/tmp/ck17','1.7B',device='cuda',dtype='bfloat16')" 2>&1 | tail -2
side() {
 timeout 90 python3 $S/call1_codec.py $OUT/codec.json /tmp/ck17 2>&1 | tail -30
 date -u
 timeout 200 python3 -m omni_tts.kernel_sweep --quick --rows 1 --parts talker --talker-pdl --out $OUT/kc_tpdl.json 2>&1 | grep -v "Error$" | tail -8
 date -u
}
if [ "$NGPU" -ge 2 ]; then (CUDA_VISIBLE_DEVICES=1 side > $OUT/gpu1.log 2>&1) & fi
export CUDA_VISIBLE_DEVICES=0
(
 timeout 150 python3 -m omni_tts.kernel_sweep --quick --rows 1 --parts predictor --out $OUT/kc_p.json 2>&1 | grep -v "Error$" | tail -8
 date -u
 timeout 150 python3 -m omni_tts.kernel_sweep --quick --rows 1 --parts talker --out $OUT/kc_t.json 2>&1 | grep -v "Error$" | tail -8
 date -u
 python3 -c "import json,sys; d={**json.load(open('$OUT/kc_p.json')),**json.load(open('$OUT/kc_t.json'))}; json.dump(d,open('/tmp/kc.json','w'))" && export OMNI_TTS_KERNEL_CONFIGS=/tmp/kc.json
 timeout 230 python3 -m omni_tts.bench --model /tmp/ck17 --preset graph-bs32 --modes default+cudagraph --concurrency 1 8 32 --fixed-frames 75 --num-prompts 32 --json $OUT/bench.json 2>&1 | $F | tail -24
 date -u
 if [ "$NGPU" -lt 2 ]; then side; fi
) > $OUT/gpu0.log 2>&1
wait
date -u
