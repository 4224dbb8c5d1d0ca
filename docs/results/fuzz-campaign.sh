#!/usr/bin/env bash
# The fuzz campaign of docs/fuzzing.md: one process per shard (the fuzzer needs no GPU), both
# levels, the default vertical passes, SEEDS (a list) with CASES programs each; ALL_CASES > 0
# adds one shard of the "all" preset (horizontal rules too). Shards write to $WORK; $OUT gets
# campaign.json (every shard's summary and failures, and the exit status and last log lines
# of a shard that died) and a short table is printed last.
#   OUT=/tmp/out SEEDS="$(seq 2000 2015)" CASES=625 bash docs/results/fuzz-campaign.sh
set -u
OUT=${OUT:-/tmp/fuzz-out}; WORK=${WORK:-/tmp/fuzz-shards}; CASES=${CASES:-625}
SEEDS=${SEEDS:-$(seq 2000 2015)}; ALL_CASES=${ALL_CASES:-0}; ALL_SEED=${ALL_SEED:-2100}; MAX_SECONDS=${MAX_SECONDS:-420}
mkdir -p "$OUT" "$WORK"
export OMP_NUM_THREADS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
start=$(date +%s)
shard() {  # name, seed, cases, passes
  python -m optimus.cli fuzz --cases "$3" --seed "$2" --passes "$4" --max-failures 20 --max-seconds "$MAX_SECONDS" \
    --shrink-seconds 30 --max-shrink 3 --json-out "$WORK/$1.json" > "$WORK/$1.log" 2>&1
  echo $? > "$WORK/$1.rc"
}
for s in $SEEDS; do shard "vertical-s$s" "$s" "$CASES" vertical & done
if [ "$ALL_CASES" -gt 0 ]; then shard "all-s$ALL_SEED" "$ALL_SEED" "$ALL_CASES" all & fi
wait
python - "$WORK" "$OUT" "$(( $(date +%s) - start ))" <<'PY'
import glob, json, os, sys
work, out, wall = sys.argv[1], sys.argv[2], int(sys.argv[3])
shards = []
for rc_path in sorted(glob.glob(f"{work}/*.rc")):
    name = os.path.basename(rc_path)[:-3]
    rc = int(open(rc_path).read().strip() or -1)
    entry = {"shard": name, "rc": rc}
    if os.path.exists(f"{work}/{name}.json"):
        entry["summary"] = json.load(open(f"{work}/{name}.json"))
    else:  # the process died: keep where it was
        entry["log_tail"] = open(f"{work}/{name}.log", errors="replace").read()[-3000:]
    shards.append(entry)
json.dump({"wall_seconds": wall, "shards": shards}, open(f"{out}/campaign.json", "w"), indent=1)
print(f"wall seconds: {wall}")
print(f"{'shard':<18}{'rc':>4}{'generated':>10}{'passed':>8}{'skipped':>8}{'failed':>8}{'s':>6}")
tot = [0, 0, 0, 0]
for e in shards:
    s = e.get("summary", {})
    row = [s.get("generated", 0), s.get("passed", 0), sum(s.get("skipped", {}).values()), s.get("failed_cases", 0)]
    tot = [a + b for a, b in zip(tot, row)]
    print(f"{e['shard']:<18}{e['rc']:>4}{row[0]:>10}{row[1]:>8}{row[2]:>8}{row[3]:>8}{round(s.get('seconds', 0)):>6}")
print(f"{'total':<18}{'':>4}{tot[0]:>10}{tot[1]:>8}{tot[2]:>8}{tot[3]:>8}")
PY
