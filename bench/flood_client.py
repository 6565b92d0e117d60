#!/usr/bin/env python3
"""Hostile clients for bench/flood.sh, on loopback only.

  signed     N connections at once, each POSTing one body of B bytes with a fresh valid
             signature and a new job_id, streamed in 64 KiB pieces. Prints a JSON summary; the
             job_ids answered 200 go to --acked.
  forged     the same with well-formed but wrong signatures (a fresh timestamp and a random
             sume-v1 digest): they pass every check that can be made before the body is read.
  slowloris  N connections that send a request head one byte a second, reconnecting when the
             receiver closes them, until --duration is over.
"""
import argparse
import asyncio
import hashlib
import hmac
import json
import os
import time

PIECE = 64 * 1024


async def post_one(args, index, padding, summary, acked):
    job_id = f"flood-{os.getpid()}-{index}"
    prefix = f'{{"job_id":"{job_id}","type":"job.completed","pad":"'.encode()
    suffix = b'"}'
    length = len(prefix) + len(padding) + len(suffix)
    head = [
        f"POST /sume/webhook HTTP/1.1",
        "host: 127.0.0.1",
        f"content-length: {length}",
        "content-type: application/json",
        "connection: close",
    ]
    timestamp = str(int(time.time())).encode()
    if args.mode == "signed":
        mac = hmac.new(args.secret.encode(), timestamp + b"." + prefix, hashlib.sha256)
        mac.update(padding)
        mac.update(suffix)
        digest = mac.hexdigest()
    else:
        digest = os.urandom(32).hex()
    head += [
        f"x-sume-webhook-timestamp: {timestamp.decode()}",
        f"x-sume-webhook-signature: sume-v1={digest}",
    ]
    started = time.monotonic()
    status = "error"
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
            writer.write(prefix)
            view = memoryview(padding)
            for offset in range(0, len(view), PIECE):
                writer.write(view[offset:offset + PIECE])
                await writer.drain()
            writer.write(suffix)
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the receiver may answer (401, 503) and close before the body is all sent
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=60)
            parts = line.split()
            status = parts[1].decode() if len(parts) > 1 else "closed without an answer"
        except (ConnectionError, OSError):
            status = "reset without an answer"
        writer.close()
    except (ConnectionError, OSError, asyncio.TimeoutError) as error:
        status = type(error).__name__
    summary["statuses"][status] = summary["statuses"].get(status, 0) + 1
    summary["latencies"].append(time.monotonic() - started)
    if status == "200":
        acked.append(job_id)


async def flood(args):
    padding = b"x" * max(0, args.body_bytes - 80)
    summary = {"statuses": {}, "latencies": []}
    acked = []
    started = time.monotonic()
    await asyncio.gather(*(post_one(args, i, padding, summary, acked) for i in range(args.connections)))
    latencies = sorted(summary.pop("latencies"))
    summary["seconds"] = round(time.monotonic() - started, 2)
    summary["p50_s"] = round(latencies[len(latencies) // 2], 3)
    summary["max_s"] = round(latencies[-1], 3)
    if args.acked:
        with open(args.acked, "w") as out:
            out.write("\n".join(acked))
    print(json.dumps(summary))


async def slow_connection(args, deadline, counts):
    head = b"POST /sume/webhook HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"a" * 4096
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
            counts["connections"] += 1
            for byte in head:
                if time.monotonic() >= deadline:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
            writer.close()
        except (ConnectionError, OSError):
            counts["closed_by_receiver"] += 1
            await asyncio.sleep(0.2)


async def slowloris(args):
    deadline = time.monotonic() + args.duration
    counts = {"connections": 0, "closed_by_receiver": 0}
    await asyncio.gather(*(slow_connection(args, deadline, counts) for _ in range(args.connections)))
    print(json.dumps(counts))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["signed", "forged", "slowloris"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--body-bytes", type=int, default=1024 * 1024)
    parser.add_argument("--secret", default="whsec_benchmark")
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--acked")
    args = parser.parse_args()
    asyncio.run(slowloris(args) if args.mode == "slowloris" else flood(args))


if __name__ == "__main__":
    main()
