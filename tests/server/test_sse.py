"""`specdec serve`: server-sent events read raw (framing, stop strings, UTF-8, a client that goes away)
and the server's shutdown on SIGTERM."""

import gc
import json
import signal
import socket
import time

import pytest
import requests

from conftest import (MODEL_ID, chunk_text, complete, chat, metrics, oracle, oracle_stopped_by_length,
                      parse_sse_bytes, read_sse, start_server, stop_across_boundary, stream_post)

STORY = "Once upon a time, in a small village by the sea, there lived"
COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def usage_speculative(chunk):
    """The speculative object of the usage chunk (beside usage, or inside it)."""
    return chunk.get("speculative") or (chunk.get("usage") or {}).get("speculative")


def check_stream(chunks, obj, prefix):
    assert chunks, "no chunks before data: [DONE]"
    assert all(c.get("object") == obj for c in chunks), [c.get("object") for c in chunks]
    ids = {c.get("id") for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith(prefix), f"chunk ids {ids}"
    assert all(isinstance(c.get("created"), int) and c.get("model") == MODEL_ID for c in chunks), chunks[0]
    content = [c for c in chunks if c.get("choices")]
    assert content, "no chunk with choices"
    finish = [c["choices"][0].get("finish_reason") for c in content]
    assert finish[-1] in ("stop", "length"), f"the last content chunk has finish_reason {finish[-1]!r}"
    assert all(f is None for f in finish[:-1]), f"finish_reason before the last content chunk: {finish}"
    return content


def test_sse_framing_completion(server):
    r = stream_post(server, "/v1/completions", {"prompt": STORY, "max_tokens": 16, "temperature": 0,
                                                "stream_options": {"include_usage": True}})
    chunks = read_sse(r)
    content = check_stream(chunks, "text_completion", "cmpl-")
    last = chunks[-1]
    assert last["choices"] == [] and isinstance(last.get("usage"), dict), f"last chunk is not the usage one: {last}"
    assert last["usage"]["completion_tokens"] == 16 or content[-1]["choices"][0]["finish_reason"] == "stop", last
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    # every other chunk has "usage": null (OpenAI's client documents it)
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1]), chunks[:-1]
    spec = usage_speculative(last)
    assert isinstance(spec, dict) and {"acceptance_rate", "tokens_per_target_pass"} <= set(spec), \
        f"the usage chunk carries no speculative object: {last}"
    text = "".join(chunk_text(c) for c in content)
    whole = complete(server, prompt=STORY, max_tokens=16, temperature=0)["choices"][0]["text"]
    assert text == whole, f"stream {text!r} != {whole!r}"


