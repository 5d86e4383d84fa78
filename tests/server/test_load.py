"""`specdec serve` under a bounded load: 200 greedy requests from 16 concurrent clients on a server of
8 rows, completions and chat, streaming and not, a fifth of them streams that the client abandons
after two events. Greedy answers must not depend on concurrency (each equals the answer the same
server gives to the same request alone), no request is lost or answered twice, the metrics settle,
and the server's resident memory does not grow once it is warm.

Its size is bounded for 2 slow cores: about 2,500 generated tokens under load and 40 serial
requests before it (SmolLM2-135M, 8 to 24 tokens per request; batched rows share their passes):
about 30 s on a 2-vCPU VM (the 200 requests themselves 16 s)."""

import json
import queue
import random
import socket
import threading
import time
from collections import Counter

import requests

from conftest import (HTTP_TIMEOUT_S, MODEL_ID, chunk_text, metrics, oracle, oracle_chat, read_sse,
                      start_server, stream_post)

N_REQUESTS = 200
N_WARM = 50          # the warm phase; resident memory is measured after it and after the rest
CLIENTS = 16
DISCONNECT_EVERY = 5  # every 5th request is a stream abandoned after DISCONNECT_AFTER events: 40
DISCONNECT_AFTER = 2
RSS_TOLERANCE = 0.05
SETTLE_S = 10

COMPLETION_PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "The three primary colours are",
    "Here is a recipe for pancakes:",
    "The quick brown fox",
    "def fibonacci(n):",
    "In the year 2050, cities will",
    "Dear hiring manager, I am writing to",
    "The most important rule of cooking is",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Suggest a name for a pet cat.",
    "Write a haiku about the sea.",
    "Explain what a CPU does in one sentence.",
    "Give me a tip for learning a new language.",
    "What colour is the sky on a clear day?",
    "Translate 'good morning' into Spanish.",
]


def max_tokens_of(prompt_index, variant):
    """Two lengths per prompt, both in [8, 24]: (prompt, max_tokens) pairs the load repeats."""
    return 8 + (prompt_index * 5) % 8 if variant == 0 else 16 + (prompt_index * 3) % 9


def plan():
    """The 200 requests, fixed: (n, kind, prompt index, max_tokens, mode); mode is plain, stream
    (read to [DONE], with include_usage) or disconnect."""
    rng = random.Random(20261202)
    out = []
    for n in range(N_REQUESTS):
        kind = rng.choice(("completion", "chat"))
        i = rng.randrange(len(COMPLETION_PROMPTS))
        m = max_tokens_of(i, rng.randrange(2))
        if n % DISCONNECT_EVERY == DISCONNECT_EVERY - 1:
            mode = "disconnect"
        else:
            mode = "stream" if rng.random() < 0.4 else "plain"
        out.append((n, kind, i, m, mode))
    return out


def route_and_body(kind, i, m):
    if kind == "completion":
        return "/v1/completions", {"model": MODEL_ID, "prompt": COMPLETION_PROMPTS[i], "max_tokens": m,
                                   "temperature": 0}
    return "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": CHAT_PROMPTS[i]}],
                                    "max_tokens": m, "temperature": 0}


def answer_of_json(kind, j):
    """(id, text, finish_reason, completion_tokens) of a non-streaming answer."""
    c = j["choices"][0]
    text = c["text"] if kind == "completion" else c["message"]["content"]
    return j["id"], text, c["finish_reason"], j["usage"]["completion_tokens"]


def answer_of_stream(chunks):
    ids = {c.get("id") for c in chunks}
    assert len(ids) == 1, f"one stream carries several ids: {ids}"
    content = [c for c in chunks if c.get("choices")]
    finish = content[-1]["choices"][0].get("finish_reason") if content else None
    usage = chunks[-1].get("usage") if chunks and not chunks[-1].get("choices") else None
    assert usage is not None, f"no usage chunk at the end despite include_usage: {chunks[-1:]}"
    return ids.pop(), "".join(chunk_text(c) for c in content), finish, usage["completion_tokens"]


