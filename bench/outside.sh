#!/usr/bin/env bash
# The outside measure: CPU per delivery of the receiver against its floors, with an outside
# client, over plain HTTP and HTTPS, side by side in interleaved rounds on this machine. wrk
# sends pre-signed ~700 B deliveries over CONNECTIONS connections, 30 % of them repeats (a
# duplicates-only case: every one a repeat); CPU is the server side's alone (user + system,
# every thread, from /proc): the receiver, plus Caddy in the Caddy cases. The floors are
# programs of their own (bench/floors), none of the receiver's code.
#
#   bench/outside.sh   ROUNDS (3) of DURATION (5s) per case, CONNECTIONS (64), DUP_RATIO (0.3)
#   PLAIN_ONLY=1 BIN=old/sume-receiver bench/outside.sh   the plain cases alone, for a build
#                      without HTTPS (a before/after of the plain path)
#   RECEIVER_CONFIG="$(bench/routes.sh 20)" bench/outside.sh   the receiver with more of its
#                      config (20 routes: bench/routes.sh), its dispatch paused before any delivery
#
# Cases:
#   plain      the receiver over plain HTTP with keep-alive: DUP_RATIO repeats (-ka) and
#              repeats only (-dup: job_ids the round claimed before it measures)
#   http-floor bench/floors' http-floor: bare hyper reading each body, a fixed answer
#   sqlite     bench/floors' sqlite-floor: the receiver's claim statement on its schema, WAL,
#              synchronous = FULL, 64 claims a transaction; -dup: repeats only
# and over HTTPS, each with keep-alive (-ka) and a new connection per delivery (-new):
#   native     the receiver with [server.tls] (a P-256 certificate of a CA made here)
#   caddy      Debian's caddy with the same certificate, reverse_proxy to the plain receiver
#   tls-floor  http-floor with the same certificate: bare hyper behind bare rustls
# Needs wrk, caddy, openssl, curl (apt-get install wrk caddy openssl curl).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-5s}; CONNECTIONS=${CONNECTIONS:-64}
DUP_RATIO=${DUP_RATIO:-0.3}; DELIVERIES=${DELIVERIES:-150000}; SQLITE_CLAIMS=${SQLITE_CLAIMS:-200000}
export ACCESS_LOG=false
for tool in wrk caddy openssl curl; do
  command -v "$tool" >/dev/null || { echo "bench/outside.sh needs $tool" >&2; exit 1; }
done
source bench/lib.sh
results="$work/results.txt"
caddy_port=$((port + 1))

# A CA and a certificate for 127.0.0.1, as a sender would verify it (wrk does not).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
  -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$work/key.pem" -out "$work/csr.pem" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$work/san"
openssl x509 -req -in "$work/csr.pem" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -days 1 -extfile "$work/san" -out "$work/cert.pem" 2>/dev/null
tls_keys="[server.tls]
cert_file = \"$work/cert.pem\"
key_file = \"$work/key.pem\""

# DELIVERIES signed now (the tolerance is 5 minutes: made again before each round), $1 of
# them repeats (DUP_RATIO by default). At 1, each is one of DUPLICATE_SET job_ids.
DUPLICATE_SET=10000
sign_deliveries() {
  python3 - "$work/deliveries.tsv" "$DELIVERIES" "${1:-$DUP_RATIO}" "$DUPLICATE_SET" <<'PY'
import hashlib, hmac, random, sys, time
path, count, dup, dup_set = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
random.seed(time.time_ns())
ts = str(int(time.time()))
pad = "x" * 560
new = lambda: '{"job_id":"%016x-https","type":"job.completed","result":{"pad":"%s"}}' % (random.getrandbits(64), pad)
bodies = [new() for _ in range(dup_set)] if dup >= 1 else []
with open(path, "w") as out:
    for i in range(count):
        if bodies and random.random() < dup:
            body = random.choice(bodies)
        else:
            body = new()
            bodies.append(body)
        signature = hmac.new(b"whsec_benchmark", (ts + "." + body).encode(), hashlib.sha256).hexdigest()
        out.write("%s\tsume-v1=%s\t%s\n" % (ts, signature, body))
PY
}

# Waits until $1 answers (any status): the listener is bound and serving.
wait_for_url() {
  for _ in $(seq 600); do
    curl -sk -o /dev/null "$1" && return 0
    sleep 0.05
  done
  echo "nothing answers $1" >&2; exit 1
}

