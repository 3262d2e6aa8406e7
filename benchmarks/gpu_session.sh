# One call on a lent GPU machine (JAX, Flax, Optax, Orbax, Pillow; no TensorFlow, no internet, ~10 minutes):
# bench the 64x64 training config, train it until a deadline, generate ddim eval's images for FID, pack the
# checkpoint for the next call, then bench the Keras network at batch 64/256 in float32/bfloat16 while time lasts.
#
# Prepare here (see docs/benchmarks.md, "GPU figures"):
#   python benchmarks/export_flowers_folder.py .gpu/flowers64 --config configs/flowers64-fast.toml   # 31 MiB
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl grain array-record portpicker
#   (both folders listed in .git/info/exclude, carried with the call)
# Run there:  TRAIN_END=340 BENCH_END=500 bash benchmarks/gpu_session.sh      (carry .whl and .gpu)
#             CONFIG= and DATA= train another config, e.g. the 32x32 bundle's recipe for longer (its folder: 14 MB):
#             CONFIG=configs/flowers32.toml DATA=.gpu/flowers32 EXTRA="--set train.num_epochs=60" STEPS=30660 \
#               TRAIN_END=480 BENCH_END=0 NSAMP=1000 bash benchmarks/gpu_session.sh
#             (the bundled flowers32 is this with num_epochs=120 STEPS=61200 TRAIN_END=450, then resumed: docs/training.md)
#             STEPS=N skips the first bench and sets train.max_steps=N (the config's epochs still cap it; BENCH_END=0: no last benches)
# Back here:  $OUT holds ckpt-STEP.tar.partNN (cat them | tar x -C RUN), samples-N.npz (score them with
#             benchmarks/fid_of_samples.py) and logs.tgz (the bench JSONs and the training log).
# To continue a run, untar the parts into .gpu/run-in/ and set RESUME=.gpu/run-in: the same command resumes it.
#             (a call carries at most 64 MiB in: with a 32x32 checkpoint (33 MB), its folder and the wheels, the
#             bundled weights (ddim/pretrained/*/weights.safetensors, 18 MB) were moved out of the tree for the call)
# The config trains by class with model.class_embedding = "adm", as the bundled flowers64 (2026-11-26) did; a
# checkpoint of the first GPU run predates it and resumes only with EXTRA="--set model.class_embedding=noise-features".
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site DDIM_COMPILATION_CACHE=off
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
TRAIN_END=${TRAIN_END:-360}; BENCH_END=${BENCH_END:-540}; NSAMP=${NSAMP:-5000}; WD=${WD:-/tmp/run}
CONFIG=${CONFIG:-configs/flowers64-fast.toml}; DATA=${DATA:-.gpu/flowers64}; STEPS_CAP=${STEPS_CAP:-25550}; BW=${BW:-"--windows 3 --window-steps 10 --sample-repeats 2"}
TRAIN=(--config "$CONFIG" --data "$DATA" --set model.class_conditional=true $EXTRA)
mkdir -p "$OUT/logs"
if [ -d .whl ] && [ -z "$SKIPWHL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -n "$RESUME" ] && cp -r "$RESUME" "$WD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/logs/gpu.txt"
python3 -c "import jax, flax; print(jax.__version__, flax.__version__, jax.devices())"

if [ -z "$STEPS" ]; then
echo "[$(el)s] bench $CONFIG b64 float32 (the training config, with its input pipeline)"
python3 benchmarks/bench.py "${TRAIN[@]}" --set train.max_steps=1000 --skip-cli $BW --input-batches 100 \
  --out "$OUT/logs/bench-fast-b64-fp32.json" > "$OUT/logs/bench-fast.log" 2>&1
STEP_S=$(python3 -c "import json; print(json.load(open('$OUT/logs/bench-fast-b64-fp32.json'))['train_seconds_per_step'])" \
  2>/dev/null || echo 0.05)
# The cosine schedule's length: what fits before the deadline (15% for evaluation, checkpoints and compiling).
STEPS=$(python3 -c "print(min($STEPS_CAP, max(200, int(($TRAIN_END - $(el) - 45) / ($STEP_S * 1.15)))))")
fi
[ -n "$RESUME" ] && STEPS=$(python3 -c "import json; print(json.load(open('$WD/steps.json')))")
echo "$STEPS" > /tmp/steps.json
echo "[$(el)s] a schedule of $STEPS steps"
# Past the deadline, SIGINT: the loop saves a checkpoint and stops (the same command resumes it).
timeout -s INT -k 40 $(( TRAIN_END - $(el) )) python3 -m ddim.cli train "${TRAIN[@]}" --set train.max_steps=$STEPS \
  --set train.eval_every=5 --set train.checkpoint_every=2000 --set train.log_every=250 --workdir "$WD" \
  > "$OUT/logs/train.log" 2>&1
echo "[$(el)s] train rc $?"; tail -3 "$OUT/logs/train.log"
cp /tmp/steps.json "$WD/steps.json"
python3 benchmarks/generate_eval_samples.py "$WD" --num "$NSAMP" --out /tmp/samples 2>&1 | tail -1
LAST=$(ls "$WD/checkpoints" | grep -E '^[0-9]+$' | sort -n | tail -1)
tar -C "$WD" --exclude=data_cache --exclude=checkpoints -cf /tmp/run.tar . && tar -C "$WD" -rf /tmp/run.tar "checkpoints/$LAST"
split -b 15M -d /tmp/run.tar "$OUT/ckpt-$LAST.tar.part"
echo "[$(el)s] packed step $LAST"

for batch in 64 256; do for dtype in float32 bfloat16; do
  [ "$(el)" -gt $(( BENCH_END - 50 )) ] && break 2
  echo "[$(el)s] bench flowers64 (the Keras network) b$batch $dtype"
  python3 benchmarks/bench.py --config configs/flowers64.toml --set train.batch_size=$batch --set model.dtype=$dtype \
    --sample-num $batch --skip-cli --skip-input $BW --out "$OUT/logs/bench-keras-b$batch-$dtype.json" \
    > "$OUT/logs/bench-keras-b$batch-$dtype.log" 2>&1
done; done

# What comes back: at most 8 files of 16 MiB, 64 MiB in all; the checkpoint first, then whole sample chunks.
USED=$(du -cb "$OUT"/ckpt-* | tail -1 | cut -f1)
for f in $(ls /tmp/samples/samples-*.npz | sort -V); do
  s=$(stat -c %s "$f"); [ $(( USED + s )) -lt 62000000 ] && mv "$f" "$OUT/" && USED=$(( USED + s ))
done
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
echo "[$(el)s] done"; ls -la "$OUT"
