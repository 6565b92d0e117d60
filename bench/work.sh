#!/usr/bin/env bash
# The work side's outside measure: a receiver's CPU per job run against the work floors, in
# interleaved rounds on this machine. Each case fills a receiver whose dispatch is paused with
# JOBS unique signed deliveries (the loadgen: the ingest rate), then resumes it and measures the
# drain: the receiver's CPU (user + system, every thread, from /proc; not its children's) per
# job, and the rate jobs finished at (from the ledger). The floors (bench/floors' work-floor,
# none of the receiver's code) do the same jobs' least: the handler's part (a bare hyper client
# POSTing the same size of body to the same downstream over as many connections; or a bare
# posix_spawn of the same program, its body on stdin, its stderr read) plus the ledger's part (a
# bare SQLite loop on the receiver's schema: each job taken due with its lease and its
# attempt's start recorded, then its end, in transactions of CONCURRENCY).
#
# LEDGER=postgres runs the same on PostgreSQL: each case (the receiver, the ledger's floor) on a
# new database of the server at BENCH_POSTGRES_URL (default SUME_TEST_POSTGRES_URL; a role that
# may create databases, on this machine: the server's CPU is read from /proc). The ledger's
# floor there is one connection taking CONCURRENCY due jobs with their starts in one statement,
# then their ends in another (a commit each, as SQLite's floor batches). Printed beside it, not
# in the ratio: the same statements a job at a time on CONCURRENCY connections, the receiver's
# shape there (each start and end a commit of its own). Every CPU figure then counts the
# server's (every `postgres` process, and those it reaped) beside the process's own.
#
#   bench/work.sh   ROUNDS (3) of every case; HANDLERS ("http command"); CONCURRENCY ("4 32");
#                   JOBS (20000) per HTTP case, COMMAND_JOBS (4000) per command case;
#                   LEDGER (sqlite, or postgres)
#   BIN=old/sume-receiver bench/work.sh   another build
#
# The downstream is Debian's Caddy answering 200 from memory (keep-alive); the command is `true`.
# A floor that moved more than FLOOR_SPREAD (1.3) between rounds (its slowest over its fastest)
# means the machine was not quiet: the results are printed, marked refused, and the exit status
# is 3. Needs caddy, sqlite3 and curl (apt-get install caddy sqlite3 curl).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; HANDLERS=${HANDLERS:-"http command"}; CONCURRENCY=${CONCURRENCY:-"4 32"}
JOBS=${JOBS:-20000}; COMMAND_JOBS=${COMMAND_JOBS:-4000}; FLOOR_SPREAD=${FLOOR_SPREAD:-1.3}
LEDGER=${LEDGER:-sqlite}
export ACCESS_LOG=false
for tool in caddy sqlite3 curl; do
  command -v "$tool" >/dev/null || { echo "bench/work.sh needs $tool" >&2; exit 1; }
done
source bench/lib.sh
case "$LEDGER" in
  sqlite) ;;
  postgres)
    [ -n "$BENCH_POSTGRES_URL" ] || { echo "LEDGER=postgres needs BENCH_POSTGRES_URL (a role that may create databases)" >&2; exit 1; }
    command -v psql >/dev/null || { echo "LEDGER=postgres needs psql (apt-get install postgresql-client)" >&2; exit 1; } ;;
  *) echo "LEDGER is sqlite or postgres, not $LEDGER" >&2; exit 1 ;;
esac
results="$work/results.jsonl"
downstream_port=$((port + 1))

cat >"$work/Caddyfile" <<CADDY
{
  admin off
  auto_https off
}
http://127.0.0.1:$downstream_port {
  respond 200
}
CADDY
caddy run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.log" 2>&1 &
background_pids+=($!)
for _ in $(seq 200); do
  curl -s -o /dev/null "http://127.0.0.1:$downstream_port/" && break
  sleep 0.05
done
curl -s -o /dev/null "http://127.0.0.1:$downstream_port/" || { echo "caddy did not start" >&2; cat "$work/caddy.log" >&2; exit 1; }

jobs_of() { if [ "$1" = http ]; then echo "$JOBS"; else echo "$COMMAND_JOBS"; fi; }