class _Dechunk:
    """Incremental decoder of an HTTP/1.1 chunked body."""

    def __init__(self):
        self.raw = b""
        self.body = b""

    def feed(self, data):
        self.raw += data
        while True:
            i = self.raw.find(b"\r\n")
            if i < 0:
                return
            size = int(self.raw[:i].split(b";")[0], 16)
            if size == 0 or len(self.raw) < i + 2 + size + 2:
                return
            self.body += self.raw[i + 2:i + 2 + size]
            self.raw = self.raw[i + 4 + size:]


def stream_and_leave(port, route, body, n_events):
    """Streams `body` over a raw socket, reads `n_events` server-sent events and closes the socket
    (an ordinary close, as a client that goes away). Returns (status, id, text of those events)."""
    data = json.dumps(dict(body, stream=True)).encode()
    head = (f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_S)
    try:
        sock.sendall(head + data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            piece = sock.recv(65536)
            assert piece, f"the server closed the connection before its headers: {buf[:300]!r}"
            buf += piece
        headers, rest = buf.split(b"\r\n\r\n", 1)
        status = int(headers.split(b" ", 2)[1])
        if status != 200:
            return status, None, headers.decode(errors="replace") + rest.decode(errors="replace")
        chunked = b"transfer-encoding: chunked" in headers.lower()
        dec = _Dechunk()
        if chunked:
            dec.feed(rest)
        body_bytes = dec.body if chunked else rest
        while body_bytes.count(b"\n\n") < n_events:
            piece = sock.recv(65536)
            assert piece, f"the stream ended before {n_events} events: {body_bytes[-300:]!r}"
            if chunked:
                dec.feed(piece)
                body_bytes = dec.body
            else:
                body_bytes += piece
        events = body_bytes.split(b"\n\n")[:n_events]
        chunks = []
        for ev in events:
            assert ev.startswith(b"data: ") and ev != b"data: [DONE]", f"unexpected event {ev[:300]!r}"
            chunks.append(json.loads(ev[len(b"data: "):]))
        ids = {c.get("id") for c in chunks}
        assert len(ids) == 1, f"one stream carries several ids: {ids}"
        return status, ids.pop(), "".join(chunk_text(c) for c in chunks)
    finally:
        sock.close()


def run_one(server, http, req):
    """One request of the plan: a result dict (never raises: failures are reported together)."""
    n, kind, i, m, mode = req
    route, body = route_and_body(kind, i, m)
    res = {"req": req, "status": None, "id": None, "text": None, "finish": None, "tokens": None, "error": None}
    try:
        if mode == "disconnect":
            res["status"], res["id"], res["text"] = stream_and_leave(server.port, route, body, DISCONNECT_AFTER)
        elif mode == "stream":
            r = http.post(server.url + route, json=dict(body, stream=True, stream_options={"include_usage": True}),
                          stream=True, timeout=HTTP_TIMEOUT_S)
            res["status"] = r.status_code
            if r.status_code == 200:
                res["id"], res["text"], res["finish"], res["tokens"] = answer_of_stream(read_sse(r))
            else:
                res["error"] = r.text[:300]
        else:
            r = http.post(server.url + route, json=body, timeout=HTTP_TIMEOUT_S)
            res["status"] = r.status_code
            if r.status_code == 200:
                res["id"], res["text"], res["finish"], res["tokens"] = answer_of_json(kind, r.json())
            else:
                res["error"] = r.text[:300]
    except Exception as e:  # noqa: BLE001 - every failure is listed by the test
        res["error"] = f"{type(e).__name__}: {e}"
    return res


def run_phase(server, reqs):
    """The requests from CLIENTS threads, each taking the next request when its last is answered."""
    todo = queue.Queue()
    for r in reqs:
        todo.put(r)
    results, lock = [], threading.Lock()

    def client():
        http = requests.Session()
        http.trust_env = False
        try:
            while True:
                try:
                    req = todo.get_nowait()
                except queue.Empty:
                    return
                res = run_one(server, http, req)
                with lock:
                    results.append(res)
        finally:
            http.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HTTP_TIMEOUT_S * 3)
    assert not any(t.is_alive() for t in threads), "a client thread is still waiting for the server"
    return results


