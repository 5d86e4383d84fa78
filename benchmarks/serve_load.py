#!/usr/bin/env python3
"""A closed-loop load generator for OpenAI-compatible servers (`specdec serve`, llama.cpp's
llama-server): measurement, not a test. Standard library only (asyncio, raw HTTP/1.1).

For each concurrency C it starts C clients at once; each sends --requests-per-client streaming,
greedy requests back to back (the next when the last one's stream ended), each on a connection of
its own. Per request it records the time to first token (from sending the request to the first
event with non-empty text), the inter-token latencies (the gap before each later text event divided
by the tokens in it) and its tokens (the usage chunk's completion_tokens, asked for with
stream_options.include_usage; without one, the count of text events). Servers do not say how many
tokens an event holds: when the events are as many as the tokens (each event one token, as both
servers send target-only) that is exact; otherwise (speculation sends a group of verified tokens
per event) each event is given a share of the tokens proportional to its text.

Per concurrency one JSON line, printed and appended to --out, a record of benchmarks/bench_record.py's
schema: {benchmark, run, date, commit, cpu, cpus, threads, command, label, url, api, concurrency,
requests, errors, tokens, seconds, throughput_tokens_per_s, ttft_p50, ttft_p99, itl_p50, itl_p99,
mean_tokens, max_tokens, ...}; benchmark is --benchmark (default: --out's name without .jsonl), run
the time this process started, command this process's command line, threads --threads.
seconds: from the first request sent to the last stream ended; throughput: tokens / seconds; ttft
and itl in seconds (itl percentiles over tokens). With a specdec server also
tokens_per_target_pass and acceptance_rate (over all the requests' tokens, from their `speculative`
objects). --meta '{...}' adds fields to every line, or replaces them (serve_peer.sh: run, threads,
command, server: the server's command).

Prompts (--prompts FILE): JSON Lines with "prompt" (and optionally "system", for --api chat), as
benchmarks/prompts/*.jsonl, or a text file with one prompt per line (benchmarks/prompts/grounded.txt).
Client c's r-th request (of R) uses prompt (c * R + r) mod P at every concurrency.

  python3 benchmarks/serve_load.py --url http://127.0.0.1:8080 --concurrency 1,4,8,16 \
      --requests-per-client 4 --max-tokens 64 --prompts benchmarks/prompts/serve_chat.jsonl --api chat \
      --label specdec --out benchmarks/results/serve_peer.jsonl

--dump-requests FILE writes, instead of measuring, the requests the first concurrency would send as
a `specdec generate --prompts-file` file (in the order the clients send them) and exits.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

import bench_record


def read_prompts(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                j = json.loads(line)
                if not isinstance(j, dict) or not isinstance(j.get("prompt"), str):
                    sys.exit(f"{path}:{n}: expected a JSON object with a \"prompt\" string")
                out.append({"prompt": j["prompt"], "system": j.get("system")})
            else:
                out.append({"prompt": line.rstrip("\n"), "system": None})
    if not out:
        sys.exit(f"{path}: no prompts")
    return out


def percentile(values, q):
    """Linear interpolation between the closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class Target:
    def __init__(self, url, api, model, max_tokens, extra):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            sys.exit(f"--url {url}: expected http://HOST[:PORT][/PATH]")
        self.host, self.port = u.hostname, u.port or 80
        base = u.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        self.base = base
        self.api, self.model, self.max_tokens, self.extra = api, model, max_tokens, extra
        self.route = base + ("/v1/chat/completions" if api == "chat" else "/v1/completions")

    def body(self, p, max_tokens=None):
        b = {"max_tokens": max_tokens or self.max_tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}}
        if self.model:
            b["model"] = self.model
        if self.api == "chat":
            msgs = [{"role": "system", "content": p["system"]}] if p.get("system") else []
            b["messages"] = msgs + [{"role": "user", "content": p["prompt"]}]
        else:
            b["prompt"] = p["prompt"]
        b.update(self.extra)
        return b