# server_cpu_us: the PostgreSQL server's CPU time so far in microseconds, as the ledger's floor
# reads it (sume_floors::postgres_server_cpu_us); 0 on SQLite.
server_cpu_us() {
  if [ "$LEDGER" = postgres ]; then "$FLOORS/work-floor" postgres-server-cpu; else echo 0; fi
}

handler_section() { # HANDLER CONCURRENCY
  if [ "$1" = http ]; then
    printf '\n[handler]\nurl = "http://127.0.0.1:%s/"\nconcurrency = %s\n' "$downstream_port" "$2"
  else
    printf '\n[handler]\ncommand = ["true"]\nconcurrency = %s\n' "$2"
  fi
}

# receiver_case ROUND HANDLER CONCURRENCY: fill paused, then drain; one JSON line.
receiver_case() {
  local dir="$work/r$1-$2-c$3" jobs; jobs=$(jobs_of "$2"); mkdir -p "$dir"
  local database=""
  if [ "$LEDGER" = postgres ]; then
    new_postgres_database > "$dir/postgres-url"
    database="url = \"$(cat "$dir/postgres-url")\""
  fi
  write_config "$dir" "$database$(handler_section "$2" "$3")"
  start_receiver "$dir"
  "$BIN" --config "$dir/config.toml" jobs pause >/dev/null
  # A worker reads the pause within a second (worker::IDLE_LOOK): none may run during the fill.
  sleep 1.5
  local fill; fill=$("$BIN" loadgen --config "$dir/config.toml" --json --no-check --allow-handler \
    --requests "$jobs" --dup-ratio 0 --connections 16)
  local ran; ran=$(ledger_sql "$dir" "SELECT count(*) FROM jobs WHERE state <> 'claimed'")
  [ "$ran" = 0 ] || { echo "$ran jobs ran during the fill: the measure would be wrong" >&2; exit 1; }
  local before after server_before server_after
  before=$(usage "$receiver_pid" | cut -d' ' -f1); server_before=$(server_cpu_us)
  "$BIN" --config "$dir/config.toml" jobs resume >/dev/null
  wait_until_done "$dir" "$jobs"
  after=$(usage "$receiver_pid" | cut -d' ' -f1); server_after=$(server_cpu_us)
  local rate; rate=$(jobs_per_second "$dir")
  stop_receiver >/dev/null
  python3 - "$1" "$2" "$3" "$jobs" "$before" "$after" "${rate##*|}" "$fill" \
    "$((server_after - server_before))" >>"$results" <<'PY'
import json, sys
round_, handler, c, jobs, before, after, rate, fill, server = sys.argv[1:]
print(json.dumps({"round": int(round_), "case": f"{handler}-c{c}", "what": "receiver",
                  "cpu_us_per_job": (int(after) - int(before)) / int(jobs),
                  "server_cpu_us_per_job": int(server) / int(jobs),
                  "jobs_per_second": float(rate),
                  "ingest_per_second": json.loads(fill)["per_second"]}))
PY
  rm -rf "$dir"
  [ "$LEDGER" = sqlite ] || drop_created_postgres_databases
}

# floor_case ROUND HANDLER CONCURRENCY: the handler's floor, then the ledger's; one JSON line each.
floor_case() {
  local jobs; jobs=$(jobs_of "$2")
  local handler_floor
  if [ "$2" = http ]; then
    handler_floor=$("$FLOORS/work-floor" http "http://127.0.0.1:$downstream_port/" "$3" "$jobs")
  else
    handler_floor=$("$FLOORS/work-floor" spawn "$3" "$jobs" true)
  fi
  local ledger_floor pairs
  if [ "$LEDGER" = postgres ]; then
    # The floor: one connection, CONCURRENCY starts in a commit, then their ends in another.
    # Beside it, not in the ratio: the receiver's own shape there, CONCURRENCY connections
    # each committing every start and end alone.
    local each
    ledger_floor=$("$FLOORS/work-floor" postgres "$(new_postgres_database)" migrations/postgres "$jobs" 1 "$3")
    drop_created_postgres_databases
    each=$("$FLOORS/work-floor" postgres "$(new_postgres_database)" migrations/postgres "$jobs" "$3" 1)
    drop_created_postgres_databases
    pairs=("handler-floor|$handler_floor" "ledger-floor|$ledger_floor" "ledger-each|$each")
  else
    local db="$work/floor-$1-$2-$3.sqlite3"
    ledger_floor=$("$FLOORS/work-floor" sqlite "$db" migrations/sqlite "$jobs" "$3")
    rm -f "$db" "$db-wal" "$db-shm"
    pairs=("handler-floor|$handler_floor" "ledger-floor|$ledger_floor")
  fi
  for pair in "${pairs[@]}"; do
    python3 - "$1" "$2-c$3" "${pair%%|*}" "${pair#*|}" >>"$results" <<'PY'
import json, sys
round_, case, what, floor = sys.argv[1:]
floor = json.loads(floor)
print(json.dumps({"round": int(round_), "case": case, "what": what,
                  "cpu_us_per_job": floor["cpu_us_per_job"],
                  "server_cpu_us_per_job": floor.get("server_cpu_us_per_job", 0),
                  "jobs_per_second": floor["jobs_per_second"]}))
PY
  done
}

