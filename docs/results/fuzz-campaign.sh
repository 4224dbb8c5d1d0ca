#!/usr/bin/env bash
# The fuzz campaign of docs/fuzzing.md: SHARDS shards of CASES programs each, one process per
# core (the fuzzer needs no GPU), both levels, the default vertical passes; then one shard of
# the "all" preset (horizontal rules too). Each shard's summary goes to $OUT/fuzz-s<seed>.json
# and a short table is printed last.
#   OUT=/tmp/out SHARDS=16 CASES=625 bash docs/results/fuzz-campaign.sh
set -u
OUT=${OUT:-/tmp/fuzz-out}; SHARDS=${SHARDS:-16}; CASES=${CASES:-625}; BASE=${BASE:-2000}
ALL_CASES=${ALL_CASES:-0}; MAX_SECONDS=${MAX_SECONDS:-420}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
start=$(date +%s)
for s in $(seq 0 $((SHARDS - 1))); do
  python -m optimus.cli fuzz --cases "$CASES" --seed $((BASE + s)) --max-failures 20 --max-seconds "$MAX_SECONDS" \
    --shrink-seconds 30 --max-shrink 3 --quiet --json-out "$OUT/fuzz-s$((BASE + s)).json" > "$OUT/fuzz-s$((BASE + s)).txt" 2>&1 &
done
if [ "$ALL_CASES" -gt 0 ]; then
  python -m optimus.cli fuzz --cases "$ALL_CASES" --seed $((BASE + 100)) --passes all --max-failures 20 --max-seconds "$MAX_SECONDS" \
    --shrink-seconds 30 --max-shrink 3 --quiet --json-out "$OUT/fuzz-all-s$((BASE + 100)).json" > "$OUT/fuzz-all-s$((BASE + 100)).txt" 2>&1 &
fi
wait
echo "wall seconds: $(( $(date +%s) - start ))"
python - "$OUT" <<'PY'
import glob, json, sys
rows = []
for p in sorted(glob.glob(f"{sys.argv[1]}/fuzz-*.json")):
    d = json.load(open(p))
    s = d.get("summary", d)
    rows.append((p.rsplit("/", 1)[1], s.get("passes"), s.get("generated"), s.get("passed"), s.get("skipped"), s.get("failed"), round(s.get("seconds", 0))))
print(f"{'shard':<24}{'passes':<12}{'generated':>10}{'passed':>8}{'skipped':>8}{'failed':>8}{'s':>6}")
for r in rows:
    print(f"{r[0]:<24}{str(r[1]):<12}{r[2]!s:>10}{r[3]!s:>8}{r[4]!s:>8}{r[5]!s:>8}{r[6]!s:>6}")
PY