# wrk_run URL CONNECTION(keep|close) DURATION: wrk's report of the deliveries sent there.
wrk_run() {
  wrk -t 2 -c "$CONNECTIONS" -d "$3" --latency -s bench/outside.lua "$1" \
    -- "$work/deliveries.tsv" 2 "$2" "$WEBHOOK_PATH" 2>&1
}

# measure NAME URL CONNECTION(keep|close) PID...: wrk for DURATION; CPU us per answered request.
measure() {
  local name=$1 url=$2 connection=$3; shift 3
  local before=0 after=0 pid out requests
  for pid in "$@"; do before=$((before + $(usage "$pid" | cut -d' ' -f1))); done
  out=$(wrk_run "$url" "$connection" "$DURATION")
  for pid in "$@"; do after=$((after + $(usage "$pid" | cut -d' ' -f1))); done
  requests=$(echo "$out" | awk '/requests in/ { print $1 }')
  local errors; errors=$(echo "$out" | awk '/Non-2xx|Socket errors/' | tr '\n' ' ')
  local p99; p99=$(echo "$out" | awk '$1 == "99%" { print $2 }')
  python3 -c "print('%s %.1f %d %s' % ('$name', ($after - $before) / max(1, $requests), $requests, '$p99'))" >>"$results"
  echo "  $name: $(tail -1 "$results" | awk '{ print $2 " us/delivery, " $3 " requests, p99 " $4 }') $errors" >&2
}

WEBHOOK_PATH=/sume/webhook
receiver() { # DIR SERVER_KEYS: starts a receiver on $port; sets receiver_pid
  mkdir -p "$1"; SERVER_KEYS="$2" write_config "$1" "${RECEIVER_CONFIG:-}"
  "$BIN" serve --config "$1/config.toml" 2>>"$1/receiver.log" &
  receiver_pid=$!
  # Routes' workers must not run jobs during the measure of the request path: paused as soon
  # as the service has made its ledger, before any delivery.
  if [ -n "${RECEIVER_CONFIG:-}" ]; then
    for _ in $(seq 100); do
      "$BIN" --config "$1/config.toml" jobs pause >/dev/null 2>&1 && return 0
      sleep 0.05
    done
    echo "could not pause the receiver's dispatch" >&2; exit 1
  fi
}
floor() { # DIR [CERT KEY]
  mkdir -p "$1"
  "$FLOORS/http-floor" "127.0.0.1:$port" "${@:2}" 2>>"$1/receiver.log" &
  receiver_pid=$!
}
# sqlite_floor NAME DIR DUP_RATIO: the storage floor's CPU per claim, as a result row.
sqlite_floor() {
  mkdir -p "$2"
  "$FLOORS/sqlite-floor" "$2/floor.sqlite3" migrations/sqlite "$SQLITE_CLAIMS" "$3" \
    | python3 -c "import json,sys; r=json.load(sys.stdin); print('$1 %.1f %d -' % (r['cpu_us_per_claim'], r['claims']))" >>"$results"
  echo "  $1: $(tail -1 "$results" | awk '{ print $2 " us/claim" }')" >&2
}
stop() { kill "$@" 2>/dev/null || true; for pid in "$@"; do wait "$pid" 2>/dev/null || true; done; }