for round in $(seq "$ROUNDS"); do
  for handler in $HANDLERS; do
    for c in $CONCURRENCY; do
      echo "round $round: $handler, concurrency $c" >&2
      receiver_case "$round" "$handler" "$c"
      floor_case "$round" "$handler" "$c"
    done
  done
done

python3 - "$results" "$FLOOR_SPREAD" "$BIN" "$LEDGER" <<'PY'
import collections, json, statistics, sys
path, allowed, binary, ledger = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [json.loads(line) for line in open(path)]
by = collections.defaultdict(dict)
for row in rows:
    by[(row["case"], row["round"])][row["what"]] = row
cases = sorted({case for case, _ in by}, key=lambda c: (c.split("-c")[0], int(c.split("-c")[1])))
refused = []
# On PostgreSQL each side's CPU is its process's plus the server's while it ran.
cpu = lambda row: row["cpu_us_per_job"] + row["server_cpu_us_per_job"]
server = any(row["server_cpu_us_per_job"] for row in rows)
print(f"\nbench/work.sh: {binary}; {ledger}; CPU µs per job (median of rounds); the ratio is the median of each round's receiver / (handler floor + ledger floor)")
if server:
    print("each CPU figure counts the PostgreSQL server's while it ran; the server's part alone in brackets")
each = any(row["what"] == "ledger-each" for row in rows)
print(f"{'case':<14}{'receiver':>16}{'handler floor':>15}{'ledger floor':>16}{'ratio':>8}{'drain jobs/s':>14}{'ingest/s':>10}{'drain/ingest':>14}"
      + (f"{'ledger, a commit a change':>28}" if each else ""))
for case in cases:
    rounds = [by[(c, r)] for (c, r) in sorted(by) if c == case]
    med = lambda what, key: statistics.median(r[what][key] for r in rounds)
    both = lambda what: statistics.median(cpu(r[what]) for r in rounds)
    shown = lambda what: f"{both(what):.1f}" + (f" ({med(what, 'server_cpu_us_per_job'):.0f})" if server else "")
    ratios = [cpu(r["receiver"]) / (cpu(r["handler-floor"]) + cpu(r["ledger-floor"])) for r in rounds]
    drain = [r["receiver"]["jobs_per_second"] / r["receiver"]["ingest_per_second"] for r in rounds]
    for what in ("handler-floor", "ledger-floor"):
        values = [cpu(r[what]) for r in rounds]
        if max(values) / min(values) > allowed:
            refused.append(f"{case} {what}: {min(values):.1f} to {max(values):.1f} µs")
    print(f"{case:<14}{shown('receiver'):>16}{shown('handler-floor'):>15}{shown('ledger-floor'):>16}"
          f"{statistics.median(ratios):>8.2f}"
          f"{med('receiver', 'jobs_per_second'):>14.0f}{med('receiver', 'ingest_per_second'):>10.0f}{statistics.median(drain):>14.2f}"
          + (f"{shown('ledger-each'):>28}" if each else ""))
if refused:
    print(f"\nREFUSED: the floors moved more than {allowed}x between rounds (the machine was not quiet): " + "; ".join(refused))
    sys.exit(3)
PY
