#!/usr/bin/env bash
# The ingest benchmark: the HTTP ceiling and the durable path side by side, in one run, on this
# machine. Each case runs against a fresh receiver (fresh ledger, fresh peak RSS).
#
#   bench/run.sh            full run (~25 minutes): 15 s per case, C = 64, B = 1 KiB, D = 0.3,
#                           a disk whose fsync is 1 ms slower (bench/slow-fsync.c; needs cc),
#                           a C sweep (with both floors at each C), a ledger pre-filled with
#                           1,000,000 jobs, the HTTP floor (a bare hyper server), "SQLite alone"
#                           (the writer's claim loop without HTTP: the limit), and the work
#                           pipeline (a trivial handler fed from memory, and a backlog drain)
#   bench/run.sh --smoke    a few hundred deliveries per case, checks correctness only (CI)
#
# Knobs (environment): DURATION (15s), CONNECTIONS (64), DUP_RATIO (0.3), BODY_BYTES (1024),
# PREFILL (1000000), SWEEP ("1 16 64 256"), WORK_JOBS (8000: below the in-memory queue's 10,000),
# BACKLOG (100000), WORK_CONCURRENCY ("4 32"), ACCESS_LOG (false; the access log costs ~10 %),
# ROUNDS (3) of ROUND_DURATION (8s): the interleaved rounds of the CPU ratios (below),
# BIN (a prebuilt sume-receiver; default: build release), BENCH_POSTGRES_URL (a PostgreSQL
# role that may create databases, for the PostgreSQL cases: "PostgreSQL alone", one receiver,
# two receivers on one database; default SUME_TEST_POSTGRES_URL; without either they are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
[ "${1:-}" = "--smoke" ] && smoke=true

if $smoke; then
  DURATION=${DURATION:-30s}; REQUESTS=${REQUESTS:-400}; CONNECTIONS=${CONNECTIONS:-8}
  PREFILL=${PREFILL:-2000}; SWEEP=${SWEEP:-"1 8"}; WORK_JOBS=${WORK_JOBS:-300}
  BACKLOG=${BACKLOG:-1500}; WORK_CONCURRENCY=${WORK_CONCURRENCY:-"4"}; ROUNDS=${ROUNDS:-1}
else
  DURATION=${DURATION:-15s}; REQUESTS=${REQUESTS:-100000000}; CONNECTIONS=${CONNECTIONS:-64}
  PREFILL=${PREFILL:-1000000}; SWEEP=${SWEEP:-"1 16 64 256"}; WORK_JOBS=${WORK_JOBS:-8000}
  BACKLOG=${BACKLOG:-100000}; WORK_CONCURRENCY=${WORK_CONCURRENCY:-"4 32"}; ROUNDS=${ROUNDS:-3}
fi
ROUND_DURATION=${ROUND_DURATION:-8s}
export ACCESS_LOG=${ACCESS_LOG:-false}
# /metrics on the webhook listener, read once at the end of each case (the batch sizes).
export SERVER_KEYS="expose_metrics = true"
DUP_RATIO=${DUP_RATIO:-0.3}; BODY_BYTES=${BODY_BYTES:-1024}

source bench/lib.sh
results="$work/results.jsonl"

loadgen() { "$BIN" loadgen --config "$1/config.toml" --json "${@:2}"; }