def test_sse_framing_chat(server):
    r = stream_post(server, "/v1/chat/completions", {"messages": CAPITAL, "max_tokens": 16, "temperature": 0})
    chunks = read_sse(r)
    content = check_stream(chunks, "chat.completion.chunk", "chatcmpl-")
    assert content[0]["choices"][0]["delta"].get("role") == "assistant", content[0]
    assert all(c["choices"] for c in chunks), "a usage chunk without include_usage"
    assert all("usage" not in c for c in chunks), chunks
    text = "".join(chunk_text(c) for c in content)
    whole = chat(server, messages=CAPITAL, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    assert text == whole, f"stream {text!r} != {whole!r}"


def test_sse_stop_never_shown(server):
    out = oracle(STORY, 32)
    assert oracle_stopped_by_length(out), out["text"]
    stop, expected = stop_across_boundary(server, out["tokens"], out["text"])
    for stops in (stop, [stop], ["zzzz", stop]):
        r = stream_post(server, "/v1/completions", {"prompt": STORY, "max_tokens": 32, "temperature": 0,
                                                    "stop": stops})
        chunks = read_sse(r)
        deltas = [chunk_text(c) for c in chunks]
        text = "".join(deltas)
        assert stop not in text, f"stop {stop!r} streamed: {deltas}"
        assert text == expected, f"stop {stops!r}: streamed {text!r}, expected {expected!r}"
        assert [c for c in chunks if c.get("choices")][-1]["choices"][0]["finish_reason"] == "stop"
    # chat, a stop string of one word of its answer
    full = chat(server, messages=CAPITAL, max_tokens=24, temperature=0)["choices"][0]["message"]["content"]
    words = [w for w in full.split() if w.isalpha() and len(w) >= 4]
    assert words, full
    word = words[len(words) // 2]
    chunks = read_sse(stream_post(server, "/v1/chat/completions", {"messages": CAPITAL, "max_tokens": 24,
                                                                   "temperature": 0, "stop": [word]}))
    text = "".join(chunk_text(c) for c in chunks)
    assert text == full[:full.find(word)], f"stop {word!r}: streamed {text!r} of {full!r}"


def _check_deltas_utf8(chunks):
    deltas = [chunk_text(c) for c in chunks]
    for d in deltas:
        try:
            d.encode("utf-8")  # a lone surrogate (half a character as \\uD83D) fails here
        except UnicodeEncodeError as e:
            pytest.fail(f"delta {d!r} is not valid UTF-8: {e}; deltas {deltas}")
        assert "\ufffd" not in d, f"a delta with U+FFFD (a split character?): {d!r}; deltas {deltas}"
    return "".join(deltas)


def test_sse_utf8_deltas(server):
    prompt = "Le café est très chaud. L'élève a écrit une lettre à sa mère. Il était une fois, dans un château"
    want = oracle(prompt, 40)["text"]
    text = _check_deltas_utf8(read_sse(stream_post(server, "/v1/completions",
                                                   {"prompt": prompt, "max_tokens": 40, "temperature": 0})))
    assert text == want, f"streamed {text!r}\noracle {want!r}"
    assert not text.isascii(), f"the answer has no non-ASCII character to test with; change the prompt: {text!r}"
    emoji = [{"role": "user", "content": "Reply with five emoji about the sea, like 🌊🐟, and the French word for sea."}]
    _check_deltas_utf8(read_sse(stream_post(server, "/v1/chat/completions",
                                            {"messages": emoji, "max_tokens": 32, "temperature": 0})))


def _open_raw_stream(server, body, events=3):
    """POST with a raw socket; reads until `events` SSE events arrived. Returns (socket, bytes read)."""
    data = json.dumps(dict(body, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    buf = b""
    while buf.count(b"data: ") < events:
        piece = sock.recv(65536)
        assert piece, f"the server closed the stream early: {buf[-500:]!r}"
        buf += piece
    assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
    return sock, buf


def _wait_for_the_cancel(server, cancelled0):
    """Waits (10 s at most) until no row runs and one more request was counted cancelled than
    `cancelled0`; returns the metrics then."""
    label = ("specdec:requests", "specdec:requests_total")
    t0 = time.monotonic()
    while True:
        m = metrics(server)
        running = m.value("specdec:num_requests_running", "specdec:num_requests_running")
        cancelled = m.value(*label, status="cancelled")
        if running == 0 and cancelled > cancelled0:
            return m
        assert time.monotonic() - t0 < 10, \
            f"10 s after the client left: running {running}, cancelled {cancelled0} -> {cancelled}"
        time.sleep(0.1)


def test_client_disconnect_cancels(server):
    before = metrics(server)
    label = ("specdec:requests", "specdec:requests_total")
    cancelled0 = before.value(*label, status="cancelled")
    ok0 = before.value(*label, status="ok")
    sock, _ = _open_raw_stream(server, {"prompt": COUNT, "max_tokens": 400, "temperature": 0})
    sock.close()
    m = _wait_for_the_cancel(server, cancelled0)
    assert m.value(*label, status="ok") == ok0, "the abandoned request was counted as ok"
    server.assert_healthy("after a client disconnected")
    # Its log line says so, with the tokens it had.
    deadline = time.monotonic() + 10
    while not (cancelled_lines := [l for l in server.log_text().splitlines()
                                   if "POST /v1/completions 200" in l and l.endswith(" cancelled")]):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)
    completion = int(cancelled_lines[-1].split(" completion ")[1].split()[0])
    assert 1 <= completion < 400, cancelled_lines[-1]


def test_client_disconnect_cancels_a_request_that_does_not_stream(server):
    # The client's socket closes while its (non-streamed) answer is being generated: the request
    # is cancelled and its row freed, as a stream's is.
    label = ("specdec:requests", "specdec:requests_total")
    cancelled0 = metrics(server).value(*label, status="cancelled")
    data = json.dumps({"prompt": COUNT, "max_tokens": 600, "temperature": 0}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    t0 = time.monotonic()
    while metrics(server).value("specdec:num_requests_running", "specdec:num_requests_running") == 0:
        assert time.monotonic() - t0 < 10, "the request never ran"
        time.sleep(0.05)
    sock.close()
    _wait_for_the_cancel(server, cancelled0)
    server.assert_healthy("after a client left before its answer")


# ---------------------------------------------------------------------------------------------
# Shutdown


def test_sigterm_idle():
    s = start_server()
    assert complete(s, prompt=COUNT, max_tokens=2)["choices"]
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 30
    with pytest.raises(requests.ConnectionError):
        requests.get(s.url + "/health", timeout=5)


def sigterm_mid_stream(s, body):
    """Streams `body` from server `s`, sends SIGTERM after the first event, reads the stream to its
    end and checks that the server exits 0; returns the stream's chunks that carry choices."""
    r = stream_post(s, "/v1/completions", body)
    assert r.status_code == 200, r.text
    it = r.iter_content(chunk_size=None)
    buf = b""
    for piece in it:
        buf += piece
        if b"\n\n" in buf:
            break
    s.proc.send_signal(signal.SIGTERM)
    # While it drains, /health says so (a load balancer stops sending it requests).
    deadline = time.monotonic() + 5
    while (h := requests.get(s.url + "/health", timeout=5)).status_code == 200:
        assert time.monotonic() < deadline, "GET /health still 200 5 s after SIGTERM"
        time.sleep(0.02)
    assert h.status_code == 503 and h.json() == {"status": "shutting down"}, (h.status_code, h.text)
    for piece in it:
        buf += piece
    content = [c for c in parse_sse_bytes(buf) if c.get("choices")]  # ends with data: [DONE]
    try:
        rc = s.proc.wait(30)
    except Exception:
        s.proc.kill()
        raise AssertionError(f"no exit within 30 s of SIGTERM\n{s.describe()}")
    assert rc == 0, f"exit status {rc} after SIGTERM\n{s.describe()}"
    return content


def test_a_request_while_draining_is_refused_and_its_connection_closed():
    # A long answer keeps the server draining while the request comes: 4000 tokens, seconds of
    # work on any machine (600 were once all made, and the server gone, before the request came).
    s = start_server("--shutdown-timeout", "60", "--ctx", "4096", "--max-batch", "1")
    try:
        r = stream_post(s, "/v1/completions", {"prompt": COUNT, "max_tokens": 4000, "temperature": 0,
                                               "ignore_eos": True})
        assert r.status_code == 200, r.text
        # The iterator is kept: urllib3 closes the connection of a stream whose iterator is
        # collected unfinished, and the server, seeing the client leave, cancelled the answer and
        # stopped before the request below came (whenever Python's garbage collector ran first).
        chunks = r.iter_content(chunk_size=None)
        next(chunks)
        gc.collect()  # (the collection that ended the stream, when the iterator was not kept)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while requests.get(s.url + "/health", timeout=5).status_code == 200:
            assert time.monotonic() < deadline, "GET /health still 200 5 s after SIGTERM"
            time.sleep(0.02)
        # Refused with Connection: close, so that a proxy sends its next request elsewhere.
        refused = requests.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
        assert refused.status_code == 503, (refused.status_code, refused.text)
        assert refused.headers.get("Connection", "").lower() == "close", refused.headers
        chunks.close()
        r.close()  # the client leaves: its request is cancelled and the server exits
        assert s.proc.wait(30) == 0, s.describe()
    finally:
        s.stop()


def test_sigterm_while_streaming():
    content = sigterm_mid_stream(start_server("--shutdown-timeout", "30"),
                                 {"prompt": COUNT, "max_tokens": 64, "temperature": 0})
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length"), content[-1]
    text = "".join(chunk_text(c) for c in content)
    want = oracle(COUNT, 64)["text"]
    assert text == want, f"the request cut short by SIGTERM: {text!r}\nexpected {want!r}"


def test_sigterm_deadline_aborts():
    # An answer the shutdown deadline cuts off ends with finish_reason "abort", not "length".
    s = start_server("--shutdown-timeout", "0.3")
    content = sigterm_mid_stream(s, {"prompt": COUNT, "max_tokens": 600, "temperature": 0})
    assert content[-1]["choices"][0]["finish_reason"] == "abort", content[-1]
    # ... and its log line says the server cut it (not the client)
    cut = [l for l in s.log_text().splitlines() if l.startswith("POST /v1/completions 200")]
    assert len(cut) == 1 and cut[0].endswith(" aborted"), s.log_tail()
