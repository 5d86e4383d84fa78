"""`specdec serve`: the OpenAI-compatible routes, answers equal to `specdec generate`, metrics, logs."""

import datetime
import json
import os
import re
import select
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import subprocess
import time

import openai
import pytest

from conftest import (MODEL, MODEL_ID, REPO, SPECDEC, chat, complete, detokenize, gemma_model, make_client,
                      metrics, oracle,
                      oracle_chat, oracle_ids, oracle_stopped_by_length, read_sse, start_server,
                      stop_across_boundary, stream_post, chunk_text, tokenize, wait_for)

STORY = "Once upon a time, in a small village by the sea, there lived"
COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
SPEC_KEYS = {"drafted_tokens", "accepted_tokens", "acceptance_rate", "target_passes", "tokens_per_target_pass"}


def expected_finish(out):
    return "length" if oracle_stopped_by_length(out) else "stop"


def check_usage(j, prompt_tokens=None):
    u = j.get("usage")
    assert isinstance(u, dict), f"no usage in {j}"
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(u.get(k), int), f"usage.{k} is not an int: {u}"
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage totals: {u}"
    assert isinstance(u.get("prompt_tokens_details", {}).get("cached_tokens"), int), \
        f"usage.prompt_tokens_details.cached_tokens missing: {u}"
    assert 0 <= u["prompt_tokens_details"]["cached_tokens"] <= u["prompt_tokens"], f"cached_tokens: {u}"
    if prompt_tokens is not None:
        assert u["prompt_tokens"] == prompt_tokens, f"usage.prompt_tokens {u['prompt_tokens']} != {prompt_tokens}"


def check_speculative(j):
    s = j.get("speculative")
    assert isinstance(s, dict), f"no speculative object in {j}"
    assert SPEC_KEYS <= set(s), f"speculative lacks {SPEC_KEYS - set(s)}: {s}"
    assert 0 <= s["accepted_tokens"] <= s["drafted_tokens"], f"speculative counts: {s}"
    assert 0.0 <= s["acceptance_rate"] <= 1.0, f"acceptance_rate: {s}"
    assert s["target_passes"] >= 1 and s["tokens_per_target_pass"] > 0, f"speculative passes: {s}"
    return s


def check_completion(j, n_prompt=None):
    assert j["object"] == "text_completion", j
    assert isinstance(j["id"], str) and j["id"].startswith("cmpl-"), f"id {j['id']!r}"
    assert isinstance(j["created"], int) and j["created"] > 1_600_000_000, f"created {j['created']!r}"
    assert j["model"] == MODEL_ID, f"model {j['model']!r} != {MODEL_ID!r}"
    assert len(j["choices"]) == 1, j["choices"]
    c = j["choices"][0]
    assert c["index"] == 0 and isinstance(c["text"], str), c
    assert c["finish_reason"] in ("stop", "length"), c
    assert "logprobs" in c, f"choices[0] has no logprobs key (null when not asked): {c}"
    check_usage(j, n_prompt)
    check_speculative(j)
    return c


def check_chat(j):
    assert j["object"] == "chat.completion", j
    assert isinstance(j["id"], str) and j["id"].startswith("chatcmpl-"), f"id {j['id']!r}"
    assert isinstance(j["created"], int) and j["model"] == MODEL_ID, j
    assert len(j["choices"]) == 1, j["choices"]
    c = j["choices"][0]
    assert c["index"] == 0 and c["message"]["role"] == "assistant", c
    assert isinstance(c["message"]["content"], str), c
    assert c["finish_reason"] in ("stop", "length"), c
    check_usage(j)
    check_speculative(j)
    return c


# ---------------------------------------------------------------------------------------------


def test_health(server):
    r = server.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}, f"{r.status_code} {r.text}"


def test_connections_arriving_while_the_server_cannot_accept_all_complete(server):
    """Clients that connect at once while the server's threads are busy (the engine keeps every core
    computing) wait in the kernel's accept queue: a queue of 5 (httplib's default) dropped the rest,
    whose connections then waited a second for TCP to send their SYN again. Stopped, the server
    accepts nothing; all 32 handshakes must still complete at once."""
    socks = []
    server.proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(32):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))
            socks.append(s)
        pending, deadline = set(socks), time.monotonic() + 0.5
        while pending and time.monotonic() < deadline:
            _, ready, _ = select.select([], list(pending), [], max(0.0, deadline - time.monotonic()))
            pending -= set(ready)
        assert not pending, f"{len(pending)} of 32 connections not established within 0.5 s"
    finally:
        server.proc.send_signal(signal.SIGCONT)
        for s in socks:
            s.close()
    server.assert_healthy("after the burst of connections")
    assert server.get("/health").status_code == 200


def test_models(server, client):
    r = server.get("/v1/models")
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["object"] == "list" and len(j["data"]) == 1, j
    m = j["data"][0]
    assert m["id"] == MODEL_ID and m["object"] == "model" and m["owned_by"] == "specdec", m
    assert isinstance(m["created"], int), m
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL_ID], f"openai client lists {ids}"


def test_completion_greedy_equals_oracle(server, client):
    want = oracle(STORY, 24)
    j = complete(server, prompt=STORY, max_tokens=24, temperature=0)
    c = check_completion(j, n_prompt=len(tokenize(server, STORY)))
    assert c["text"] == want["text"], f"server {c['text']!r}\noracle {want['text']!r}"
    assert c["finish_reason"] == expected_finish(want), (c["finish_reason"], want["stats"])
    assert c["logprobs"] is None, c["logprobs"]
    if c["finish_reason"] == "length":
        assert j["usage"]["completion_tokens"] == 24, j["usage"]
    s = j["speculative"]
    assert s["drafted_tokens"] == 0 and s["accepted_tokens"] == 0, f"target-only server drafted: {s}"
    # The official client, the same request.
    r = client.completions.create(model=MODEL_ID, prompt=STORY, max_tokens=24, temperature=0)
    assert r.choices[0].text == want["text"] and r.choices[0].finish_reason == c["finish_reason"]
    assert r.usage.completion_tokens == j["usage"]["completion_tokens"]


def test_completion_token_id_prompt(server):
    ids = tokenize(server, COUNT)
    want = oracle_ids(ids, 16)
    assert want["text"] == oracle(COUNT, 16)["text"], "tokenize disagrees with generate --prompt"
    j = complete(server, prompt=ids, max_tokens=16, temperature=0)
    c = check_completion(j, n_prompt=len(ids))
    assert c["text"] == want["text"], f"server {c['text']!r}\noracle {want['text']!r}"