# run_case NAME DB_EXTRA_TOML CONNECTIONS [prepare-function] -- LOADGEN_ARGS...
# The receiver's CPU time, context switches and bytes written over the load are recorded with
# the report ("server_usage": before and after, see `usage`).
run_case() {
  local name=$1 extra=$2 connections=$3 prepare=$4; shift 5
  local dir="$work/$name"; mkdir -p "$dir"
  write_config "$dir" "$extra"
  [ -n "$prepare" ] && "$prepare" "$dir"
  ${START:-start_receiver} "$dir"
  local before after; read -ra before <<<"$(usage "$receiver_pid")"
  local report; report=$(loadgen "$dir" --connections "$connections" "$@")
  read -ra after <<<"$(usage "$receiver_pid")"
  # Claims per group commit: the batches' size decides how many pages each claim writes.
  local sum count batch=null
  sum=$(metric sume_ledger_batch_size_sum); count=$(metric sume_ledger_batch_size_count)
  [ -n "$count" ] && [ "${count%.*}" != 0 ] && batch=$(python3 -c "print($sum / $count)")
  local rss; rss=$(stop_receiver)
  local server_usage="[${before[0]}, ${before[1]}, ${after[0]}, ${after[1]}, ${before[2]}, ${after[2]}]"
  echo "{\"name\": \"$name\", \"connections\": $connections, \"rss_kib\": $rss, \"server_usage\": $server_usage, \"mean_batch\": $batch, \"report\": $report}" >> "$results"
  local summary
  summary=$(tail -1 "$results" | python3 -c "import json,sys; r=json.load(sys.stdin); p=r['report']; n=max(1,p['sent']); u=r['server_usage']; print('%.0f/s p99 %.2f ms, %.1f us CPU and %.2f switches per request; ledger check %s' % (p['per_second'], p['p99_ms'], (u[2]-u[0])/n, (u[3]-u[1])/n, p['ledger_check']))")
  echo "  $name: $summary; peak RSS ${rss} KiB" >&2
  rm -rf "$dir"   # a full run's ledgers would take about 8 GB by its end
}

# run_alone NAME [prepare-function] -- LOADGEN_ARGS...: the writer's claim loop, no receiver.
run_alone() {
  local name=$1 prepare=$2; shift 3
  local dir="$work/$name"; mkdir -p "$dir"
  write_config "$dir" ''
  [ -n "$prepare" ] && "$prepare" "$dir"
  local connections=${ALONE_CONNECTIONS:-$CONNECTIONS}
  local report; report=$(loadgen "$dir" --sqlite-alone --connections "$connections" "$@")
  echo "{\"name\": \"$name\", \"connections\": $connections, \"rss_kib\": null, \"report\": $report}" >> "$results"
  echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print('  $name: %.0f claims/s, commit p99 %.2f ms; ledger check %s' % (r['per_second'], r['p99_ms'], r['ledger_check']))" >&2
  rm -rf "$dir"
}

# Jobs a trivial handler (`true`) finished per second: the span from the first to the last
# finished_at, so both cases below are measured alike.
handler_toml() {
  printf '\n[handler]\ncommand = ["true"]\nconcurrency = %s\n' "$1"
}

# The worker fed from memory: WORK_JOBS deliveries (fewer than the in-memory queue holds) sent
# at full speed, each run by the handler.
run_work_from_memory() {
  local c=$1 dir="$work/work-memory-c$1"; mkdir -p "$dir"
  write_config "$dir" "$(handler_toml "$c")"
  start_receiver "$dir"
  loadgen "$dir" --connections 16 --requests "$WORK_JOBS" --dup-ratio 0 --allow-handler >/dev/null
  wait_until_done "$dir" "$WORK_JOBS"
  local rss; rss=$(stop_receiver)
  record_work "work-memory-c$c" "$c" "$dir" "$rss"
}

# The worker fed from the ledger: BACKLOG claimed jobs left in a stopped ledger (as after a
# restart, or claims made while the in-memory queue was full), drained by a fresh start.
run_work_backlog() {
  local c=$1 dir="$work/work-backlog-c$1"; mkdir -p "$dir"
  write_config "$dir" "$(handler_toml "$c")"
  start_receiver "$dir"; stop_receiver >/dev/null
  sqlite3 "$dir/ledger.sqlite3" >/dev/null <<SQL
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $BACKLOG)
INSERT INTO jobs (job_id, state, source, event_type, body, received_at, next_attempt_at, updated_at)
SELECT lower(hex(randomblob(8))) || '-backlog', 'claimed', 'webhook', 'job.completed',
       '{"job_id":"backlog-' || i || '","type":"job.completed","result":{"pad":"' || hex(zeroblob(450)) || '"}}',
       now, now, now