async def _read_body(reader, headers, on_data):
    """Reads an HTTP/1.1 body (chunked, Content-Length or to the end), calling on_data per piece."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            on_data(await reader.readexactly(size))
            await reader.readexactly(2)
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            piece = await reader.read(min(left, 65536))
            if not piece:
                return
            left -= len(piece)
            on_data(piece)
    else:
        while True:
            piece = await reader.read(65536)
            if not piece:
                return
            on_data(piece)


async def http_request(target, method, path, body=None, on_data=None):
    """One request on a connection of its own (Connection: close). Returns (status, headers, body
    bytes, or b"" when on_data took them)."""
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
        writer.write(head + data)
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        got = []
        await _read_body(reader, headers, on_data if (on_data and status == 200) else got.append)
        return status, headers, b"".join(got)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def stream_one(target, prompt, timeout):
    """One streaming request: a dict of its measurements, or with "error"."""
    events = []  # (time, text) of the events with text
    state = {"buf": b"", "usage": None, "spec": None, "error": None, "done": False}

    def on_data(piece):
        now = time.perf_counter()
        state["buf"] += piece.replace(b"\r\n", b"\n")
        while b"\n\n" in state["buf"]:
            ev, state["buf"] = state["buf"].split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    state["done"] = True
                    continue
                try:
                    j = json.loads(payload)
                except json.JSONDecodeError:
                    state["error"] = f"an event is not JSON: {payload[:200]!r}"
                    continue
                if "error" in j:
                    state["error"] = json.dumps(j["error"])[:300]
                if j.get("usage"):
                    state["usage"] = j["usage"]
                if isinstance(j.get("speculative"), dict):
                    state["spec"] = j["speculative"]
                for c in j.get("choices") or []:
                    text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                    if text:
                        events.append((now, text))

    t0 = time.perf_counter()
    try:
        status, _, body = await asyncio.wait_for(
            http_request(target, "POST", target.route, target.body(prompt), on_data), timeout)
    except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    t1 = time.perf_counter()
    if status != 200:
        return {"error": f"HTTP {status}: {body[:300]!r}"}
    if state["error"]:
        return {"error": state["error"]}
    if not events:
        return {"error": "no event with text"}
    usage_tokens = (state["usage"] or {}).get("completion_tokens")
    n = usage_tokens if isinstance(usage_tokens, int) and usage_tokens > 0 else len(events)
    # Tokens per event: exact when there are as many events as tokens, else shared by text length.
    if n == len(events):
        shares = [1.0] * len(events)
    else:
        chars = [len(t) for _, t in events]
        total = sum(chars)
        shares = [n * c / total for c in chars]
    itl = []
    for i in range(1, len(events)):
        gap = events[i][0] - events[i - 1][0]
        k = max(shares[i], 1e-9)
        itl += [gap / k] * max(1, round(shares[i]))
    return {"ttft": events[0][0] - t0, "itl": itl, "tokens": n, "seconds": t1 - t0, "spec": state["spec"],
            "usage": state["usage"] is not None}


async def run_level(target, prompts, concurrency, per_client, timeout):
    results = []

    async def client(c):
        for r in range(per_client):
            results.append(await stream_one(target, prompts[(c * per_client + r) % len(prompts)], timeout))

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return results, time.perf_counter() - t0


async def wait_ready(target, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            status, _, _ = await asyncio.wait_for(http_request(target, "GET", target.base + "/health"), 10)
            if status == 200:
                return
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"{target.host}:{target.port}/health was not 200 within {seconds} s")
        await asyncio.sleep(0.5)


def summarise(args, target, concurrency, results, seconds, base, meta):
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    tokens = sum(r["tokens"] for r in ok)
    itl = [x for r in ok for x in r["itl"]]
    ttft = [r["ttft"] for r in ok]
    rnd = lambda x, d=5: None if x is None else round(x, d)  # noqa: E731
    line = {
        "label": args.label, "url": args.url, "api": args.api, "concurrency": concurrency,
        "requests": len(ok), "errors": len(errors), "tokens": tokens, "seconds": rnd(seconds, 4),
        "throughput_tokens_per_s": rnd(tokens / seconds if seconds > 0 else None, 3),
        "ttft_p50": rnd(percentile(ttft, 50)), "ttft_p99": rnd(percentile(ttft, 99)),
        "itl_p50": rnd(percentile(itl, 50)), "itl_p99": rnd(percentile(itl, 99)),
        "mean_tokens": rnd(tokens / len(ok) if ok else None, 2), "max_tokens": args.max_tokens,
        "usage_reported": all(r["usage"] for r in ok) if ok else None,
    }
    spec = [r for r in ok if r.get("spec")]
    if spec:  # over all the requests' tokens (a mean of per-request ratios weighs a short answer as a long one)
        passes = sum(r["spec"].get("target_passes", 0) for r in spec)
        drafted = sum(r["spec"].get("drafted_tokens", 0) for r in spec)
        new_tokens = sum(r["spec"].get("tokens_per_target_pass", 0) * r["spec"].get("target_passes", 0) for r in spec)
        line["tokens_per_target_pass"] = rnd(new_tokens / passes if passes else 0.0, 3)
        line["acceptance_rate"] = rnd(sum(r["spec"].get("accepted_tokens", 0) for r in spec) / drafted
                                      if drafted else 0.0, 3)
    if args.extra_json:
        line["extra"] = json.loads(args.extra_json)
    line.update(meta)
    if errors:
        line["first_error"] = errors[0]
    return bench_record.complete(line, {**base, "date": bench_record.now()})


def dump_requests(args, prompts, concurrency):
    with open(args.dump_requests, "w", encoding="utf-8") as f:
        per = args.requests_per_client
        for r in range(per):
            for c in range(concurrency):
                p = prompts[(c * per + r) % len(prompts)]
                line = {"prompt": p["prompt"], "max_new_tokens": args.max_tokens}
                if p.get("system") and args.api == "chat":
                    line["system"] = p["system"]
                f.write(json.dumps(line) + "\n")
    print(f"wrote {concurrency * args.requests_per_client} requests to {args.dump_requests}", file=sys.stderr)


async def main_async(args):
    prompts = read_prompts(args.prompts)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        sys.exit("--concurrency: a comma-separated list of positive integers")
    if args.dump_requests:
        dump_requests(args, prompts, levels[0])
        return
    extra = json.loads(args.extra_json) if args.extra_json else {}
    meta = json.loads(args.meta) if args.meta else {}
    if not isinstance(extra, dict) or not isinstance(meta, dict):
        sys.exit("--extra-json and --meta take JSON objects")
    target = Target(args.url, args.api, args.model, args.max_tokens, extra)
    if args.wait_ready:
        await wait_ready(target, args.wait_ready)
    name = args.benchmark or (os.path.basename(args.out)[:-len(".jsonl")] if args.out and args.out.endswith(".jsonl")
                              else "serve_load")
    base = bench_record.common(name, bench_record.command_line(), args.threads)
    if args.warmup:
        # Warm-up (not counted): a batch of concurrent requests, so that the server has run
        # several rows at once before the first measurement.
        n = min(args.warmup, len(prompts))
        warm = await asyncio.gather(*(stream_one(target, prompts[i], args.timeout) for i in range(n)))
        bad = [r["error"] for r in warm if "error" in r]
        if bad:
            sys.exit(f"warm-up request failed: {bad[0]}")
    for c in levels:
        cpu = time.process_time()
        results, seconds = await run_level(target, prompts, c, args.requests_per_client, args.timeout)
        cpu = time.process_time() - cpu
        line = summarise(args, target, c, results, seconds, base, meta)
        # This process's own CPU time: on a machine it shares with the server, time the server lost.
        line["client_cpu_seconds"] = round(cpu, 4)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        print(f"{args.label} c={c}: {line['tokens']} tokens in {line['seconds']:.2f} s = "
              f"{line['throughput_tokens_per_s']} tok/s; ttft p50 {line['ttft_p50']} s, itl p50 {line['itl_p50']} s"
              + (f"; {line['errors']} errors ({line['first_error']})" if line["errors"] else ""), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4,8,16", help="comma-separated client counts (default 1,4,8,16)")
    ap.add_argument("--requests-per-client", type=int, default=4, help="requests each client sends (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default 64)")
    ap.add_argument("--prompts", required=True, help="JSON Lines with \"prompt\", or one prompt per line")
    ap.add_argument("--api", choices=("completions", "chat"), default="completions",
                    help="/v1/completions (the prompt as text) or /v1/chat/completions (one user turn)")
    ap.add_argument("--model", default=None, help="the request's \"model\" (default: none sent)")
    ap.add_argument("--extra-json", default=None, help="a JSON object merged into every request body")
    ap.add_argument("--label", default="server", help="the \"label\" of the result lines")
    ap.add_argument("--meta", default=None, help="a JSON object of fields added to every result line")
    ap.add_argument("--benchmark", default=None, help="the records' benchmark (default: --out's name without .jsonl)")
    ap.add_argument("--threads", type=int, default=None, help="the server's threads, for the records")
    ap.add_argument("--out", default=None, help="append the result lines to this file")
    ap.add_argument("--warmup", type=int, default=8, help="concurrent warm-up requests first, not counted (default 8)")
    ap.add_argument("--wait-ready", type=float, default=0, help="first wait up to this many seconds for GET /health 200")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may take (default 600)")
    ap.add_argument("--dump-requests", default=None, metavar="FILE",
                    help="write the first concurrency's requests as a `specdec generate --prompts-file` file and exit")
    args = ap.parse_args()
    if args.requests_per_client < 1 or args.max_tokens < 1:
        sys.exit("--requests-per-client and --max-tokens must be >= 1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
