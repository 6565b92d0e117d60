#!/usr/bin/env bash
# Where the full path's CPU goes: the receiver under bench/run.sh's load (C = 64, 1 KiB bodies,
# 30 % duplicates, access log off), sampled by `perf record` with frame-pointer call stacks, each
# sample put in one stage by its thread and its stack. Prints microseconds of CPU per delivery
# by stage: each stage's share of the samples times the CPU time per delivery measured over
# the same window (/proc/PID/stat), so the stages add up to that measurement. About 2 minutes
# (most of it the build).
#
#   bench/profile.sh     needs perf (apt-get install linux-perf) and python3; builds a release
#                        binary with frame pointers in target/profile (BIN=... to use another)
#
# Knobs (environment): DURATION (15s), CONNECTIONS (64), DUP_RATIO (0.3), BODY_BYTES (1024),
# FREQUENCY (999 samples a second per CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "bench/profile.sh needs perf (apt-get install linux-perf)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  # Without frame pointers the stacks stop in inlined Rust and most samples land nowhere.
  RUSTFLAGS="-C force-frame-pointers=yes" cargo build --release --locked --quiet --features bench --target-dir target/profile
  BIN=target/profile/release/sume-receiver
fi
DURATION=${DURATION:-15s}; CONNECTIONS=${CONNECTIONS:-64}; DUP_RATIO=${DUP_RATIO:-0.3}
BODY_BYTES=${BODY_BYTES:-1024}; FREQUENCY=${FREQUENCY:-999}
export ACCESS_LOG=false
source bench/lib.sh

dir="$work/profile"; mkdir -p "$dir"
write_config "$dir" ''
start_receiver "$dir"
read -ra before <<<"$(usage "$receiver_pid")"
perf record -q -F "$FREQUENCY" --call-graph fp -p "$receiver_pid" -o "$dir/perf.data" 2>/dev/null &
perf_pid=$!
report=$("$BIN" loadgen --config "$dir/config.toml" --json --connections "$CONNECTIONS" \
  --duration "$DURATION" --requests 100000000 --body-bytes "$BODY_BYTES" --dup-ratio "$DUP_RATIO")
read -ra after <<<"$(usage "$receiver_pid")"
kill -INT "$perf_pid"; wait "$perf_pid" || true
stop_receiver >/dev/null
perf script -i "$dir/perf.data" -F comm,ip,sym 2>/dev/null > "$dir/stacks.txt"

python3 - "$dir/stacks.txt" "$report" "${before[0]}" "${after[0]}" "${before[1]}" "${after[1]}" <<'PY'
import collections, json, sys

stacks, report = sys.argv[1], json.loads(sys.argv[2])
cpu_before, cpu_after, switches_before, switches_after = map(int, sys.argv[3:7])
deliveries = max(1, report["sent"])
cpu_per_delivery = (cpu_after - cpu_before) / deliveries

# (stage, thread name, any of these frames in the stack); the first rule that matches wins.
# Frames are matched as substrings of perf's symbol names.
RULES = [
    ("commit: the claims' INSERTs", "ledger-writer", ["insert_claim"]),
    ("commit: duplicate counts (once a second)", "ledger-writer", ["record_duplicates"]),
    # The writer syncs the WAL itself unless the disk is slow (then the WAL syncer's thread).
    ("sync: fdatasync of the WAL", "ledger-writer", ["fdatasync", "fsync"]),
    ("sync: fdatasync of the WAL", "ledger-wal-sync", ["fdatasync", "fsync"]),
    ("sync: handing the answers back", "ledger-writer", ["Answerer", "wal_sync::"]),
    ("sync: handing the answers back", "ledger-wal-sync", [""]),
    ("commit: BEGIN, COMMIT (WAL frames), the writer's queue", "ledger-writer", [""]),
    ("checkpoint (WAL into the database file)", "ledger-checkpoi", [""]),
    ("signature: headers, HMAC-SHA256", "tokio-rt-worker", ["signature::", "ingest::precheck"]),
    ("JSON: reading job_id, writing the answer", "tokio-rt-worker", ["parse_claim", "payload::", "json_response"]),
    ("answer: writing the response (loopback TCP)", "tokio-rt-worker", ["poll_flush"]),
    ("accept/parse: reading and parsing the request", "tokio-rt-worker",
     ["poll_read_head", "poll_read_keep_alive", "poll_read_body", "accept", "Http1Transaction>::parse",
      "__libc_recv"]),
    ("memory of recent job_ids: the look-up, and remembering a new one", "tokio-rt-worker", ["acknowledged::"]),
    ("queue hand-off: to the writer and back (channels, timers, wake-ups)", "tokio-rt-worker",
     ["time::timeout", "oneshot", "mpsc", "Ledger::claim", "time_claim", "Answerer", "wal_sync::"]),
    ("tokio: parking, waking, epoll", "tokio-rt-worker", ["park", "Unparker", "epoll", "Driver::turn"]),
    ("the rest of a request (hyper, metrics, the task)", "tokio-rt-worker", ["Dispatcher", "ingest::", "serve::"]),
    # glibc keeps no frame pointers: a stack through malloc ends there, its caller unknown.
    ("malloc/free, caller unknown", "tokio-rt-worker", ["malloc", "free", "realloc"]),
    ("runtime threads, no user stack (interrupts, softirqs)", "tokio-rt-worker", [""]),
]

def stage(comm, frames):
    for name, thread, needles in RULES:
        if comm.startswith(thread) and any(n in f for n in needles for f in frames):
            return name
    return "other threads"

counts, total, comm, frames = collections.Counter(), 0, None, []
def flush():
    global total
    if comm is not None:
        counts[stage(comm, frames)] += 1
        total += 1
for line in open(stacks, errors="replace"):
    if not line.strip():
        flush(); comm, frames = None, []
    elif not line.startswith((" ", "\t")):
        flush(); comm, frames = line.split()[0], []
    else:
        parts = line.strip().split(" ", 1)
        frames.append(parts[1] if len(parts) > 1 else "")
flush()

print(f"\n{deliveries} deliveries at {report['per_second']:.0f}/s, p99 {report['p99_ms']:.2f} ms; "
      f"{cpu_per_delivery:.1f} us CPU and {(switches_after - switches_before) / deliveries:.2f} "
      f"context switches per delivery (the receiver's whole process); {total} samples")
print(f"\n{'stage':<72}{'us':>7}{'share':>8}")
for name in dict.fromkeys([r[0] for r in RULES] + ["other threads"]):
    if name in counts:
        share = counts[name] / max(1, total)
        print(f"{name:<72}{share * cpu_per_delivery:>7.1f}{share:>8.1%}")
PY
