#!/usr/bin/env bash
# Start-up time against the ledger's size: from the exec of `serve` to /healthz answering and to
# the first delivery acknowledged (a signed claim answered 200), on ledgers of finished jobs with
# ~1 KiB bodies (bench/run.sh's prefill), with the page cache dropped (cold, as after a reboot)
# and warm; then how long until the whole-file check has read the ledger (its `ledger checked`
# log line, before serving or after).
#
#   sudo bench/startup.sh          SIZES="1000000 10000000", RUNS=3 (1 for 10M cold)
#
# Env: SIZES, RUNS, LEDGER_CACHE (/var/tmp/sume-bench-ledgers: the ledgers are built once, by a
# direct SQLite bulk insert, and kept there; 10M jobs are ~9.5 GiB and take minutes to build),
# BIN (a prebuilt sume-receiver; default: build release). Cold runs need root (they write
# /proc/sys/vm/drop_caches); without it they are skipped. The ledgers are used in place: each
# run adds one job to them.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1000000 10000000"}; RUNS=${RUNS:-3}
LEDGER_CACHE=${LEDGER_CACHE:-/var/tmp/sume-bench-ledgers}
source bench/lib.sh

# ledger_for N: the directory of a ledger of N finished jobs, built if it is not cached yet.
ledger_for() {
  local n=$1 dir="$LEDGER_CACHE/jobs-$1"
  if [ ! -f "$dir/built" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    write_config "$dir" ""
    start_receiver "$dir"; stop_receiver >/dev/null   # creates and migrates the ledger
    echo "building a ledger of $n jobs in $dir" >&2
    # No journal and no sync while it is built: a build cut short is rebuilt (no `built` mark).
    # Chunks of 1M rows keep each statement's memory bounded.
    {
      echo "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -1000000;"
      local from=0
      while [ "$from" -lt "$n" ]; do
        local to=$(( from + 1000000 < n ? from + 1000000 : n ))
        cat <<SQL
BEGIN;
$(prefill_sql "$from" "$to")
COMMIT;
SQL
        from=$to
      done
      echo "PRAGMA journal_mode = WAL;"
    } | sqlite3 "$dir/ledger.sqlite3" >/dev/null
    touch "$dir/built"
  fi
  echo "$dir"
}

# measure DIR: starts the receiver on the ledger in DIR and prints "healthz_s ready_s check_s":
# seconds from the exec to the first /healthz answer, to the first delivery acknowledged, and to
# the `ledger checked` line (the whole-file check's end; "-" when none came within CHECK_WAIT
# seconds, 900 by default).
measure() {
  python3 - "$BIN" "$1" "$port" "${CHECK_WAIT:-900}" <<'PY'
import hashlib, hmac, json, re, subprocess, sys, time, urllib.error, urllib.request
binary, directory, port = sys.argv[1], sys.argv[2], sys.argv[3]
log = open(f"{directory}/receiver.log", "w")
started = time.monotonic()
receiver = subprocess.Popen([binary, "serve", "--config", f"{directory}/config.toml"], stdout=log, stderr=log)
healthz = ready = checked = None

def delivery():
    body = json.dumps({"job_id": f"startup-{time.time_ns()}", "type": "job.completed"}).encode()
    timestamp = str(int(time.time()))
    digest = hmac.new(b"whsec_benchmark", timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/sume/webhook", data=body, headers={
        "content-type": "application/json", "x-sume-webhook-timestamp": timestamp,
        "x-sume-webhook-signature": f"sume-v1={digest}"})
    return urllib.request.urlopen(request, timeout=2).status == 200

try:
    while ready is None and receiver.poll() is None:
        try:
            if healthz is None:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                healthz = time.monotonic() - started
            if delivery():
                ready = time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.02)
    # The check's end: logged before serving (a check before it) or up to minutes after.
    deadline = time.monotonic() + float(sys.argv[4])
    while checked is None and receiver.poll() is None and time.monotonic() < deadline:
        match = re.search(r"ledger checked", open(f"{directory}/receiver.log").read())
        if match:
            checked = time.monotonic() - started
        time.sleep(0.1)
finally:
    receiver.terminate()
    receiver.wait()
fmt = lambda value: "-" if value is None else f"{value:.1f}"
print(fmt(healthz), fmt(ready), fmt(checked))
PY
}

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

cold=true
if [ "$(id -u)" != 0 ]; then
  echo "not root: cold runs skipped (they drop the page cache)" >&2; cold=false
fi
printf '%-10s %-6s %-4s %10s %10s %10s\n' jobs cache run healthz_s ready_s checked_s
for n in $SIZES; do
  dir=$(ledger_for "$n")
  # Each run its own config (the port of this run, the ledger by absolute path).
  cat > "$dir/config.toml" <<TOML
[server]
listen = "127.0.0.1:$port"

[signature]
secrets = ["whsec_benchmark"]

[database]
path = "$dir/ledger.sqlite3"
${DATABASE_KEYS:-}
TOML
  for cache in cold warm; do
    [ "$cache" = cold ] && ! $cold && continue
    runs=$RUNS
    [ "$cache" = cold ] && [ "$n" -ge 10000000 ] && runs=${COLD_10M_RUNS:-1}
    for run in $(seq "$runs"); do
      if [ "$cache" = cold ]; then drop_caches; else cat "$dir/ledger.sqlite3" > /dev/null; fi
      read -r healthz ready checked <<<"$(measure "$dir")"
      printf '%-10s %-6s %-4s %10s %10s %10s\n' "$n" "$cache" "$run" "$healthz" "$ready" "$checked"
    done
  done
done
