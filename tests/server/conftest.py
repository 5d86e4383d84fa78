"""Helpers and fixtures of the `specdec serve` tests (run them with scripts/test_server.sh).

Environment: SPECDEC, the `specdec` binary (default build/specdec), and SPECDEC_SERVE_MODEL, the
model the servers load (default models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, from
scripts/get_models.sh). Relative paths are taken from the current directory; the defaults from the
repository root.

The oracle is `specdec generate ... --json`: greedy answers of the server must equal it token for
token (compared as text).
"""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]

# Requests to 127.0.0.1 never go through a proxy that the environment may name.
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(p for p in (os.environ.get(_var, ""), "127.0.0.1,localhost") if p)


def _path_from_env(var, default):
    value = os.environ.get(var)
    return str(Path(value).resolve()) if value else str(REPO / default)


SPECDEC = _path_from_env("SPECDEC", "build/specdec")
MODEL = _path_from_env("SPECDEC_SERVE_MODEL", "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_ID = os.path.basename(os.path.normpath(MODEL))
# A second model, for what SmolLM2 cannot show (a tokenizer that adds a BOS).
GEMMA = _path_from_env("SPECDEC_SERVE_GEMMA", "models/gemma3/gemma-3-270m-q4_k_m.gguf")


def gemma_model():
    """GEMMA's path; a missing file skips the test (fails it under SPECDEC_REQUIRE_DATA=1, as CI runs)."""
    if not os.path.exists(GEMMA):
        why = f"SPECDEC_SERVE_GEMMA={GEMMA} does not exist (run scripts/get_models.sh)"
        if os.environ.get("SPECDEC_REQUIRE_DATA") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return GEMMA

# The flags every server gets unless the test gives its own value.
DEFAULT_ARGS = {"--max-batch": "4", "--ctx": "1024"}
CTX = 1024
HEALTH_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
HTTP_TIMEOUT_S = 120


def pytest_sessionstart(session):
    problems = []
    if not (os.path.isfile(SPECDEC) and os.access(SPECDEC, os.X_OK)):
        problems.append(f"SPECDEC={SPECDEC} is not an executable file (build it, or set SPECDEC)")
    if not os.path.exists(MODEL):
        problems.append(
            f"SPECDEC_SERVE_MODEL={MODEL} does not exist (run scripts/get_models.sh, or set SPECDEC_SERVE_MODEL)"
        )
    if problems:
        pytest.exit("tests/server: " + "; ".join(problems), returncode=1)


_log_dir_path = None
_servers = []


@pytest.fixture(scope="session", autouse=True)
def _server_logs(tmp_path_factory):
    """Puts the servers' logs under pytest's tmp dir; kills any server a failed test left running."""
    global _log_dir_path
    _log_dir_path = tmp_path_factory.mktemp("serve-logs")
    yield
    for s in _servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def _log_dir():
    global _log_dir_path
    if _log_dir_path is None:
        _log_dir_path = Path(tempfile.mkdtemp(prefix="specdec-serve-logs-"))
    return _log_dir_path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path, n=60):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(lines[-n:])


class Server:
    """A running `specdec serve`: .url, .proc, .log_path, .stop(); get/post are `requests` calls."""

    def __init__(self, proc, port, log_path, cmd):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cmd = cmd
        self.http = requests.Session()
        self.http.trust_env = False

    def get(self, path, **kw):
        kw.setdefault("timeout", HTTP_TIMEOUT_S)
        return self.http.get(self.url + path, **kw)

    def post(self, path, json=None, **kw):
        kw.setdefault("timeout", HTTP_TIMEOUT_S)
        return self.http.post(self.url + path, json=json, **kw)

    def options(self, path, **kw):
        kw.setdefault("timeout", HTTP_TIMEOUT_S)
        return self.http.options(self.url + path, **kw)

    def log_text(self):
        return Path(self.log_path).read_text(errors="replace")

    def log_tail(self, n=60):
        return _tail(self.log_path, n)

    def describe(self):
        return f"server {' '.join(self.cmd)}\n--- log tail ({self.log_path}) ---\n{self.log_tail()}"

    def assert_healthy(self, after=""):
        assert self.proc.poll() is None, f"the server exited ({self.proc.returncode}) {after}\n{self.describe()}"
        r = self.get("/health", timeout=10)
        assert r.status_code == 200, f"GET /health gave {r.status_code} {r.text!r} {after}\n{self.describe()}"

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM, then asserts the process exits with status 0 within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not exit within {timeout} s of SIGTERM\n{self.describe()}")
        assert rc == 0, f"the server exited with status {rc} after SIGTERM (expected 0)\n{self.describe()}"


