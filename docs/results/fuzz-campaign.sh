#!/usr/bin/env bash
# The fuzz campaign of docs/fuzzing.md: one shard per seed, run in parallel (the fuzzer needs
# no GPU), both levels, the default vertical passes; each seed's CASES programs run as chunks
# of CHUNK cases, one process per chunk (--first), so a crash in torch ends one chunk, not the
# shard. ALL_CASES > 0 adds one shard of the "all" preset (horizontal rules too). MAX_SECONDS
# bounds each shard. Chunks write to $WORK; $OUT gets campaign.json (every chunk's summary and
# failures, and the exit status and last log lines of a chunk that died) and a short table is
# printed last.
#   OUT=/tmp/out SEEDS="$(seq 2000 2015)" CASES=625 bash docs/results/fuzz-campaign.sh
set -u
OUT=${OUT:-/tmp/fuzz-out}; WORK=${WORK:-/tmp/fuzz-shards}; CASES=${CASES:-625}; CHUNK=${CHUNK:-125}
SEEDS=${SEEDS:-$(seq 2000 2015)}; ALL_CASES=${ALL_CASES:-0}; ALL_SEED=${ALL_SEED:-2100}; MAX_SECONDS=${MAX_SECONDS:-420}
mkdir -p "$OUT" "$WORK"
export OMP_NUM_THREADS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
start=$(date +%s)
shard() {  # name, seed, cases, passes: chunk after chunk until the cases or the time are used up
  local first=0 left
  while [ "$first" -lt "$3" ]; do
    left=$(( MAX_SECONDS - ($(date +%s) - start) ))
    [ "$left" -le 0 ] && break
    local n=$(( $3 - first < CHUNK ? $3 - first : CHUNK )) name="$1-c$first"
    python -m optimus.tools.cli fuzz --cases "$n" --first "$first" --seed "$2" --passes "$4" --max-failures 20 \
      --max-seconds "$left" --shrink-seconds 30 --max-shrink 3 --quiet --json-out "$WORK/$name.json" > "$WORK/$name.log" 2>&1
    echo $? > "$WORK/$name.rc"
    first=$(( first + n ))
  done
}
for s in $SEEDS; do shard "vertical-s$s" "$s" "$CASES" vertical & done
if [ "$ALL_CASES" -gt 0 ]; then shard "all-s$ALL_SEED" "$ALL_SEED" "$ALL_CASES" all & fi
wait
python - "$WORK" "$OUT" "$(( $(date +%s) - start ))" <<'PY'
import collections, glob, json, os, re, sys
work, out, wall = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunks = []
for rc_path in sorted(glob.glob(f"{work}/*.rc")):
    name = os.path.basename(rc_path)[:-3]
    rc = int(open(rc_path).read().strip() or -1)
    entry = {"chunk": name, "rc": rc}
    if os.path.exists(f"{work}/{name}.json"):
        entry["summary"] = json.load(open(f"{work}/{name}.json"))
    else:  # the process died: keep where it was
        entry["log_tail"] = open(f"{work}/{name}.log", errors="replace").read()[-3000:]
    chunks.append(entry)
json.dump({"wall_seconds": wall, "chunks": chunks}, open(f"{out}/campaign.json", "w"), indent=1)
rows = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0, 0.0])  # chunks, died, generated, passed, skipped, failed, seconds
for e in chunks:
    r, s = rows[re.sub(r"-c\d+$", "", e["chunk"])], e.get("summary", {})
    r[0] += 1
    r[1] += "summary" not in e
    for i, v in enumerate((s.get("generated", 0), s.get("passed", 0), sum(s.get("skipped", {}).values()), s.get("failed_cases", 0)), 2):
        r[i] += v
    r[6] += s.get("seconds", 0)
print(f"wall seconds: {wall}")
print(f"{'shard':<18}{'chunks':>7}{'died':>5}{'generated':>10}{'passed':>8}{'skipped':>8}{'failed':>8}{'s':>6}")
tot = [0] * 6
for name, r in sorted(rows.items()):
    tot = [a + b for a, b in zip(tot, r[:6])]
    print(f"{name:<18}{r[0]:>7}{r[1]:>5}{r[2]:>10}{r[3]:>8}{r[4]:>8}{r[5]:>8}{round(r[6]):>6}")
print(f"{'total':<18}{tot[0]:>7}{tot[1]:>5}{tot[2]:>10}{tot[3]:>8}{tot[4]:>8}{tot[5]:>8}")
PY
