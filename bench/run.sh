#!/usr/bin/env bash
# The ingest benchmark: the HTTP ceiling and the durable path side by side, in one run, on this
# machine. Each case runs against a fresh receiver (fresh ledger, fresh peak RSS).
#
#   bench/run.sh            full run (~6 minutes): 15 s per case, C = 64, B = 1 KiB, D = 0.3,
#                           a C sweep, and a ledger pre-filled with 1,000,000 jobs
#   bench/run.sh --smoke    a few hundred deliveries per case, checks correctness only (CI)
#
# Knobs (environment): DURATION (15s), CONNECTIONS (64), DUP_RATIO (0.3), BODY_BYTES (1024),
# PREFILL (1000000), SWEEP ("1 16 64 256"), BIN (a prebuilt sume-receiver; default: build release).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
[ "${1:-}" = "--smoke" ] && smoke=true

if $smoke; then
  DURATION=${DURATION:-30s}; REQUESTS=${REQUESTS:-400}; CONNECTIONS=${CONNECTIONS:-8}
  PREFILL=${PREFILL:-2000}; SWEEP=${SWEEP:-"1 8"}
else
  DURATION=${DURATION:-15s}; REQUESTS=${REQUESTS:-100000000}; CONNECTIONS=${CONNECTIONS:-64}
  PREFILL=${PREFILL:-1000000}; SWEEP=${SWEEP:-"1 16 64 256"}
fi
DUP_RATIO=${DUP_RATIO:-0.3}; BODY_BYTES=${BODY_BYTES:-1024}

source bench/lib.sh
results="$work/results.jsonl"

loadgen() { "$BIN" loadgen --config "$1/config.toml" --json "${@:2}"; }

# run_case NAME DB_EXTRA_TOML CONNECTIONS [prepare-function] -- LOADGEN_ARGS...
run_case() {
  local name=$1 extra=$2 connections=$3 prepare=$4; shift 5
  local dir="$work/$name"; mkdir -p "$dir"
  write_config "$dir" "$extra"
  [ -n "$prepare" ] && "$prepare" "$dir"
  start_receiver "$dir"
  local report; report=$(loadgen "$dir" --connections "$connections" "$@")
  local rss; rss=$(stop_receiver)
  echo "{\"name\": \"$name\", \"connections\": $connections, \"rss_kib\": $rss, \"report\": $report}" >> "$results"
  local summary
  summary=$(echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print('%.0f/s p99 %.2f ms; ledger check %s' % (r['per_second'], r['p99_ms'], r['ledger_check']))")
  echo "  $name: $summary; peak RSS ${rss} KiB" >&2
}

# A ledger that already holds $PREFILL finished jobs with ~1 KiB bodies and random job_ids,
# finished a day ago: inside every retention window, so the run measures the ledger's size,
# not a retention run.
prefill() {
  start_receiver "$1"; stop_receiver >/dev/null   # creates and migrates the ledger
  sqlite3 "$1/ledger.sqlite3" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $PREFILL)
INSERT INTO jobs (job_id, state, source, event_type, body, received_at, attempts, finished_at, updated_at)
SELECT lower(hex(randomblob(8))) || '-prefill', 'done', 'webhook', 'job.completed',
       '{"job_id":"prefill-' || i || '","type":"job.completed","result":{"pad":"' || hex(zeroblob(450)) || '"}}',
       now - i, 1, now - i, now - i
FROM n, (SELECT $NOW_MS_SQL - 86400000 AS now);
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
  echo "  prefilled $(sqlite3 "$1/ledger.sqlite3" 'SELECT count(*) FROM jobs') jobs ($(du -h "$1/ledger.sqlite3" | cut -f1))" >&2
}

# Duplicates only: claim a set of job_ids first, then re-send only those.
claim_first() {
  start_receiver "$1"
  loadgen "$1" --connections 16 --requests "$DUP_SET" --dup-ratio 0 --tag dupset >/dev/null
  stop_receiver >/dev/null
}

if $smoke; then DUP_SET=200; else DUP_SET=20000; fi
common=(--requests "$REQUESTS" --duration "$DURATION" --body-bytes "$BODY_BYTES")
echo "sume-receiver benchmark: C=$CONNECTIONS B=$BODY_BYTES D=$DUP_RATIO, $DURATION or $REQUESTS requests per case" >&2
run_case "1-ceiling-healthz"      ''                         "$CONNECTIONS" "" -- "${common[@]}" --healthz
run_case "2-full-group-commit"    ''                         "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "3-full-txn-per-request" 'max_batch = 1'            "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "4-full-sync-normal"     'synchronous = "normal"'   "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "5-full-prefilled"       ''                         "$CONNECTIONS" prefill -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "6-duplicates-only"      ''                         "$CONNECTIONS" claim_first -- "${common[@]}" --dup-ratio 1 --tag dupset --existing "$DUP_SET"
for c in $SWEEP; do
  run_case "sweep-full-c$c"       ''                         "$c" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
done

python3 - "$results" "$smoke" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {r["name"]: r["report"] for r in rows}
print(f"\n{'case':<24}{'C':>5}{'req/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'RSS MiB':>9}  statuses")
for r in rows:
    p = r["report"]
    statuses = ",".join(f"{k}:{v}" for k, v in p["statuses"].items())
    print(f"{r['name']:<24}{r['connections']:>5}{p['per_second']:>10.0f}{p['p50_ms']:>9.2f}{p['p90_ms']:>9.2f}"
          f"{p['p99_ms']:>9.2f}{p['max_ms']:>9.2f}{r['rss_kib']/1024:>9.1f}  {statuses}")
def ratio(a, b):
    return by[a]["per_second"] / by[b]["per_second"]
print()
print(f"(2)/(1) durable vs HTTP ceiling : {ratio('2-full-group-commit', '1-ceiling-healthz'):.2f}  (target >= 0.5)")
print(f"(2)/(3) group commit vs naive   : {ratio('2-full-group-commit', '3-full-txn-per-request'):.2f}  (target >= 10)")
print(f"(5)/(2) prefilled vs empty ledger: {ratio('5-full-prefilled', '2-full-group-commit'):.2f}  (target >= 0.8)")
print(f"(4)/(2) synchronous normal/full : {ratio('4-full-sync-normal', '2-full-group-commit'):.2f}")
print(f"peak RSS max                    : {max(r['rss_kib'] for r in rows)/1024:.1f} MiB (target <= 64)")
bad = [r["name"] for r in rows if any(k not in ("200",) for k in r["report"]["statuses"])]
if bad:
    sys.exit(f"non-200 answers in: {', '.join(bad)}")
PY