FROM n, (SELECT $NOW_MS_SQL AS now);
INSERT INTO job_routes (job, route, state, next_attempt_at, updated_at)
SELECT id, 'default', 'claimed', next_attempt_at, updated_at FROM jobs;
COMMIT;
SQL
  start_receiver "$dir"
  wait_until_done "$dir" "$BACKLOG"
  local rss; rss=$(stop_receiver)
  record_work "work-backlog-c$c" "$c" "$dir" "$rss"
}

record_work() {  # NAME CONCURRENCY DIR RSS
  local done_and_rate; done_and_rate=$(jobs_per_second "$3")
  echo "{\"name\": \"$1\", \"concurrency\": $2, \"rss_kib\": $4, \"jobs\": ${done_and_rate%%|*}, \"jobs_per_second\": ${done_and_rate##*|}}" >> "$work/work.jsonl"
  echo "  $1: ${done_and_rate%%|*} jobs at ${done_and_rate##*|}/s; peak RSS $4 KiB" >&2
  rm -rf "$3"
}

# A ledger that already holds $PREFILL finished jobs with ~1 KiB bodies and random job_ids,
# finished a day ago: inside every retention window, so the run measures the ledger's size,
# not a retention run.
prefill() {
  start_receiver "$1"; stop_receiver >/dev/null   # creates and migrates the ledger
  sqlite3 "$1/ledger.sqlite3" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
$(prefill_sql 0 "$PREFILL")
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

# run_postgres_alone NAME -- LOADGEN_ARGS...: the PostgreSQL ledger's claim batcher, no HTTP.
run_postgres_alone() {
  local name=$1; shift 2
  local dir="$work/$name"; mkdir -p "$dir"
  write_config "$dir" "url = \"$(new_postgres_database)\""
  local report; report=$(loadgen "$dir" --postgres-alone --connections "$CONNECTIONS" "$@")
  echo "{\"name\": \"$name\", \"connections\": $CONNECTIONS, \"rss_kib\": null, \"report\": $report}" >> "$results"
  echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print('  $name: %.0f claims/s, p99 %.2f ms; ledger check %s' % (r['per_second'], r['p99_ms'], r['ledger_check']))" >&2
}

# run_postgres_pair NAME -- LOADGEN_ARGS...: two receivers on one PostgreSQL database, the
# connections spread over both; the peak RSS is the larger of the two.
run_postgres_pair() {
  local name=$1; shift 2
  local a="$work/$name-a" b="$work/$name-b" url; url=$(new_postgres_database)
  mkdir -p "$a" "$b"
  local port_a=$port port_b=$((port + 1))
  port=$port_b; write_config "$b" "url = \"$url\""; start_receiver "$b"
  local pid_b=$receiver_pid; background_pids+=("$pid_b")
  port=$port_a; write_config "$a" "url = \"$url\""; start_receiver "$a"
  local report; report=$(loadgen "$a" --connections "$CONNECTIONS" --also-to "127.0.0.1:$port_b" "$@")
  local rss_a rss_b; rss_a=$(stop_receiver); receiver_pid=$pid_b; rss_b=$(stop_receiver)
  local rss=$(( rss_a > rss_b ? rss_a : rss_b ))
  echo "{\"name\": \"$name\", \"connections\": $CONNECTIONS, \"rss_kib\": $rss, \"report\": $report}" >> "$results"
  echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print('  $name: %.0f/s p99 %.2f ms; ledger check %s; peak RSS $rss_a / $rss_b KiB' % (r['per_second'], r['p99_ms'], r['ledger_check']))" >&2
}

if $smoke; then DUP_SET=200; else DUP_SET=20000; fi
common=(--requests "$REQUESTS" --duration "$DURATION" --body-bytes "$BODY_BYTES")
echo "sume-receiver benchmark: C=$CONNECTIONS B=$BODY_BYTES D=$DUP_RATIO, $DURATION or $REQUESTS requests per case" >&2
run_alone "0-sqlite-alone"        ""      -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_alone "0-sqlite-alone-prefilled" prefill -- "${common[@]}" --dup-ratio "$DUP_RATIO"
# Duplicates only, through the writer's claim loop: what one indexed look-up of a claimed
# job_id costs the storage side (the floor of case 6).
run_alone "0d-sqlite-alone-duplicates" claim_first -- "${common[@]}" --dup-ratio 1 --tag dupset --existing "$DUP_SET"
START=start_http_floor run_case "h-http-floor" '' "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO" --no-check
run_case "1-ceiling-healthz"      ''                         "$CONNECTIONS" "" -- "${common[@]}" --healthz
run_case "2-full-group-commit"    ''                         "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "3-full-txn-per-request" 'max_batch = 1'            "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "4-full-sync-normal"     'synchronous = "normal"'   "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "5-full-prefilled"       ''                         "$CONNECTIONS" prefill -- "${common[@]}" --dup-ratio "$DUP_RATIO"
run_case "6-duplicates-only"      ''                         "$CONNECTIONS" claim_first -- "${common[@]}" --dup-ratio 1 --tag dupset --existing "$DUP_SET"
# A slower disk: every fsync of the receiver 1 ms longer (bench/slow-fsync.c), where the writer
# hands each sync to the WAL syncer's thread and commits the next batch meanwhile.
slow_fsync="$work/slow-fsync.so"
cc -O2 -shared -fPIC -o "$slow_fsync" bench/slow-fsync.c -ldl
start_receiver_on_slow_disk() { LD_PRELOAD="$slow_fsync" SLOW_FSYNC_US=1000 start_receiver "$1"; }
START=start_receiver_on_slow_disk run_case "7-full-slow-disk" '' "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
for c in $SWEEP; do
  run_case "sweep-full-c$c"       ''                         "$c" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
  # The two floors at the same concurrency, for the CPU ratio at every C.
  START=start_http_floor run_case "sweep-http-floor-c$c" '' "$c" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO" --no-check
  ALONE_CONNECTIONS=$c run_alone "sweep-sqlite-alone-c$c" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
done

# The CPU ratios once more, interleaved. The VM drifts by 10-15 % within minutes, and a ratio of
# cases run minutes apart inherits that drift; each round runs the floors and the full paths
# back to back and its ratios are taken within the round (the summary gives their median).
round=(--requests "$REQUESTS" --duration "$ROUND_DURATION" --body-bytes "$BODY_BYTES")
for r in $(seq "$ROUNDS"); do
  START=start_http_floor run_case "round$r-h-http-floor" '' "$CONNECTIONS" "" -- "${round[@]}" --dup-ratio "$DUP_RATIO" --no-check
  run_alone "round$r-0-sqlite-alone" "" -- "${round[@]}" --dup-ratio "$DUP_RATIO"
  run_case "round$r-2-full-group-commit" '' "$CONNECTIONS" "" -- "${round[@]}" --dup-ratio "$DUP_RATIO"
  run_alone "round$r-0d-sqlite-alone-duplicates" claim_first -- "${round[@]}" --dup-ratio 1 --tag dupset --existing "$DUP_SET"
  run_case "round$r-6-duplicates-only" '' "$CONNECTIONS" claim_first -- "${round[@]}" --dup-ratio 1 --tag dupset --existing "$DUP_SET"
done

if [ -n "$BENCH_POSTGRES_URL" ]; then
  command -v psql >/dev/null || { echo "the PostgreSQL cases need psql (apt-get install postgresql-client)" >&2; exit 1; }
  postgres_case run_postgres_alone "p0-postgres-alone"     -- "${common[@]}" --dup-ratio "$DUP_RATIO"
  postgres_case run_case "p2-postgres-1-receiver" "url = \"$(new_postgres_database)\"" "$CONNECTIONS" "" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
  postgres_case run_postgres_pair "p2-postgres-2-receivers" -- "${common[@]}" --dup-ratio "$DUP_RATIO"
else
  echo "  PostgreSQL cases skipped: set BENCH_POSTGRES_URL (a role that may create databases)" >&2
fi

for c in $WORK_CONCURRENCY; do
  run_work_from_memory "$c"
  run_work_backlog "$c"
done

python3 - "$results" "$work/work.jsonl" "$smoke" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
work = {r["name"]: r for r in (json.loads(line) for line in open(sys.argv[2]))}
by = {r["name"]: r["report"] for r in rows}
def cpu(r):
    """CPU microseconds and context switches per request of the process doing the work: the
    receiver (or the HTTP floor), or for the *-alone cases the load generator, which is then
    the claim path itself."""
    p = r["report"]
    if "server_usage" in r:
        u, n = r["server_usage"], max(1, p["sent"])
        return (u[2] - u[0]) / n, (u[3] - u[1]) / n
    if "-alone" in r["name"]:
        return p["own_cpu_us_per_request"], p["own_context_switches_per_request"]
    return float("nan"), float("nan")  # two receivers: not measured per process here
def batch(r):
    """Claims per group commit over the case (receiver cases on SQLite)."""
    return "-" if r.get("mean_batch") is None else f"{r['mean_batch']:.1f}"
def written_kib(r):
    """KiB the receiver handed to write calls per request (WAL frames, checkpoints, answers)."""
    u = r.get("server_usage", [])
    return (u[5] - u[4]) / 1024 / max(1, r["report"]["sent"]) if len(u) == 6 else float("nan")
print(f"\n{'case':<26}{'C':>5}{'req/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'RSS MiB':>9}{'CPU us':>8}{'ctx sw':>8}{'KiB wr':>8}{'batch':>7}  statuses")
for r in rows:
    if r["name"].startswith("round"):
        continue
    p = r["report"]
    statuses = ",".join(f"{k}:{v}" for k, v in p["statuses"].items())
    rss = "-" if r["rss_kib"] is None else f"{r['rss_kib']/1024:.1f}"
    us, switches = cpu(r)
    print(f"{r['name']:<26}{r['connections']:>5}{p['per_second']:>10.0f}{p['p50_ms']:>9.2f}{p['p90_ms']:>9.2f}"
          f"{p['p99_ms']:>9.2f}{p['max_ms']:>9.2f}{rss:>9}{us:>8.1f}{switches:>8.2f}{written_kib(r):>8.2f}{batch(r):>7}  {statuses}")
print("(sqlite-alone rows: claims/s; a claim's latency runs from its batch's start until the loop sees its answer, after committing the next batch)")
print("(CPU us, ctx sw: per request, of the receiver's whole process; of the load generator's for the -alone rows; KiB wr: written per request by the receiver; batch: claims per group commit)")
print(f"\n{'work case':<26}{'handler concurrency':>20}{'jobs':>9}{'jobs/s':>9}{'RSS MiB':>9}")
for r in work.values():
    print(f"{r['name']:<26}{r['concurrency']:>20}{r['jobs']:>9}{r['jobs_per_second']:>9.0f}{r['rss_kib']/1024:>9.1f}")
def ratio(a, b):
    return by[a]["per_second"] / by[b]["per_second"]
print()
floors = cpu(next(r for r in rows if r["name"] == "h-http-floor"))[0] + cpu(next(r for r in rows if r["name"] == "0-sqlite-alone"))[0]
full = next(r for r in rows if r["name"] == "2-full-group-commit")
print(f"CPU per delivery, full path / (HTTP floor + SQLite alone): {cpu(full)[0]:.1f} / {floors:.1f} us = {cpu(full)[0] / floors:.2f}  (target <= 1.3)")
named = {r["name"]: r for r in rows}
dup_floors = cpu(named["h-http-floor"])[0] + cpu(named["0d-sqlite-alone-duplicates"])[0]
print(f"CPU per delivery, duplicates only / (HTTP floor + SQLite alone, duplicates): {cpu(named['6-duplicates-only'])[0]:.1f} / {dup_floors:.1f} us = {cpu(named['6-duplicates-only'])[0] / dup_floors:.2f}  (target <= 1.2)")
if "p0-postgres-alone" in named:
    pg_floors = cpu(named["h-http-floor"])[0] + cpu(named["p0-postgres-alone"])[0]
    pg = cpu(named["p2-postgres-1-receiver"])[0]
    print(f"CPU per delivery, PostgreSQL full path (receiver only) / (HTTP floor + PostgreSQL alone's claim side): {pg:.1f} / {pg_floors:.1f} us = {pg / pg_floors:.2f}  (target <= 1.3)")
for name in named:
    if name.startswith("sweep-full-c"):
        c = name.rsplit("-c", 1)[1]
        floors_c = cpu(named[f"sweep-http-floor-c{c}"])[0] + cpu(named[f"sweep-sqlite-alone-c{c}"])[0]
        print(f"  at C={c:<4} full / floors: {cpu(named[name])[0]:.1f} / {floors_c:.1f} us = {cpu(named[name])[0] / floors_c:.2f}")
rounds = sorted({int(name[len("round"):].split("-")[0]) for name in named if name.startswith("round")})
if rounds:
    print(f"interleaved rounds (the floors and the full paths back to back; rounds: {len(rounds)}):")
    full_ratios, dup_ratios = [], []
    for k in rounds:
        us = lambda case: cpu(named[f"round{k}-{case}"])[0]
        http, full, dups = us("h-http-floor"), us("2-full-group-commit"), us("6-duplicates-only")
        alone, alone_dups = us("0-sqlite-alone"), us("0d-sqlite-alone-duplicates")
        full_ratios.append(full / (http + alone))
        dup_ratios.append(dups / (http + alone_dups))
        print(f"  round {k}: full {full:.1f} / ({http:.1f} + {alone:.1f}) us = {full_ratios[-1]:.2f}; "
              f"duplicates {dups:.1f} / ({http:.1f} + {alone_dups:.1f}) us = {dup_ratios[-1]:.2f}")
    for what, values, target in (("full / floors", full_ratios, 1.3), ("duplicates / floors", dup_ratios, 1.2)):
        print(f"  median {what}: {statistics.median(values):.2f} (range {min(values):.2f}-{max(values):.2f}; target <= {target})")
print(f"(2)/(0) full path vs SQLite alone : {ratio('2-full-group-commit', '0-sqlite-alone'):.2f}  (target >= 0.8)")
print(f"(5)/(2) 1M-job vs empty ledger   : {ratio('5-full-prefilled', '2-full-group-commit'):.2f}  (target >= 0.85)")
print(f"(0p)/(0) SQLite alone, 1M vs empty: {ratio('0-sqlite-alone-prefilled', '0-sqlite-alone'):.2f}")
print(f"(2)/(1) durable vs HTTP ceiling  : {ratio('2-full-group-commit', '1-ceiling-healthz'):.2f}")
print(f"(2)/(3) group commit vs naive    : {ratio('2-full-group-commit', '3-full-txn-per-request'):.2f}")
print(f"(4)/(2) synchronous normal/full  : {ratio('4-full-sync-normal', '2-full-group-commit'):.2f}")
print(f"(7)/(2) fsync 1 ms slower        : {ratio('7-full-slow-disk', '2-full-group-commit'):.2f}")
if "p0-postgres-alone" in by:
    print(f"(p2)/(p0) PostgreSQL full vs alone  : {ratio('p2-postgres-1-receiver', 'p0-postgres-alone'):.2f}")
    print(f"(p2, 2 receivers)/(p2, 1)        : {ratio('p2-postgres-2-receivers', 'p2-postgres-1-receiver'):.2f}")
    print(f"(p2)/(2) PostgreSQL vs SQLite     : {ratio('p2-postgres-1-receiver', '2-full-group-commit'):.2f}")
for name in work:
    if name.startswith("work-backlog-"):
        c = name.rsplit("-c", 1)[1]
        own = work[f"work-memory-c{c}"]["jobs_per_second"]
        print(f"backlog drain / worker rate, c{c:<3}: {work[name]['jobs_per_second'] / own:.2f}  (target >= 0.9)")
rss = [r["rss_kib"] for r in rows if r["rss_kib"] is not None] + [r["rss_kib"] for r in work.values()]
print(f"peak RSS max                     : {max(rss)/1024:.1f} MiB (target <= 64)")
bad = [r["name"] for r in rows if any(k not in ("200", "claimed") for k in r["report"]["statuses"])]
if bad:
    sys.exit(f"non-200 answers in: {', '.join(bad)}")
PY