REQ_FAMILY = ("specdec:requests", "specdec:requests_total")
TTFT_FAMILY = ("specdec:time_to_first_token_seconds", "specdec:time_to_first_token_seconds_count")


def counts(m):
    return {s: m.value(*REQ_FAMILY, status=s) for s in ("ok", "refused", "error", "cancelled")}


def settle(server, want_total):
    """Polls /metrics until nothing runs or waits and requests_total counts `want_total` finished
    requests; returns the last Metrics (the caller asserts on it) after at most SETTLE_S seconds."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        m = metrics(server)
        running = m.value("specdec:num_requests_running", "specdec:num_requests_running")
        waiting = m.value("specdec:num_requests_waiting", "specdec:num_requests_waiting")
        if (running == 0 and waiting == 0 and sum(counts(m).values()) >= want_total) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no VmRSS")


def test_load_200_requests_16_clients():
    # Every answer feeds the shared suffix tree, which grows to its bound: a small one is reached
    # in the warm phase, so the memory check below also holds the tree to it.
    s = start_server("--max-batch", "8", "--max-queue", "256", "--http-threads", "40",
                     "--suffix-cache-tokens", "512")
    reqs = plan()
    assert sum(r[4] == "disconnect" for r in reqs) == N_REQUESTS // DISCONNECT_EVERY

    # Serial answers: each distinct (kind, prompt, max_tokens) once, one request at a time, on the
    # same server; two of them checked against `specdec generate` too.
    serial = {}
    for _, kind, i, m, _ in reqs:
        if (kind, i, m) in serial:
            continue
        route, body = route_and_body(kind, i, m)
        r = s.post(route, json=body)
        assert r.status_code == 200, f"serial {body} gave {r.status_code} {r.text[:500]}"
        serial[(kind, i, m)] = answer_of_json(kind, r.json())
    c_key = next(k for k in serial if k[0] == "completion")
    h_key = next(k for k in serial if k[0] == "chat")
    assert serial[c_key][1] == oracle(COMPLETION_PROMPTS[c_key[1]], c_key[2])["text"], \
        f"the server's serial answer to {c_key} is not `specdec generate`'s"
    assert serial[h_key][1] == oracle_chat([{"role": "user", "content": CHAT_PROMPTS[h_key[1]]}], h_key[2],
                                           server=s)["text"], \
        f"the server's serial answer to {h_key} is not `specdec generate`'s"

    # The server counts a request in /metrics just after it hands the answer over: wait for all.
    m0 = settle(s, len(serial))
    c0 = counts(m0)
    tokens0 = m0.value("specdec:generation_tokens", "specdec:generation_tokens_total")
    ttft0 = m0.value(*TTFT_FAMILY)
    serial_ids = [a[0] for a in serial.values()]

    t0 = time.monotonic()
    results = run_phase(s, reqs[:N_WARM])
    m_warm = settle(s, sum(c0.values()) + N_WARM)
    rss_warm = vm_rss_kb(s.proc.pid)
    t_warm = time.monotonic() - t0
    results += run_phase(s, reqs[N_WARM:])
    m1 = settle(s, sum(c0.values()) + N_REQUESTS)
    rss_end = vm_rss_kb(s.proc.pid)
    t_load = time.monotonic() - t0

    # Failures, listed together.
    assert len(results) == N_REQUESTS and sorted(r["req"][0] for r in results) == list(range(N_REQUESTS))
    bad = [f"#{r['req'][0]} {r['req'][1:]}: status {r['status']} {r['error']}" for r in results
           if r["error"] or r["status"] != 200]
    assert not bad, f"{len(bad)} of {N_REQUESTS} requests failed:\n" + "\n".join(bad[:20]) + "\n" + s.describe()

    completed = [r for r in results if r["req"][4] != "disconnect"]
    assert len(completed) == N_REQUESTS - N_REQUESTS // DISCONNECT_EVERY == 160
    wrong = []
    for r in completed:
        _, kind, i, m, mode = r["req"]
        _, want_text, want_finish, want_tokens = serial[(kind, i, m)]
        if r["finish"] not in ("stop", "length"):
            wrong.append(f"#{r['req'][0]} {mode}: finish_reason {r['finish']!r}")
        elif (r["text"], r["finish"], r["tokens"]) != (want_text, want_finish, want_tokens):
            wrong.append(f"#{r['req'][0]} {kind} {mode} prompt {i} max_tokens {m}: got "
                         f"{(r['text'], r['finish'], r['tokens'])!r}\n    alone {(want_text, want_finish, want_tokens)!r}")
    for r in results:
        if r["req"][4] == "disconnect":
            _, kind, i, m, _ = r["req"]
            if not serial[(kind, i, m)][1].startswith(r["text"]):
                wrong.append(f"#{r['req'][0]} abandoned stream: {r['text']!r} does not begin the answer "
                             f"{serial[(kind, i, m)][1]!r}")
    assert not wrong, f"{len(wrong)} answers under load differ from the answers alone:\n" + "\n".join(wrong[:20])

    ids = [r["id"] for r in results] + serial_ids
    dup = [i for i, c in Counter(ids).items() if c > 1]
    assert not dup and all(ids), f"response ids answered twice (or missing): {dup[:10]}"

    # The metrics settle: nothing left running or waiting. Each of the 200 is counted once, as ok or
    # cancelled. An abandoned stream counts as cancelled only if the server notices the close before
    # the request ends: it notices on a write that fails, and the first write after the close
    # usually still succeeds (into the socket's buffer; the peer answers with a reset), while a
    # request has 6 to 22 tokens left: most are cancelled, a few may finish as ok. So at least one,
    # at most 40.
    running = m1.value("specdec:num_requests_running", "specdec:num_requests_running")
    waiting = m1.value("specdec:num_requests_waiting", "specdec:num_requests_waiting")
    c1 = counts(m1)
    grew = {k: c1[k] - c0[k] for k in c1}
    n_abandoned = N_REQUESTS // DISCONNECT_EVERY
    assert running == 0 and waiting == 0, \
        f"{SETTLE_S} s after the load: running {running}, waiting {waiting}; requests_total grew by {grew}"
    assert grew["error"] == 0 and grew["refused"] == 0, f"requests_total grew by {grew}\n{s.describe()}"
    assert 1 <= grew["cancelled"] <= n_abandoned, f"requests_total grew by {grew}"
    assert grew["ok"] >= N_REQUESTS - n_abandoned, f"requests_total grew by {grew}"
    assert grew["ok"] + grew["cancelled"] == N_REQUESTS, f"requests_total grew by {grew} for {N_REQUESTS} requests"
    assert m1.value(*TTFT_FAMILY) - ttft0 == N_REQUESTS, "time_to_first_token_seconds_count did not grow by one per request"
    completed_tokens = sum(r["tokens"] for r in completed)
    tokens_grew = m1.value("specdec:generation_tokens", "specdec:generation_tokens_total") - tokens0
    assert tokens_grew >= completed_tokens, \
        f"generation_tokens_total grew by {tokens_grew}, less than the {completed_tokens} tokens answered"

    # Resident memory: the caches are preallocated and the prefix cache's LRU is full after the
    # warm phase, so 150 more requests must not grow it (the allocator may hand memory back).
    assert rss_end - rss_warm <= RSS_TOLERANCE * rss_warm, \
        f"VmRSS {rss_warm} kB after {N_WARM} requests, {rss_end} kB after {N_REQUESTS} " \
        f"({100 * (rss_end - rss_warm) / rss_warm:+.1f}%)"
    print(f"\nload: {N_REQUESTS} requests in {t_load:.1f} s (warm {N_WARM} in {t_warm:.1f} s); "
          f"{completed_tokens} tokens answered; requests_total grew by {grew}; "
          f"VmRSS {rss_warm} -> {rss_end} kB")
    s.assert_healthy("after the load")
    s.stop()