def start_server(*extra_args, env=None, timeout=HEALTH_TIMEOUT_S, model=MODEL):
    """Starts `specdec serve` on a free port of 127.0.0.1 and waits until GET /health is 200.

    extra_args override DEFAULT_ARGS flag by flag (e.g. "--max-batch", "1")."""
    extra = [str(a) for a in extra_args]
    port = free_port()
    cmd = [SPECDEC, "serve", "--model", str(model), "--port", str(port)]
    for flag, value in DEFAULT_ARGS.items():
        if flag not in extra:
            cmd += [flag, value]
    cmd += extra
    log_path = _log_dir() / f"serve-{port}.log"
    full_env = dict(os.environ)
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
    server = Server(proc, port, log_path, cmd)
    _servers.append(server)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with status {proc.returncode} before it was ready\n{server.describe()}")
        try:
            r = server.get("/health", timeout=2)
        except (requests.ConnectionError, requests.Timeout):
            r = None
        if r is not None:
            if r.status_code == 200:
                assert r.json() == {"status": "ok"}, f"GET /health 200 body {r.text!r}"
                return server
            # While the model loads the only other answer is 503 {"status": "loading"}.
            assert r.status_code == 503, f"GET /health while starting gave {r.status_code} {r.text!r}"
            assert r.json() == {"status": "loading"}, f"GET /health 503 body {r.text!r}"
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"GET /health was not 200 within {timeout} s\n{server.describe()}")
        time.sleep(0.1)


def make_client(server, api_key="unused", **kw):
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", HTTP_TIMEOUT_S)
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, **kw)


_default_server = None


@pytest.fixture(scope="session")
def server():
    """The plain target-only server most tests share."""
    global _default_server
    s = start_server()
    _default_server = s
    yield s
    _default_server = None
    s.stop()


@pytest.fixture(scope="session")
def lookup_server():
    # Constant K: goodput, the greedy default, may judge drafting not worth it on a slow machine.
    s = start_server("--prompt-lookup", "4", "--schedule", "constant")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def draft_server():
    """A server whose draft model is the target itself (every drafted token is accepted)."""
    # Constant K: goodput, the greedy default, sees a draft as costly as the target never pay.
    s = start_server("--draft", MODEL, "--schedule", "constant", "--num-assistant-tokens", "3")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def key_server():
    s = start_server("--api-key", "sekret")
    yield s
    s.stop()


@pytest.fixture
def client(server):
    return make_client(server)


# ---------------------------------------------------------------------------------------------
# The oracle: `specdec generate --json` in a process of its own.

_oracle_cache = {}


def _generate(prompt_args, max_new_tokens, extra=(), model=MODEL):
    cmd = [SPECDEC, "generate", "--model", str(model), *prompt_args, "--max-new-tokens", str(max_new_tokens),
           *extra, "--json"]
    key = tuple(cmd)
    if key not in _oracle_cache:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"oracle {cmd} failed with status {r.returncode}:\n{r.stderr[-3000:]}"
        lines = [l for l in r.stdout.splitlines() if l.strip()]
        assert lines, f"oracle {cmd} printed nothing; stderr:\n{r.stderr[-3000:]}"
        out = json.loads(lines[-1])
        assert "tokens" in out and "text" in out, f"oracle output lacks tokens/text: {out}"
        _oracle_cache[key] = out
    return _oracle_cache[key]


def oracle(prompt_text, max_new_tokens, *extra, model=MODEL):
    """`specdec generate --prompt TEXT --max-new-tokens N --json`: {"tokens": [...], "text": ..., "stats": ...}."""
    return _generate(["--prompt", prompt_text], max_new_tokens, extra, model)


def oracle_ids(ids, max_new_tokens, *extra):
    return _generate(["--prompt-ids", ",".join(str(int(i)) for i in ids)], max_new_tokens, extra)


def oracle_chat(messages, max_new_tokens, server=None):
    """The greedy answer to a conversation: its prompt ids from the server's POST /tokenize
    {"messages": ...}, generated by `specdec generate --prompt-ids`."""
    s = server or _default_server
    assert s is not None, "oracle_chat needs a server (give server=, or use the `server` fixture)"
    return oracle_ids(tokenize(s, messages=messages), max_new_tokens)


def oracle_stopped_by_length(out):
    return out.get("stats", {}).get("stop_reason") == "max_new_tokens"


# ---------------------------------------------------------------------------------------------
# Small clients of the server's own routes.


def tokenize(server, content=None, messages=None, **extra):
    body = dict({"content": content} if messages is None else {"messages": messages}, **extra)
    r = server.post("/tokenize", json=body)
    assert r.status_code == 200, f"POST /tokenize {body} gave {r.status_code} {r.text[:500]}"
    toks = r.json()["tokens"]
    assert isinstance(toks, list) and all(isinstance(t, int) for t in toks), f"/tokenize tokens: {toks!r}"
    return toks


def detokenize(server, tokens):
    r = server.post("/detokenize", json={"tokens": list(tokens)})
    assert r.status_code == 200, f"POST /detokenize gave {r.status_code} {r.text[:500]}"
    content = r.json()["content"]
    assert isinstance(content, str)
    return content


