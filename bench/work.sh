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
#   bench/work.sh   ROUNDS (3) of every case; HANDLERS ("http command"); CONCURRENCY ("4 32");
#                   JOBS (20000) per HTTP case, COMMAND_JOBS (4000) per command case
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
export ACCESS_LOG=false
for tool in caddy sqlite3 curl; do
  command -v "$tool" >/dev/null || { echo "bench/work.sh needs $tool" >&2; exit 1; }
done
source bench/lib.sh
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
  write_config "$dir" "$(handler_section "$2" "$3")"
  start_receiver "$dir"
  "$BIN" --config "$dir/config.toml" jobs pause >/dev/null
  # A worker reads the pause within a second (worker::IDLE_LOOK): none may run during the fill.
  sleep 1.5
  local fill; fill=$("$BIN" loadgen --config "$dir/config.toml" --json --no-check --allow-handler \
    --requests "$jobs" --dup-ratio 0 --connections 16)
  local ran; ran=$(sqlite3 "$dir/ledger.sqlite3" "SELECT count(*) FROM jobs WHERE state <> 'claimed'")
  [ "$ran" = 0 ] || { echo "$ran jobs ran during the fill: the measure would be wrong" >&2; exit 1; }
  local before after
  before=$(usage "$receiver_pid" | cut -d' ' -f1)
  "$BIN" --config "$dir/config.toml" jobs resume >/dev/null
  wait_until_done "$dir" "$jobs"
  after=$(usage "$receiver_pid" | cut -d' ' -f1)
  local rate; rate=$(jobs_per_second "$dir")
  stop_receiver >/dev/null
  python3 - "$1" "$2" "$3" "$jobs" "$before" "$after" "${rate##*|}" "$fill" >>"$results" <<'PY'
import json, sys
round_, handler, c, jobs, before, after, rate, fill = sys.argv[1:]
print(json.dumps({"round": int(round_), "case": f"{handler}-c{c}", "what": "receiver",
                  "cpu_us_per_job": (int(after) - int(before)) / int(jobs),
                  "jobs_per_second": float(rate),
                  "ingest_per_second": json.loads(fill)["per_second"]}))
PY
  rm -rf "$dir"
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
  local db="$work/floor-$1-$2-$3.sqlite3"
  local ledger_floor; ledger_floor=$("$FLOORS/work-floor" sqlite "$db" migrations/sqlite "$jobs" "$3")
  rm -f "$db" "$db-wal" "$db-shm"
  for pair in "handler-floor|$handler_floor" "ledger-floor|$ledger_floor"; do
    python3 - "$1" "$2-c$3" "${pair%%|*}" "${pair#*|}" >>"$results" <<'PY'
import json, sys
round_, case, what, floor = sys.argv[1:]
floor = json.loads(floor)
print(json.dumps({"round": int(round_), "case": case, "what": what,
                  "cpu_us_per_job": floor["cpu_us_per_job"],
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

python3 - "$results" "$FLOOR_SPREAD" "$BIN" <<'PY'
import collections, json, statistics, sys
path, allowed, binary = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [json.loads(line) for line in open(path)]
by = collections.defaultdict(dict)
for row in rows:
    by[(row["case"], row["round"])][row["what"]] = row
cases = sorted({case for case, _ in by}, key=lambda c: (c.split("-c")[0], int(c.split("-c")[1])))
refused = []
print(f"\nbench/work.sh: {binary}; CPU µs per job (median of rounds); the ratio is the median of each round's receiver / (handler floor + ledger floor)")
print(f"{'case':<14}{'receiver':>10}{'handler floor':>15}{'ledger floor':>14}{'ratio':>8}{'drain jobs/s':>14}{'ingest/s':>10}{'drain/ingest':>14}")
for case in cases:
    rounds = [by[(c, r)] for (c, r) in sorted(by) if c == case]
    med = lambda what, key: statistics.median(r[what][key] for r in rounds)
    ratios = [r["receiver"]["cpu_us_per_job"] / (r["handler-floor"]["cpu_us_per_job"] + r["ledger-floor"]["cpu_us_per_job"]) for r in rounds]
    drain = [r["receiver"]["jobs_per_second"] / r["receiver"]["ingest_per_second"] for r in rounds]
    for what in ("handler-floor", "ledger-floor"):
        values = [r[what]["cpu_us_per_job"] for r in rounds]
        if max(values) / min(values) > allowed:
            refused.append(f"{case} {what}: {min(values):.1f} to {max(values):.1f} µs")
    print(f"{case:<14}{med('receiver', 'cpu_us_per_job'):>10.1f}{med('handler-floor', 'cpu_us_per_job'):>15.1f}"
          f"{med('ledger-floor', 'cpu_us_per_job'):>14.1f}{statistics.median(ratios):>8.2f}"
          f"{med('receiver', 'jobs_per_second'):>14.0f}{med('receiver', 'ingest_per_second'):>10.0f}{statistics.median(drain):>14.2f}")
if refused:
    print(f"\nREFUSED: the floors moved more than {allowed}x between rounds (the machine was not quiet): " + "; ".join(refused))
    sys.exit(3)
PY