for round in $(seq "$ROUNDS"); do
  echo "round $round" >&2
  for connection in keep close; do
    [ -n "${PLAIN_ONLY:-}" ] && break
    tag=$([ $connection = keep ] && echo ka || echo new)
    sign_deliveries
    receiver "$work/r$round-native-$tag" "$tls_keys"; pid=$receiver_pid
    wait_for_url "https://127.0.0.1:$port/healthz"
    measure "native-$tag" "https://127.0.0.1:$port" $connection "$pid"; stop "$pid"

    sign_deliveries
    receiver "$work/r$round-caddy-$tag" ""; pid=$receiver_pid
    cat >"$work/Caddyfile" <<CADDY
{
	admin off
	auto_https off
}
https://127.0.0.1:$caddy_port {
	tls $work/cert.pem $work/key.pem
	reverse_proxy 127.0.0.1:$port
}
CADDY
    XDG_DATA_HOME="$work/caddy" XDG_CONFIG_HOME="$work/caddy" \
      caddy run --config "$work/Caddyfile" --adapter caddyfile 2>>"$work/caddy.log" &
    caddy_pid=$!
    wait_for_url "https://127.0.0.1:$caddy_port/healthz"
    measure "caddy-$tag" "https://127.0.0.1:$caddy_port" $connection "$pid" "$caddy_pid"
    stop "$caddy_pid" "$pid"

    floor "$work/r$round-floor-$tag" "$work/cert.pem" "$work/key.pem"; pid=$receiver_pid
    wait_for_url "https://127.0.0.1:$port/"
    measure "tls-floor-$tag" "https://127.0.0.1:$port" $connection "$pid"; stop "$pid"
  done
  sign_deliveries
  receiver "$work/r$round-plain" ""; pid=$receiver_pid
  wait_for_url "http://127.0.0.1:$port/healthz"
  measure "plain-ka" "http://127.0.0.1:$port" keep "$pid"; stop "$pid"
  floor "$work/r$round-plain-floor"; pid=$receiver_pid
  wait_for_url "http://127.0.0.1:$port/"
  measure "http-floor-ka" "http://127.0.0.1:$port" keep "$pid"; stop "$pid"
  sqlite_floor sqlite "$work/r$round-sqlite" "$DUP_RATIO"

  sign_deliveries 1
  receiver "$work/r$round-plain-dup" ""; pid=$receiver_pid
  wait_for_url "http://127.0.0.1:$port/healthz"
  # Not measured: the round's job_ids claimed, so that every delivery measured repeats one.
  wrk_run "http://127.0.0.1:$port" keep 3s >/dev/null
  measure "plain-dup" "http://127.0.0.1:$port" keep "$pid"; stop "$pid"
  sqlite_floor sqlite-dup "$work/r$round-sqlite-dup" 1
  rm -rf "$work"/r"$round"-*
done

python3 - "$results" <<'PY'
import statistics, sys
rows, p99s = {}, {}
for line in open(sys.argv[1]):
    name, cpu, _, p99 = line.split()
    rows.setdefault(name, []).append(float(cpu))
    if p99 != "-":
        p99s.setdefault(name, []).append(p99)
rounds = len(rows["sqlite"])
med = {name: statistics.median(values) for name, values in rows.items()}
print("\nCPU per delivery (us, median of %d interleaved rounds; the server side only):" % rounds)
names = ["native-ka", "caddy-ka", "tls-floor-ka", "native-new", "caddy-new", "tls-floor-new",
         "plain-ka", "plain-dup", "http-floor-ka", "sqlite", "sqlite-dup"]
for name in [name for name in names if name in rows]:
    p99 = "; p99 %s" % ", ".join(p99s[name]) if name in p99s else ""
    print("  %-14s %7.1f   (rounds: %s%s)" % (name, med[name], ", ".join("%.1f" % v for v in rows[name]), p99))
# The floors move with the machine's state: a spread over 25 % between rounds says something
# else ran, and ratios across such rounds mean little.
spread = {name: max(rows[name]) / min(rows[name]) for name in ("tls-floor-ka", "http-floor-ka", "sqlite") if name in rows}
busy = [name for name, value in spread.items() if value > 1.25]
def ratio(full, floor, storage, r):
    return rows[full][r] / (rows[floor][r] + rows[storage][r])
for full, floor, storage, what in (
        ("native-ka", "tls-floor-ka", "sqlite", "HTTPS keep-alive"),
        ("native-new", "tls-floor-new", "sqlite", "HTTPS, a new connection per delivery"),
        ("plain-ka", "http-floor-ka", "sqlite", "plain HTTP keep-alive"),
        ("plain-dup", "http-floor-ka", "sqlite-dup", "plain HTTP keep-alive, duplicates only")):
    if full not in rows:
        continue
    per_round = [ratio(full, floor, storage, r) for r in range(rounds)]
    print("%s: receiver / (HTTP floor + SQLite floor) per round %s, median %.2f" % (
        what, ", ".join("%.2f" % v for v in per_round), statistics.median(per_round)))
for tag in ("ka", "new") if "native-ka" in rows else ():
    print("Caddy + plain receiver / native, %s: %.2f" % (
        {"ka": "keep-alive", "new": "a new connection per delivery"}[tag], med["caddy-" + tag] / med["native-" + tag]))
if "native-ka" in rows:
    print("a handshake (native-new - native-ka): %.1f us of CPU" % (med["native-new"] - med["native-ka"]))
if busy:
    print("NOT A MEASURE: the floors moved between rounds (%s): the machine was busy" % ", ".join("%s x%.2f" % (n, spread[n]) for n in busy))
    sys.exit(2)
PY