def complete(server, **body):
    """POST /v1/completions with `body` (model filled in); asserts 200, returns the JSON."""
    body.setdefault("model", MODEL_ID)
    r = server.post("/v1/completions", json=body)
    assert r.status_code == 200, f"POST /v1/completions {body} gave {r.status_code} {r.text[:1000]}"
    return r.json()


def chat(server, **body):
    body.setdefault("model", MODEL_ID)
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, f"POST /v1/chat/completions {body} gave {r.status_code} {r.text[:1000]}"
    return r.json()


class Metrics:
    """GET /metrics parsed by prometheus_client."""

    def __init__(self, text):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def family(self, name):
        assert name in self.families, f"/metrics has no family {name!r}; it has {sorted(self.families)}"
        return self.families[name]

    def value(self, family, sample, **labels):
        """The sum of `sample` values (in `family`) whose labels include `labels`; 0 if none."""
        f = self.family(family)
        return sum(s.value for s in f.samples
                   if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))

    def samples(self, family, sample):
        return [s for s in self.family(family).samples if s.name == sample]


def wait_for(pred, timeout=5.0):
    """Polls `pred` until it returns a true value or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def metrics(server):
    r = server.get("/metrics")
    assert r.status_code == 200, f"GET /metrics gave {r.status_code} {r.text[:300]}"
    assert r.headers.get("Content-Type", "").startswith("text/plain"), \
        f"GET /metrics Content-Type {r.headers.get('Content-Type')!r}"
    return Metrics(r.text)


# ---------------------------------------------------------------------------------------------
# Server-sent events, read raw.


class SSEFramingError(AssertionError):
    pass


def read_sse(resp):
    """Reads a `requests` response opened with stream=True to its end; checks the framing (every
    event one `data: ` line and a blank line, the last `data: [DONE]`, nothing after it) and returns
    the parsed JSON chunks, in order, without [DONE]."""
    assert resp.status_code == 200, f"streaming request gave {resp.status_code} {resp.text[:500]}"
    ctype = resp.headers.get("Content-Type", "")
    assert ctype.startswith("text/event-stream"), f"stream Content-Type {ctype!r}"
    # A proxy neither caches nor buffers it (nginx reads X-Accel-Buffering).
    assert resp.headers.get("Cache-Control") == "no-cache", resp.headers
    assert resp.headers.get("X-Accel-Buffering") == "no", resp.headers
    buf = b""
    for piece in resp.iter_content(chunk_size=None):
        buf += piece
    return parse_sse_bytes(buf)


def parse_sse_bytes(buf):
    if not buf.endswith(b"\n\n"):
        raise SSEFramingError(f"the stream does not end with a blank line: ...{buf[-200:]!r}")
    events = buf[:-2].split(b"\n\n")
    chunks = []
    for i, ev in enumerate(events):
        if b"\n" in ev or not ev.startswith(b"data: "):
            raise SSEFramingError(f"event {i} is not one `data: ` line: {ev[:300]!r}")
        payload = ev[len(b"data: "):]
        if payload == b"[DONE]":
            if i != len(events) - 1:
                raise SSEFramingError(f"data: [DONE] is event {i} of {len(events)}, not the last")
            return chunks
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SSEFramingError(f"event {i} is not valid UTF-8 ({e}): {payload[:300]!r}")
        try:
            chunks.append(json.loads(text))
        except json.JSONDecodeError as e:
            raise SSEFramingError(f"event {i} is not JSON ({e}): {text[:300]!r}")
    raise SSEFramingError(f"the stream has no data: [DONE] (last event {events[-1][:200]!r})")


def stream_post(server, path, body, timeout=HTTP_TIMEOUT_S):
    body = dict(body, stream=True)
    body.setdefault("model", MODEL_ID)
    return server.http.post(server.url + path, json=body, stream=True, timeout=timeout)


def chunk_text(chunk):
    """The text a completion or chat chunk adds ("" for none)."""
    if not chunk.get("choices"):
        return ""
    c = chunk["choices"][0]
    if chunk.get("object") == "chat.completion.chunk":
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


# ---------------------------------------------------------------------------------------------


def stop_across_boundary(server, tokens, text):
    """A 4-character stop string that straddles a token boundary of `text` (whose ids are `tokens`),
    printable ASCII, and the text before its first occurrence: (stop, expected_text)."""
    fallback = None
    n = len(tokens)
    for i in sorted(range(2, n - 1), key=lambda i: abs(i - n // 2)):
        prefix = detokenize(server, tokens[:i])
        b = len(prefix)
        if not text.startswith(prefix) or b < 3 or len(text) - b < 2:
            continue
        stop = text[b - 2:b + 2]
        if not stop.isascii() or not stop.isprintable() or not stop.strip():
            continue
        first = text.find(stop)
        if first <= 0:
            continue
        if first == b - 2:
            return stop, text[:first]
        fallback = fallback or (stop, text[:first])
    assert fallback, f"no usable stop string in {text!r}"
    return fallback