def test_completion_one_element_lists(server):
    ids = tokenize(server, COUNT)
    base = complete(server, prompt=COUNT, max_tokens=8, temperature=0)["choices"][0]["text"]
    for prompt in ([COUNT], [ids]):
        got = complete(server, prompt=prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert got == base, f"prompt {str(prompt)[:60]}: {got!r} != {base!r}"


def test_completion_defaults(server):
    # No model (the server's own), no max_tokens (16).
    r = server.post("/v1/completions", json={"prompt": COUNT, "temperature": 0})
    assert r.status_code == 200, r.text
    j = r.json()
    c = check_completion(j)
    assert c["finish_reason"] == "length", f"counting stopped early: {c}"
    assert j["usage"]["completion_tokens"] == 16, f"default max_tokens is 16: {j['usage']}"
    assert c["text"] == oracle(COUNT, 16)["text"]


def test_tokenize_matches_cli(server):
    text = "Hello, world! Café au lait costs 3 euros."
    r = subprocess.run([SPECDEC, "tokenize", "--tokenizer", MODEL, "--text", text, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tokenize(server, text) == json.loads(r.stdout)["ids"]


def test_tokenize_options(server):
    # llama-server's with_pieces: each id with its text; vLLM's "prompt" and add_special_tokens;
    # add_generation_prompt false leaves the answer's header out of a chat prompt.
    text = "Hello, world! Café au lait."
    ids = tokenize(server, text)
    r = server.post("/tokenize", json={"prompt": text, "with_pieces": True, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    pieces = r.json()["tokens"]
    assert [p["id"] for p in pieces] == ids, pieces
    assert "".join(p["piece"] for p in pieces) == text, pieces  # byte-level BPE: whole characters here
    full = tokenize(server, messages=CAPITAL)
    r = server.post("/tokenize", json={"messages": CAPITAL, "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    bare = r.json()["tokens"]
    assert len(bare) < len(full) and full[:len(bare)] == bare, (bare, full)
    assert detokenize(server, full[len(bare):]) == "<|im_start|>assistant\n"


def test_ignore_eos_stop_token_ids_and_special_tokens(server):
    # vLLM's ignore_eos: the answer runs to max_tokens past the end of turn, which it then shows
    # with skip_special_tokens false; stop_token_ids ends it at the first of those ids.
    base = dict(messages=CAPITAL, max_tokens=40, temperature=0)
    short = chat(server, **base)
    n = short["usage"]["completion_tokens"]
    assert short["choices"][0]["finish_reason"] == "stop" and n < 40, short
    long = chat(server, **base, ignore_eos=True, skip_special_tokens=False)
    assert long["usage"]["completion_tokens"] == 40 and long["choices"][0]["finish_reason"] == "length", long
    content = long["choices"][0]["message"]["content"]
    assert content.startswith(short["choices"][0]["message"]["content"] + "<|im_end|>"), (content, short)
    hidden = chat(server, **base, ignore_eos=True)["choices"][0]["message"]["content"]
    assert "<|im_end|>" not in hidden and hidden.startswith(short["choices"][0]["message"]["content"]), hidden
    # The stop token's text is left out, as vLLM leaves it, unless include_stop_str_in_output.
    out = oracle(STORY, 12)
    i = next(i for i in range(3, 12) if out["tokens"][i] not in out["tokens"][:i])
    for include in (False, True):
        got = complete(server, prompt=STORY, max_tokens=12, temperature=0, stop_token_ids=[out["tokens"][i]],
                       include_stop_str_in_output=include)
        assert got["usage"]["completion_tokens"] == i + 1 and got["choices"][0]["finish_reason"] == "stop", got
        kept = i + 1 if include else i
        assert got["choices"][0]["text"] == detokenize(server, out["tokens"][:kept]), (include, got)


def test_min_tokens(server):
    # vLLM's min_tokens (Hugging Face's min_new_tokens): no end of turn before that many tokens.
    base = dict(messages=CAPITAL, max_tokens=40, temperature=0)
    short = chat(server, **base)
    n = short["usage"]["completion_tokens"]
    assert n < 30 and short["choices"][0]["finish_reason"] == "stop", short
    got = chat(server, **base, min_tokens=n + 5)
    assert got["usage"]["completion_tokens"] >= n + 5, (n, got)
    content = got["choices"][0]["message"]["content"]
    assert content.startswith(short["choices"][0]["message"]["content"]) and len(content) > len(
        short["choices"][0]["message"]["content"]), (short, got)


def test_min_tokens_defers_stop_strings(server):
    # vLLM's rule: a stop string that ends in the text of the first min_tokens tokens is not a stop;
    # the first one that ends past it is, even if it begins in that text.
    out = oracle(STORY, 24)
    full = detokenize(server, out["tokens"])
    assert oracle_stopped_by_length(out) and full.isascii(), out
    m = 8
    boundary = len(detokenize(server, out["tokens"][:m]))
    letter = next(c for c in "etaoinsrhl" if c in full[:boundary] and c in full[boundary:])
    for stop in (letter, full[boundary - 2:boundary + 2]):
        first = full.find(stop)
        at = full.find(stop, max(0, boundary - len(stop) + 1))
        got = complete(server, prompt=STORY, max_tokens=24, temperature=0, stop=[stop], min_tokens=m)
        assert got["choices"][0]["text"] == full[:at] and got["choices"][0]["finish_reason"] == "stop", (stop, got)
        if first + len(stop) <= boundary:  # without min_tokens the earlier one stops it
            early = complete(server, prompt=STORY, max_tokens=24, temperature=0, stop=[stop])
            assert early["choices"][0]["text"] == full[:first], (stop, early)


def test_include_stop_str_in_output(server):
    full = complete(server, prompt=STORY, max_tokens=24, temperature=0)["choices"][0]["text"]
    words = full.split()
    stop = " " + words[len(words) // 2]
    got = complete(server, prompt=STORY, max_tokens=24, temperature=0, stop=stop, include_stop_str_in_output=True)
    assert got["choices"][0]["text"] == full[:full.find(stop) + len(stop)], (stop, got, full)
    assert got["choices"][0]["finish_reason"] == "stop", got


def test_text_offset_counts_only_the_characters_shown(server):
    # Hidden special tokens (skip_special_tokens, the default) take no characters of the text.
    got = complete(server, prompt=STORY, max_tokens=4, temperature=0, logprobs=1, ignore_eos=True,
                   logit_bias={"0": 100})
    c = got["choices"][0]
    assert c["text"] == "" and c["logprobs"]["text_offset"] == [0, 0, 0, 0], c
    shown = complete(server, prompt=STORY, max_tokens=4, temperature=0, logprobs=1, ignore_eos=True,
                     logit_bias={"0": 100}, skip_special_tokens=False)["choices"][0]
    special = shown["logprobs"]["tokens"][0]
    assert shown["text"] == special * 4, shown
    assert shown["logprobs"]["text_offset"] == [i * len(special) for i in range(4)], shown


def test_continue_final_message(server):
    # vLLM's (and Hugging Face's) continue_final_message: the answer goes on from the assistant's
    # last message, as a completion of that prompt's ids does.
    start = "The capital of France is"
    msgs = CAPITAL + [{"role": "assistant", "content": start}]
    r = server.post("/tokenize", json={"messages": msgs, "continue_final_message": True,
                                       "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert detokenize(server, ids).endswith("<|im_start|>assistant\n" + start), detokenize(server, ids)
    got = chat(server, messages=msgs, continue_final_message=True, add_generation_prompt=False,
               max_tokens=8, temperature=0)
    want = complete(server, prompt=ids, max_tokens=8, temperature=0)
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["text"], (got, want)


def test_continue_final_message_with_a_template_that_trims():
    # Gemma's template trims each message: the continued message is cut where its rendering ends,
    # not at an earlier occurrence of its text (Hugging Face's own rindex would find "Hi " in the
    # user's message).
    s = start_server("--chat-template", "gemma")
    try:
        msgs = [{"role": "user", "content": "Say Hi now"}, {"role": "assistant", "content": "Hi "}]
        r = s.post("/tokenize", json={"messages": msgs, "continue_final_message": True,
                                      "add_generation_prompt": False})
        assert r.status_code == 200, r.text
        text = detokenize(s, r.json()["tokens"])
        assert text.endswith("<start_of_turn>user\nSay Hi now<end_of_turn>\n<start_of_turn>model\nHi"), text
    finally:
        s.stop()


def test_add_special_tokens_on_the_generation_routes():
    # Gemma's tokenizer adds a BOS (SmolLM2's adds none): a completion's prompt gets it unless
    # add_special_tokens is false, and a chat prompt, whose template writes its own, only if true.
    gemma = gemma_model()
    s = start_server("--chat-template", "gemma", model=gemma)
    try:
        text = "Hello there, friend"
        with_bos = tokenize(s, text)
        assert with_bos[0] == 2 and tokenize(s, text, add_special_tokens=False) == with_bos[1:], with_bos
        counts = [complete(s, model="", prompt=text, max_tokens=1, temperature=0, **extra)["usage"]["prompt_tokens"]
                  for extra in ({}, {"add_special_tokens": True}, {"add_special_tokens": False})]
        assert counts == [len(with_bos)] * 2 + [len(with_bos) - 1], counts
        rendered = len(tokenize(s, messages=CAPITAL))
        counts = [chat(s, model="", messages=CAPITAL, max_tokens=1, temperature=0, **extra)["usage"]["prompt_tokens"]
                  for extra in ({}, {"add_special_tokens": False}, {"add_special_tokens": True})]
        assert counts == [rendered] * 2 + [rendered + 1], counts
    finally:
        s.stop()


def test_gemma_chat_text_parts_as_its_template_renders_them():
    # Gemma 3's template renders each text part trimmed, one after the other, and a system
    # message's first part only (Hugging Face's apply_chat_template with it gives the same).
    s = start_server("--chat-template", "gemma", model=gemma_model())
    try:
        def parts(*texts):
            return [{"type": "text", "text": t} for t in texts]
        got = tokenize(s, messages=[{"role": "system", "content": parts("Be brief.", "dropped")},
                                    {"role": "user", "content": parts(" part one ", "part two\n")}])
        assert got == tokenize(s, messages=[{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "part onepart two"}])
    finally:
        s.stop()


def test_n_predict_is_max_tokens(server):
    # llama-server's name, where neither max_tokens nor max_completion_tokens is given
    base = dict(prompt=STORY, temperature=0, ignore_eos=True)
    assert complete(server, **base, n_predict=3)["usage"]["completion_tokens"] == 3
    assert complete(server, **base, n_predict=5, max_tokens=2)["usage"]["completion_tokens"] == 2
    # -1: the rest of the context (a small one here)
    s = start_server("--ctx", "64")
    try:
        u = complete(s, **base, n_predict=-1)["usage"]
        assert u["completion_tokens"] == 64 - u["prompt_tokens"], u
    finally:
        s.stop()


def test_ids_are_random_and_token_ids_may_be_integral_floats(server):
    a, b = (complete(server, prompt=[1, 2, 3], max_tokens=2, temperature=0) for _ in range(2))
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", a["id"]) and a["id"] != b["id"], (a["id"], b["id"])
    c = complete(server, prompt=[1.0, 2.0, 3.0], max_tokens=2, temperature=0)
    assert c["choices"][0]["text"] == a["choices"][0]["text"], (a, c)


def test_detokenize(server):
    out = oracle(STORY, 12)
    toks = [t for t in out["tokens"]]
    if not oracle_stopped_by_length(out):
        toks = toks[:-1]  # the end-of-sequence token
    assert detokenize(server, toks) == out["text"]
    assert detokenize(server, []) == ""


def test_chat_greedy_equals_oracle(server, client):
    want = oracle_chat(CAPITAL, 24, server)
    j = chat(server, messages=CAPITAL, max_tokens=24, temperature=0)
    c = check_chat(j)
    assert c["message"]["content"] == want["text"], f"server {c['message']['content']!r}\noracle {want['text']!r}"
    assert c["finish_reason"] == expected_finish(want), (c, want["stats"])
    assert j["usage"]["prompt_tokens"] == len(tokenize(server, messages=CAPITAL)), j["usage"]
    assert c.get("logprobs") is None, c
    r = client.chat.completions.create(model=MODEL_ID, messages=CAPITAL, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want["text"] and r.choices[0].message.role == "assistant"


def test_chat_template_equals_generate_chat(server):
    # One user turn and no system message: the template's own default, as `generate --chat` renders it.
    question = "Name a fruit that is yellow."
    r = subprocess.run([SPECDEC, "generate", "--model", MODEL, "--chat", "--prompt", question,
                        "--max-new-tokens", "16", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    want = json.loads(r.stdout.strip().splitlines()[-1])["text"]
    got = chat(server, messages=[{"role": "user", "content": question}], max_tokens=16,
               temperature=0)["choices"][0]["message"]["content"]
    assert got == want, f"server {got!r}\ngenerate --chat {want!r}"


def test_chat_system_and_max_completion_tokens(server):
    msgs = [{"role": "system", "content": "You are a terse assistant."}] + CAPITAL
    a = chat(server, messages=msgs, max_completion_tokens=5, temperature=0)
    b = chat(server, messages=msgs, max_tokens=5, temperature=0)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["completion_tokens"] <= 5, a["usage"]
    assert a["choices"][0]["message"]["content"] == oracle_chat(msgs, 5, server)["text"]
    # a completion takes the chat API's name too (it was ignored: 16 tokens came)
    c = complete(server, prompt=STORY, max_completion_tokens=3, ignore_eos=True)
    assert c["usage"]["completion_tokens"] == 3, c["usage"]


def test_stream_completion_equals_nonstream(server, client):
    full = complete(server, prompt=STORY, max_tokens=24, temperature=0)
    stream = client.completions.create(model=MODEL_ID, prompt=STORY, max_tokens=24, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks, "no chunks"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, f"last chunk is not the usage one: {chunks[-1]}"
    content = [c for c in chunks if c.choices]
    assert all(c.object == "text_completion" for c in content), {c.object for c in content}
    text = "".join(c.choices[0].text for c in content)
    assert text == full["choices"][0]["text"], f"stream {text!r}\nwhole {full['choices'][0]['text']!r}"
    assert content[-1].choices[0].finish_reason == full["choices"][0]["finish_reason"]
    assert all(c.choices[0].finish_reason is None for c in content[:-1]), "finish_reason before the last chunk"
    assert chunks[-1].usage.completion_tokens == full["usage"]["completion_tokens"]
    assert chunks[-1].usage.prompt_tokens == full["usage"]["prompt_tokens"]


def test_stream_chat_equals_nonstream(server, client):
    full = chat(server, messages=CAPITAL, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=CAPITAL, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert content and content[0].choices[0].delta.role == "assistant", f"first chunk: {content[:1]}"
    assert all(c.object == "chat.completion.chunk" for c in chunks), {c.object for c in chunks}
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-"), {c.id for c in chunks}
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text == full["choices"][0]["message"]["content"], f"stream {text!r}\nwhole {full['choices'][0]}"
    assert content[-1].choices[0].finish_reason == full["choices"][0]["finish_reason"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full["usage"]["completion_tokens"]
    # Without include_usage there is no usage chunk.
    plain = list(client.chat.completions.create(model=MODEL_ID, messages=CAPITAL, max_tokens=4, temperature=0,
                                                stream=True))
    assert all(c.choices for c in plain), "a chunk without choices though include_usage was not asked"


def test_stop_across_token_boundary(server, client):
    out = oracle(STORY, 32)
    assert oracle_stopped_by_length(out), f"the story ended early: {out['text']!r}"
    text = out["text"]
    stop, expected = stop_across_boundary(server, out["tokens"], text)
    j = complete(server, prompt=STORY, max_tokens=32, temperature=0, stop=stop)
    c = j["choices"][0]
    assert c["text"] == expected, f"stop {stop!r}: {c['text']!r} != {expected!r} (full {text!r})"
    assert c["finish_reason"] == "stop", c
    # The same, streamed, with the stop in a list of sixteen (the most a request takes; OpenAI's 4).
    others = [f"@@{i}@@" for i in range(15)]
    chunks = list(client.completions.create(model=MODEL_ID, prompt=STORY, max_tokens=32, temperature=0,
                                            stream=True, stop=others[:7] + [stop] + others[7:]))
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == expected, f"stream with stop {stop!r}: {streamed!r} != {expected!r}"
    assert [ch for ch in chunks if ch.choices][-1].choices[0].finish_reason == "stop"


def test_whitespace_stop_ends_at_its_token(server, client):
    # A stop string of whitespace, whose text the stream decoder holds back until a later token
    # shows it is final: the token that completed it still ends the answer, its count and logprobs.
    prompt = "The capital of France is"
    out = oracle(prompt, 8)
    i = next(i for i, t in enumerate(out["tokens"]) if "\n" in detokenize(server, [t]))
    before = detokenize(server, out["tokens"][:i + 1]).split("\n")[0]
    for max_tokens in (i + 1, 8):
        j = complete(server, prompt=prompt, max_tokens=max_tokens, temperature=0, stop=["\n"], logprobs=0)
        c = j["choices"][0]
        assert c["text"] == before and c["finish_reason"] == "stop", (max_tokens, j)
        assert j["usage"]["completion_tokens"] == i + 1 and len(c["logprobs"]["tokens"]) == i + 1, j
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0,
                                            stream=True, stop=["\n"], stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == before
    assert chunks[-1].usage.completion_tokens == i + 1, chunks[-1]


def test_stop_earliest_wins_and_absent(server):
    text = oracle(STORY, 32)["text"]
    words = [w for w in text.split() if w.isalpha() and len(w) >= 3]
    assert len(words) >= 2, text
    a, b = words[0], words[-1]
    first = min(text.find(a), text.find(b))
    c = complete(server, prompt=STORY, max_tokens=32, temperature=0, stop=[b, a])["choices"][0]
    assert c["text"] == text[:first] and c["finish_reason"] == "stop", (a, b, c)
    c = complete(server, prompt=STORY, max_tokens=32, temperature=0, stop=["<never-there>"])["choices"][0]
    assert c["text"] == text and c["finish_reason"] == "length", c


def test_a_stop_string_with_u_fffd_does_not_match_a_character_still_to_come(server):
    # Multi-byte characters come in byte tokens: until the last one, the decoder's pending text ends
    # in U+FFFD. A stop string holding U+FFFD must not match it (the answer was cut to nothing).
    msgs = [{"role": "user", "content": "Translate to Chinese: I love my little cat and my big dog."}]
    full = chat(server, messages=msgs, max_tokens=24, temperature=0)["choices"][0]
    text = full["message"]["content"]
    assert any(ord(ch) > 0x2E80 for ch in text) and "\ufffd" not in text[:-1], text  # CJK, whole
    for stream in (False, True):
        body = dict(messages=msgs, max_tokens=24, temperature=0, stop=["\ufffd"])
        if stream:
            got = "".join(map(chunk_text, read_sse(stream_post(server, "/v1/chat/completions", body))))
        else:
            got = chat(server, **body)["choices"][0]["message"]["content"]
        # (A character the length limit cuts ends the answer as U+FFFD: the stop string ends it there.)
        assert got == text.rstrip("\ufffd"), (stream, got, text)


def test_chat_stop(server):
    full = oracle_chat(CAPITAL, 24, server)["text"]
    words = [w for w in full.split() if w.isalpha() and len(w) >= 4]
    assert words, full
    stop = words[len(words) // 2]
    c = chat(server, messages=CAPITAL, max_tokens=24, temperature=0, stop=stop)["choices"][0]
    assert c["message"]["content"] == full[:full.find(stop)] and c["finish_reason"] == "stop", (stop, c, full)


def test_a_stop_string_ends_the_answer_at_its_token_whatever_one_pass_verified_after_it(server):
    # Suffix speculation proposes the whole answer again from the first request, so one pass
    # verifies a stop string and the tokens after it. The answer ends at the token that completed
    # the first stop string to complete, with that many tokens and logprobs: the answer without
    # speculation, which sees the tokens one by one.
    base = dict(prompt=STORY, max_tokens=32, temperature=0)
    text = complete(server, **base, speculate="suffix")["choices"][0]["text"]  # remembered
    words = text.split()
    # b: a word past the first few whose " b" occurs once; a and c beside it
    i = next((i for i in range(3, len(words) - 1) if text.count(" " + words[i]) == 1), None)
    assert i is not None, text
    a, b, c = words[i - 1:i + 2]
    # One stop; and two where the later-starting one completes first.
    for stop in (" " + b, [f"{a} {b} {c}", b]):
        body = dict(base, stop=stop, logprobs=0)
        want = complete(server, **body)
        got = complete(server, **body, speculate="suffix", num_assistant_tokens_schedule="constant")
        assert got["speculative"]["accepted_tokens"] > 0, got["speculative"]
        w, g = want["choices"][0], got["choices"][0]
        assert g["text"] == w["text"] and g["finish_reason"] == w["finish_reason"] == "stop", (stop, g, w)
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"], (stop, got["usage"], want["usage"])
        # Each pass keeps its accepted candidates and one token of the target's, up to the stop.
        spec = got["speculative"]
        assert spec["accepted_tokens"] + spec["target_passes"] == got["usage"]["completion_tokens"], (spec, got["usage"])
        assert g["logprobs"]["tokens"] == w["logprobs"]["tokens"], (stop, g["logprobs"], w["logprobs"])
        streamed = stream_post(server, "/v1/completions", dict(body, speculate="suffix"))
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines(decode_unicode=True)
                  if line.startswith("data: {")]
        assert "".join(chunk_text(ch) for ch in chunks) == w["text"], (stop, chunks)
        tokens = [t for ch in chunks if ch.get("choices") and ch["choices"][0].get("logprobs")
                  for t in ch["choices"][0]["logprobs"]["tokens"]]
        assert tokens == w["logprobs"]["tokens"], (stop, tokens)


def test_seed(server):
    def sample(seed, **kw):
        return complete(server, prompt=STORY, max_tokens=24, temperature=1.0, seed=seed, **kw)["choices"][0]["text"]

    a = sample(1234)
    assert sample(1234) == a, "same seed, different text"
    texts = {sample(s) for s in (1, 2, 3, 4)}
    assert len(texts) >= 2, f"4 seeds gave one text: {texts}"
    # temperature defaults to 1.0
    no_temp = complete(server, prompt=STORY, max_tokens=24, seed=1234)["choices"][0]["text"]
    assert no_temp == a, f"no temperature {no_temp!r} != temperature 1.0 {a!r}"


def test_sampling_knobs(server):
    body = dict(prompt=STORY, max_tokens=12, temperature=0.8, seed=7, top_p=0.9, top_k=40, min_p=0.05,
                repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.3)
    a = complete(server, **body)
    c = check_completion(a)
    assert a["usage"]["completion_tokens"] <= 12
    assert complete(server, **body)["choices"][0]["text"] == c["text"], "same seed and knobs, different text"
    chat(server, messages=CAPITAL, max_tokens=8, temperature=0.7, seed=3, top_p=0.95, top_k=20,
         num_assistant_tokens=3, num_assistant_tokens_schedule="constant")


def test_top_p_zero_keeps_the_most_likely_token(server):
    # OpenAI takes top_p 0 (configs write it with temperature 0 to mean greedy): the most likely
    # token alone is left, so a sampled answer is the greedy one, whatever the seed.
    greedy = oracle(STORY, 16)["text"]
    for seed in (1, 2):
        text = complete(server, prompt=STORY, max_tokens=16, temperature=1, top_p=0,
                        seed=seed)["choices"][0]["text"]
        assert text == greedy, (seed, text, greedy)
    assert complete(server, prompt=STORY, max_tokens=16, temperature=0, top_p=0)["choices"][0]["text"] == greedy


def test_logit_bias(server):
    # -100 bans greedy's first token (one token, whose text tokenizes back to it): another comes
    first = complete(server, prompt=STORY, max_tokens=1, temperature=0)["choices"][0]["text"]
    ids = server.post("/tokenize", json={"content": first}).json()["tokens"]
    assert len(ids) == 1, (first, ids)
    banned = complete(server, prompt=STORY, max_tokens=1, temperature=0, logit_bias={str(ids[0]): -100})
    assert banned["choices"][0]["text"] != first, (first, banned)
    # +100 forces a token at every step, greedy or sampled, in a completion or a chat
    forced = 1000
    want = server.post("/detokenize", json={"tokens": [forced] * 3}).json()["content"]
    j = complete(server, prompt=STORY, max_tokens=3, temperature=0, logit_bias={str(forced): 100})
    assert j["choices"][0]["text"] == want, (j["choices"][0]["text"], want)
    j = chat(server, messages=CAPITAL, max_tokens=3, temperature=0.9, seed=5, logit_bias={str(forced): 100})
    assert j["choices"][0]["message"]["content"] == want


def test_completion_logprobs(server):
    j = complete(server, prompt=STORY, max_tokens=6, temperature=0, logprobs=3)
    c = check_completion(j)
    lp = c["logprobs"]
    n = j["usage"]["completion_tokens"]
    assert isinstance(lp, dict) and {"tokens", "token_logprobs", "top_logprobs", "text_offset"} <= set(lp), lp
    for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert len(lp[k]) == n, f"logprobs.{k} has {len(lp[k])} entries for {n} tokens"
    assert all(isinstance(t, str) for t in lp["tokens"])
    assert "".join(lp["tokens"]) == c["text"], (lp["tokens"], c["text"])
    assert all(isinstance(x, int) for x in lp["text_offset"]) and lp["text_offset"] == sorted(lp["text_offset"])
    for chosen, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert isinstance(lpv, float) and lpv <= 0.0, lpv
        # 3 alternatives, the most probable first
        assert isinstance(top, dict) and len(top) == 3, top
        assert all(v <= 0.0 for v in top.values()) and list(top.values()) == sorted(top.values(), reverse=True), top
        # greedy: the chosen token is the most likely one
        assert abs(max(top.values()) - lpv) < 1e-3, (chosen, lpv, top)
        assert chosen in top, (chosen, top)
    # OpenAI's legacy shape always holds the sampled token's logprob ("up to logprobs+1 elements").
    for k in (0, 1):
        lp = check_completion(complete(server, prompt=STORY, max_tokens=8, temperature=1.5, seed=3,
                                       logprobs=k))["logprobs"]
        for chosen, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert top.get(chosen) == lpv and len(top) in ({1} if k == 0 else {1, 2}), (k, chosen, lpv, top)


def test_completion_text_offset_counts_characters(server):
    # OpenAI's text_offset indexes the text as a string of characters (Python's), not bytes.
    j = complete(server, prompt="Le café est très bon. Le café est très bon. Le café", max_tokens=8,
                 temperature=0, logprobs=0)
    c = check_completion(j)
    text, lp = c["text"], c["logprobs"]
    assert not text.isascii(), f"the answer has no non-ASCII character to test with; change the prompt: {text!r}"
    assert "".join(lp["tokens"]) == text, (lp["tokens"], text)
    for token, offset in zip(lp["tokens"], lp["text_offset"]):
        assert text[offset:offset + len(token)] == token, (token, offset, text, lp["text_offset"])


def test_completion_logprobs_of_tokens_that_hold_part_of_a_character(server):
    # A token holding part of an emoji is "bytes:\\xNN..." as OpenAI writes it (its U+FFFD would
    # make alternatives alike and fold them into one key); text_offset counts the characters that
    # begin before each token, streamed or not, also while a stop string's beginning is held back.
    prompt = "List: 😀 grinning, 😂 joy, 🥰 love, 😎 cool, 🤔 thinking,"
    body = dict(prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
    c = check_completion(complete(server, **body))
    text, lp = c["text"], c["logprobs"]
    pieces = [t for t in lp["tokens"] if t.startswith("bytes:")]
    assert pieces, f"no token held part of a character; change the prompt: {lp['tokens']}"
    assert all(len(top) == 3 for top in lp["top_logprobs"]), lp["top_logprobs"]
    raw = b"".join(bytes.fromhex(t[6:].replace("\\x", "")) if t.startswith("bytes:") else t.encode()
                   for t in lp["tokens"])
    assert raw.decode() == text, (raw, text)
    start = 0
    for token, offset in zip(lp["tokens"], lp["text_offset"]):
        assert offset == start, (lp["tokens"], lp["text_offset"])
        b = bytes.fromhex(token[6:].replace("\\x", "")) if token.startswith("bytes:") else token.encode()
        start += sum(1 for x in b if x & 0xC0 != 0x80)
        if not token.startswith("bytes:"):
            assert text[offset:offset + len(token)] == token, (token, offset, text)
    words = "".join(ch if ch.isalpha() else " " for ch in text).split()
    assert words, text
    stop = " " + words[0] + "@"  # never matches, but " word" is held back while it might
    streamed = stream_post(server, "/v1/completions", dict(body, stop=stop))
    offsets = [o for line in streamed.iter_lines(decode_unicode=True) if line.startswith("data: {")
               for ch in [json.loads(line[6:])] if ch["choices"] and ch["choices"][0]["logprobs"]
               for o in ch["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == lp["text_offset"], (offsets, lp["text_offset"])


def test_detokenize_keeps_special_tokens(server):
    # As Hugging Face's decode (vLLM's /detokenize) and llama-server's: /tokenize of a chat's
    # messages, detokenized, is the chat prompt with its template's tokens.
    ids = tokenize(server, messages=CAPITAL)
    text = detokenize(server, ids)
    assert "<|im_start|>" in text and CAPITAL[0]["content"] in text, text
    assert tokenize(server, text) == ids, text


def test_chat_text_parts_are_joined_by_line_breaks(server):
    # As vLLM joins them for a template that takes a string (SmolLM2's ChatML)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    assert tokenize(server, messages=parts) == tokenize(server, messages=[{"role": "user", "content": "Hi\nthere"}])
    empty_first = [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "there"}]}]
    assert tokenize(server, messages=empty_first) == tokenize(server, messages=[{"role": "user", "content": "\nthere"}])


def test_chat_logprobs(server):
    j = chat(server, messages=CAPITAL, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    c = check_chat(j)
    content = c["logprobs"]["content"]
    assert len(content) == j["usage"]["completion_tokens"], (len(content), j["usage"])
    assert "".join(e["token"] for e in content) == c["message"]["content"]
    for e in content:
        assert isinstance(e["token"], str) and isinstance(e["logprob"], float) and e["logprob"] <= 0.0, e
        assert bytes(e["bytes"]) == e["token"].encode("utf-8"), e
        assert len(e["top_logprobs"]) == 2, e
        for t in e["top_logprobs"]:
            assert {"token", "logprob", "bytes"} <= set(t) and t["logprob"] <= 0.0, t
        assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-3, f"greedy token is not the top one: {e}"
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"], e
    # A token that holds part of a character: its text shows U+FFFD, its bytes are its own.
    j = chat(server, messages=[{"role": "user", "content": "Reply with only emoji: \U0001F600\U0001F600\U0001F600"}],
             max_tokens=12, temperature=0, logprobs=True, top_logprobs=1)
    content = j["choices"][0]["logprobs"]["content"]
    joined = b"".join(bytes(e["bytes"]) for e in content)
    assert joined.decode("utf-8", errors="replace") == j["choices"][0]["message"]["content"], (joined, content)
    assert any(bytes(e["bytes"]) != e["token"].encode("utf-8") for e in content), \
        f"no token held part of a character: {content}"
    # logprobs without top_logprobs: the chosen tokens only.
    j = chat(server, messages=CAPITAL, max_tokens=3, temperature=0, logprobs=True)
    assert len(j["choices"][0]["logprobs"]["content"]) == j["usage"]["completion_tokens"]


# ---------------------------------------------------------------------------------------------
# Metrics


FAMILIES = {
    "specdec:requests": "counter",
    "specdec:prompt_tokens": "counter",
    "specdec:generation_tokens": "counter",
    "specdec:num_requests_running": "gauge",
    "specdec:num_requests_waiting": "gauge",
    "specdec:time_to_first_token_seconds": "histogram",
    "specdec:inter_token_latency_seconds": "histogram",
    "specdec:spec_decode_num_drafts": "counter",
    "specdec:spec_decode_num_draft_tokens": "counter",
    "specdec:spec_decode_num_accepted_tokens": "counter",
    "specdec:spec_decode_num_accepted_tokens_per_pos": "counter",
}


def test_a_temperature_below_1e_5_is_greedy(server):
    # As vLLM's: logits divided by 1e-38 overflow float32 (every probability NaN: it was a 500).
    for t in (1e-38, 1e-300, 9e-6):
        r = complete(server, prompt=COUNT, max_tokens=4, temperature=t)
        assert r["choices"][0]["text"] == oracle(COUNT, 4)["text"], (t, r)


def test_metrics_families(server):
    m = metrics(server)
    for name, typ in FAMILIES.items():
        assert m.family(name).type == typ, f"{name} is a {m.family(name).type}, not a {typ}"


def test_metrics_count_requests(server):
    before = metrics(server)
    results = [complete(server, prompt=p, max_tokens=8, temperature=0) for p in (STORY, COUNT)]
    results.append(chat(server, messages=CAPITAL, max_tokens=8, temperature=0))
    # A response is complete when its last token is sent; the engine retires its row at the end of
    # that step, so the gauge may still count it for a moment (seen on a loaded 2-core machine).
    after = metrics(server)
    for _ in range(50):
        if after.value("specdec:num_requests_running", "specdec:num_requests_running") == 0:
            break
        time.sleep(0.05)
        after = metrics(server)

    def delta(family, sample, **labels):
        return after.value(family, sample, **labels) - before.value(family, sample, **labels)

    n = len(results)
    gen = sum(r["usage"]["completion_tokens"] for r in results)
    prompt = sum(r["usage"]["prompt_tokens"] for r in results)
    assert delta("specdec:requests", "specdec:requests_total", status="ok") == n
    assert delta("specdec:generation_tokens", "specdec:generation_tokens_total") == gen
    assert delta("specdec:prompt_tokens", "specdec:prompt_tokens_total") == prompt
    assert after.value("specdec:num_requests_running", "specdec:num_requests_running") == 0
    assert after.value("specdec:num_requests_waiting", "specdec:num_requests_waiting") == 0
    assert delta("specdec:time_to_first_token_seconds", "specdec:time_to_first_token_seconds_count") == n
    assert delta("specdec:inter_token_latency_seconds", "specdec:inter_token_latency_seconds_count") > 0
    assert delta("specdec:spec_decode_num_draft_tokens", "specdec:spec_decode_num_draft_tokens_total") == 0, \
        "a target-only server counted draft tokens"


# ---------------------------------------------------------------------------------------------
# Speculation and the prompt cache


PARAGRAPH = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great lamp, "
             "and wrote the weather, the ships he saw and the state of the sea in a leather logbook.")
NAMES = [{"role": "user", "content": "Extract all the names from this text: At the meeting, Alice Johnson presented "
          "the budget, Bob Smith talked about hiring, and Carol White summarised the customer feedback before "
          "David Brown closed the session."}]


def test_prompt_lookup_completion(lookup_server):
    prompt = f"{PARAGRAPH}\n\n{PARAGRAPH}\n\nRepeat the paragraph above word for word.\n\n"
    want = oracle(prompt, 40)
    j = complete(lookup_server, prompt=prompt, max_tokens=40, temperature=0)
    c = check_completion(j)
    assert c["text"] == want["text"], f"lookup server {c['text']!r}\noracle {want['text']!r}"
    assert j["speculative"]["drafted_tokens"] > 0, f"nothing drafted: {j['speculative']}"
    # "speculate": "none" turns the server's prompt lookup off for one request.
    j = complete(lookup_server, prompt=prompt, max_tokens=40, temperature=0, speculate="none")
    assert j["choices"][0]["text"] == want["text"] and j["speculative"]["drafted_tokens"] == 0, j


def test_prompt_lookup_per_request(server):
    # The extension field turns prompt lookup on for one request of a target-only server (under
    # constant K: goodput, its default, may judge drafting not worth it on a slow machine).
    want = oracle_chat(NAMES, 40, server)
    j = chat(server, messages=NAMES, max_tokens=40, temperature=0, prompt_lookup_num_tokens=4,
             num_assistant_tokens_schedule="constant")
    c = check_chat(j)
    assert c["message"]["content"] == want["text"], f"with lookup {c['message']['content']!r}\noracle {want['text']!r}"
    assert j["speculative"]["drafted_tokens"] > 0, f"prompt_lookup_num_tokens drafted nothing: {j['speculative']}"
    plain = chat(server, messages=NAMES, max_tokens=8, temperature=0)
    assert plain["speculative"]["drafted_tokens"] == 0, f"the next request still drafted: {plain['speculative']}"


def test_suffix_speculation_remembers_answers_of_requests_that_did_not_use_it(server):
    # Every finished request feeds the server's shared tree, whatever it drafted by.
    messages = [{"role": "user", "content": "Name the three primary colours, one per line."}]
    plain = chat(server, messages=messages, max_tokens=24, temperature=0)
    again = chat(server, messages=messages, max_tokens=24, temperature=0, speculate="suffix",
                 num_assistant_tokens_schedule="constant")
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert again["speculative"]["tokens_per_target_pass"] > 2, f"the plain answer was not remembered: {again['speculative']}"


def test_suffix_speculation_remembers_earlier_answers(server):
    # "speculate": "suffix" proposes from the request's own tokens and from the answers of the
    # server's earlier requests: a question asked again is proposed whole from the first answer
    # (a question no other test asks: every answer the server gives goes into the tree).
    question = [{"role": "user", "content": "What is the capital of Italy? Answer in one sentence."}]
    want = oracle_chat(question, 24, server)
    body = dict(messages=question, max_tokens=24, temperature=0, speculate="suffix",
                num_assistant_tokens_schedule="constant")
    first, second = chat(server, **body), chat(server, **body)
    for j in (first, second):
        c = check_chat(j)
        assert c["message"]["content"] == want["text"], f"suffix {c['message']['content']!r}\noracle {want['text']!r}"
    s1, s2 = first["speculative"], second["speculative"]
    assert s2["accepted_tokens"] > s1["accepted_tokens"], f"the second request gained nothing: {s1} then {s2}"
    assert s2["tokens_per_target_pass"] > 2, f"the repeated answer was not proposed from the first: {s2}"
    plain = chat(server, messages=CAPITAL, max_tokens=8, temperature=0)
    assert plain["speculative"]["drafted_tokens"] == 0, f"the next request still drafted: {plain['speculative']}"


def test_a_seed_gives_the_target_only_text_whatever_proposes(server):
    # Prompt lookup and suffix speculation propose without a distribution: each position's token
    # is drawn from the target as target-only sampling draws it, so a seed gives the same text with
    # them as without, however many candidates each pass verifies (the suffix tree grows with every
    # answer the server has given).
    body = dict(messages=CAPITAL, max_tokens=32, temperature=0.9, seed=1234)
    alone = chat(server, **body)["choices"][0]["message"]["content"]
    for knobs in (dict(prompt_lookup_num_tokens=4), dict(speculate="suffix"), dict(speculate="suffix"),
                  dict(speculate="suffix", num_assistant_tokens_schedule="constant")):
        j = chat(server, **body, **knobs)
        assert j["choices"][0]["message"]["content"] == alone, (knobs, j["choices"][0]["message"]["content"], alone)
    assert j["speculative"]["drafted_tokens"] > 0, f"suffix drafted nothing: {j['speculative']}"


def test_draft_model_and_prompt_lookup_requests_share_the_batch(draft_server):
    # Requests that ask for prompt lookup draft by it beside requests that draft with the model,
    # in one running batch; every answer is the target's greedy one.
    want = oracle_chat(NAMES, 40, draft_server)
    bodies = [dict(messages=NAMES, max_tokens=40, temperature=0, prompt_lookup_num_tokens=4 if i % 2 else 0)
              for i in range(4)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: chat(draft_server, **body), bodies))
    for i, j in enumerate(answers):
        c = check_chat(j)
        assert c["message"]["content"] == want["text"], f"request {i}: {c['message']['content']!r}\noracle {want['text']!r}"
        s = j["speculative"]
        assert s["drafted_tokens"] > 0, f"request {i} drafted nothing: {s}"
        if i % 2 == 0:  # the draft is the target: all its tokens are accepted (an EOS ends it)
            assert s["accepted_tokens"] >= s["drafted_tokens"] - 1, f"request {i}: {s}"


def test_prompt_lookup_chat_and_metrics(lookup_server):
    before = metrics(lookup_server)
    want = oracle_chat(NAMES, 40, lookup_server)
    j = chat(lookup_server, messages=NAMES, max_tokens=40, temperature=0)
    c = check_chat(j)
    assert c["message"]["content"] == want["text"], f"lookup server {c['message']['content']!r}\noracle {want['text']!r}"
    s = j["speculative"]
    assert s["drafted_tokens"] > 0 and s["accepted_tokens"] > 0, f"speculation did not help: {s}"
    assert s["tokens_per_target_pass"] > 1.0, s
    after = metrics(lookup_server)

    def delta(family, sample, **labels):
        return after.value(family, sample, **labels) - before.value(family, sample, **labels)

    assert delta("specdec:spec_decode_num_draft_tokens", "specdec:spec_decode_num_draft_tokens_total") == \
        s["drafted_tokens"]
    assert delta("specdec:spec_decode_num_accepted_tokens", "specdec:spec_decode_num_accepted_tokens_total") == \
        s["accepted_tokens"]
    assert delta("specdec:spec_decode_num_drafts", "specdec:spec_decode_num_drafts_total") > 0
    per_pos = after.samples("specdec:spec_decode_num_accepted_tokens_per_pos",
                            "specdec:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos and all("position" in p.labels for p in per_pos), per_pos
    per_pos_delta = sum(p.value for p in per_pos) - sum(
        p.value for p in before.samples("specdec:spec_decode_num_accepted_tokens_per_pos",
                                        "specdec:spec_decode_num_accepted_tokens_per_pos_total"))
    assert per_pos_delta == s["accepted_tokens"], f"per-position counts add to {per_pos_delta}, not {s}"


def test_prefix_reuse(server):
    first = [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
             {"role": "user", "content": "Name three colors."}]
    a = chat(server, messages=first, max_tokens=24, temperature=0)
    answer = a["choices"][0]["message"]["content"]
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now name three animals."}]
    b = chat(server, messages=second, max_tokens=24, temperature=0)
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < b["usage"]["prompt_tokens"], f"second turn reused nothing: {b['usage']}"
    want = oracle_chat(second, 24, server)["text"]
    assert b["choices"][0]["message"]["content"] == want, \
        f"with the cached prefix {b['choices'][0]['message']['content']!r}\noracle {want!r}"


def test_an_encoder_decoder_model_serves_requests_that_join_the_running_batch(tmp_path):
    # T5 (a random fixture with T5's tokenizer): each request's encoder pass runs as it joins the
    # running batch, beside rows with encoder outputs of other lengths; every answer equals
    # `specdec generate` of that prompt alone, and the draft (the target itself) attends to the
    # right encoder output in every row, so that all its tokens are accepted.
    shared = Path(os.environ.get("SPECDEC_SHARED_DIR", REPO.parent / "shared"))
    tokenizer = shared / "fixtures" / "tokenizers" / "t5_nonlegacy"
    assert tokenizer.is_dir(), f"{tokenizer} is missing (../shared beside the repository, or SPECDEC_SHARED_DIR)"
    t5 = tmp_path / "t5"
    subprocess.run([SPECDEC, "make-fixture", "--out", t5, "--arch", "t5", "--tokenizer", tokenizer, "--seed", "3"],
                   check=True, capture_output=True)
    prompts = ["summarize: " + PARAGRAPH, "hello", "translate English to German: The house is wonderful.",
               "a b c", "question: where does the keeper write the weather? context: " + PARAGRAPH, "yes"]
    # Constant K: goodput, the greedy default, may judge a random draft not worth its passes.
    s = start_server("--draft", t5, "--schedule", "constant", "--num-assistant-tokens", "3", "--max-batch", "2",
                     model=t5)
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda p: complete(s, model="t5", prompt=p, max_tokens=12, temperature=0),
                                    prompts))
        body = dict(model="t5", prompt=prompts[0], max_tokens=12, temperature=0)
        streamed = "".join(chunk_text(c) for c in read_sse(stream_post(s, "/v1/completions", body)))
    finally:
        s.stop()
    for p, j in zip(prompts, answers):
        want = oracle(p, 12, model=t5)["text"]
        assert j["choices"][0]["text"] == want, f"{p!r}: served {j['choices'][0]['text']!r}\noracle {want!r}"
        spec = j["speculative"]
        assert spec["drafted_tokens"] > 0 and spec["accepted_tokens"] >= spec["drafted_tokens"] - 1, f"{p!r}: {spec}"
    assert streamed == answers[0]["choices"][0]["text"], f"streamed {streamed!r}"


# ---------------------------------------------------------------------------------------------
# Request log


def test_request_log_lines(server):
    def lines(*words):
        return [l for l in server.log_text().splitlines() if all(w in l for w in words)]

    n_models = len(lines("GET", "/v1/models", "200"))
    n_missing = len(lines("GET", "/no-such-route", "404"))
    n_compl = len(lines("POST", "/v1/completions", "200"))
    server.get("/v1/models")
    server.get("/v1/models")
    server.get("/no-such-route")
    complete(server, prompt=COUNT, max_tokens=2)
    assert wait_for(lambda: len(lines("POST", "/v1/completions", "200")) == n_compl + 1), server.log_tail()
    assert len(lines("GET", "/v1/models", "200")) == n_models + 2, server.log_tail()
    assert len(lines("GET", "/no-such-route", "404")) == n_missing + 1, server.log_tail()


def test_ignored_fields_are_named_in_the_log(server):
    # A field nothing reads (a typo, an option of another server) is named, never its value; a
    # null one is as good as absent. At most 8 names, each at most 64 bytes.
    def logged(end):
        return any(l.startswith("POST /v1/completions 200") and l.endswith(end) for l in server.log_text().splitlines())

    j = complete(server, prompt=COUNT, max_tokens=1, temperature=0, max_token=5, user="secret-value",
                 metadata=None, top_k=3)
    assert j["usage"]["completion_tokens"] == 1, j
    assert wait_for(lambda: logged(" ignored max_token,user")), server.log_tail()
    assert "secret-value" not in server.log_text()
    many = {f"x{i:02d}" + "y" * 70: i for i in range(10)}
    complete(server, prompt=COUNT, max_tokens=1, **many)
    names = ",".join((f"x{i:02d}" + "y" * 70)[:64] for i in range(8))
    assert wait_for(lambda: logged(f" ignored {names},...")), server.log_tail()
    # A made-up name cannot pass for more of the line: its spaces and commas are escaped.
    complete(server, prompt=COUNT, max_tokens=1, **{"a,b error invalid_value (max_tokens)": 1})
    assert wait_for(lambda: logged(r" ignored a\x2cb\x20error\x20invalid_value\x20(max_tokens)")), server.log_tail()


def test_a_refused_request_is_counted_and_logged_with_its_code(server):
    lines_before = sum(l.startswith("POST /v1/completions 400") and l.endswith(" error invalid_value (max_tokens)")
                       for l in server.log_text().splitlines())
    before = metrics(server)
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    after = metrics(server)
    for status, grew in (("refused", 1), ("error", 0), ("ok", 0)):
        got = after.value("specdec:requests", "specdec:requests_total", status=status) - \
            before.value("specdec:requests", "specdec:requests_total", status=status)
        assert got == grew, f"requests_total{{status={status!r}}} grew by {got}, not {grew}"
    # The log says why (the error's code and param), and never the message
    def logged():
        return sum(l.startswith("POST /v1/completions 400") and l.endswith(" error invalid_value (max_tokens)")
                   for l in server.log_text().splitlines())
    assert wait_for(lambda: logged() == lines_before + 1), server.log_tail()
    # A param naming a key the client made up is logged without it
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": True,
                                        "stream_options": {"made up) key": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.made up) key", r.text
    assert wait_for(lambda: any(l.startswith("POST /v1/completions 400") and l.endswith(" (stream_options)")
                                for l in server.log_text().splitlines())), server.log_tail()
    assert "made up" not in server.log_text(), server.log_tail()


def test_json_log():
    s = start_server("--log-format", "json")
    try:
        j = complete(s, prompt=COUNT, max_tokens=4, temperature=0, user="u")
        s.get("/v1/models")
        assert s.post("/v1/chat/completions", {"messages": [], "max_tokens": 1}).status_code == 400

        def records():
            out = []
            for line in s.log_text().splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    assert isinstance(rec, dict), line
                    if "path" in rec:
                        out.append(rec)
                else:  # every line is a JSON object: the server's own as {"message": ...}
                    assert not line.strip(), f"a log line that is not JSON: {line!r}"
            return out

        paths = {"/v1/completions", "/v1/models", "/v1/chat/completions"}
        time_format = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
        assert wait_for(lambda: paths <= {r["path"] for r in records()}), s.log_tail()
        recs = records()
        for r in recs:
            assert list(r)[:5] == ["time", "method", "path", "status", "ms"], r
            assert isinstance(r["ms"], (int, float)) and r["ms"] >= 0, r
            assert re.fullmatch(time_format, r["time"]), r
            when = datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
            assert abs((datetime.datetime.utcnow() - when).total_seconds()) < 600, r
        comp = [r for r in recs if r["path"] == "/v1/completions"]
        assert len(comp) == 1, recs
        assert comp[0]["method"] == "POST" and comp[0]["status"] == 200, comp
        assert comp[0]["prompt_tokens"] == j["usage"]["prompt_tokens"], (comp, j["usage"])
        assert comp[0]["completion_tokens"] == j["usage"]["completion_tokens"], (comp, j["usage"])
        assert comp[0]["ignored"] == ["user"], comp
        refused = [r for r in recs if r["path"] == "/v1/chat/completions"]
        assert len(refused) == 1 and refused[0]["status"] == 400, recs
        assert refused[0]["error"] == "invalid_value" and refused[0]["param"] == "messages", refused
        models = [r for r in recs if r["path"] == "/v1/models"]
        assert len(models) == 1 and models[0]["method"] == "GET" and models[0]["status"] == 200, recs
        own = [json.loads(l) for l in s.log_text().splitlines() if '"message"' in l]
        assert any(o["message"].startswith("specdec serve: ready: ") for o in own), own
        # the server's own lines are timed as the requests' are
        assert all(list(o) == ["time", "message"] and re.fullmatch(time_format, o["time"]) for o in own), own
    finally:
        s.stop()


def test_routes_without_v1(server):
    # A client whose base URL leaves out /v1 (llama-server answers there too): the same answers.
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    got = client.completions.create(model=MODEL_ID, prompt=STORY, max_tokens=8, temperature=0)
    assert got.choices[0].text == oracle(STORY, 8)["text"], got
    answer = client.chat.completions.create(model=MODEL_ID, messages=CAPITAL, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content == oracle_chat(CAPITAL, 8, server)["text"], answer
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    # no other path takes them
    for path in ("/v2/completions", "/v1/v1/completions", "/xchat/completions"):
        r = server.post(path, json={"prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
