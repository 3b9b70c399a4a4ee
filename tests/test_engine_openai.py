"""The openai engine against real servers: `acmrl serve` processes started by the test."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from acmrl.engines.base import EngineError, Request
from acmrl.engines.openai import OpenAIEngine


def start_server(model_dir: Path, *overrides: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "acmrl.cli", "serve", f"model.name={model_dir}", "port=0"]
    cmd += overrides
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"acmrl serve did not start: {proc.stderr.read()}")


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    started = [start_server(tiny_model_dir) for _ in range(2)]
    yield [url for _, url in started], [proc for proc, _ in started]
    for proc, _ in started:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def local(tiny_engine):
    return tiny_engine


def prompt(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_same_tokens_as_the_local_engine_and_real_cache_reuse(servers, local):
    urls, _ = servers
    eng = OpenAIEngine(urls[:1], "tiny", local.tokenizer)
    ids = prompt(local.tokenizer, "Which town hosts the Lantern Fair?")
    remote = eng.generate([Request("s1", ids, max_tokens=12)])[0]
    here = local.generate([Request("s1", ids, max_tokens=12)])[0]
    assert remote.completion_ids == here.completion_ids and remote.text == here.text
    assert remote.logprobs == pytest.approx(here.logprobs, abs=1e-4)
    assert remote.cached_prefix_tokens == 0 and remote.finish_reason == "length"
    nxt = ids + remote.completion_ids + local.tokenizer.encode("\nmore", add_special_tokens=False)
    again = eng.generate([Request("s1", nxt, max_tokens=4)])[0]
    assert (
        again.cached_prefix_tokens == len(ids) + len(remote.completion_ids) - 1
    )  # the server's KV


def test_affinity_spreads_sessions_and_keeps_each_on_one_server(servers, local):
    urls, _ = servers
    eng = OpenAIEngine(urls, "tiny", local.tokenizer)
    sessions = [f"episode-{i}" for i in range(8)]
    assert {eng.server_for(s) for s in sessions} == {0, 1}
    ids = prompt(local.tokenizer, "Hello")
    first = eng.generate([Request(s, ids, max_tokens=3) for s in sessions])
    second = eng.generate(
        [
            Request(s, ids + c.completion_ids, max_tokens=3)
            for s, c in zip(sessions, first, strict=True)
        ]
    )
    # every session found its own cache again, so it went to the same server both times
    assert all(c.cached_prefix_tokens == len(ids) + 2 for c in second)


def test_errors_retries_and_failover(servers, local, tiny_model_dir):
    urls, _ = servers
    eng = OpenAIEngine(urls[:1], "tiny", local.tokenizer, max_retries=0)
    with pytest.raises(EngineError, match=r"refused the request \(HTTP 400\).*prompt"):
        eng.generate([Request("e", [], max_tokens=3)])
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    free.close()
    t0 = time.monotonic()
    gone = OpenAIEngine([dead], "tiny", local.tokenizer, max_retries=2, backoff_s=0.05)
    with pytest.raises(EngineError, match=r"every server failed.*gave up after 3 attempts"):
        gone.generate([Request("x", [1, 2, 3], max_tokens=2)])
    assert time.monotonic() - t0 >= 0.05 + 0.1  # it backed off between attempts
    both = OpenAIEngine([dead, urls[0]], "tiny", local.tokenizer, max_retries=0)
    session = next(s for s in (f"s{i}" for i in range(50)) if both.server_for(s) == 0)
    c = both.generate([Request(session, prompt(local.tokenizer, "Hi"), max_tokens=2)])[0]
    assert len(c.completion_ids) == 2  # the dead server's session failed over to the live one


def test_the_server_speaks_the_openai_protocol(servers):
    urls, _ = servers
    with urllib.request.urlopen(f"{urls[0]}/v1/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["object"] == "model"
    body = json.dumps(
        {"model": "x", "prompt": "Hello there", "max_tokens": 3, "temperature": 0}
    ).encode()
    req = urllib.request.Request(
        f"{urls[0]}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        reply = json.loads(r.read())
    assert reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] == 3
    assert reply["choices"][0]["logprobs"] is None and len(reply["choices"][0]["token_ids"]) == 3


def test_a_rollout_through_the_servers(servers, tiny_model_dir, tmp_path):
    from acmrl.config import RolloutConfig
    from acmrl.rollout.worker import read_trajectories, run_rollout

    urls, _ = servers
    cfg = RolloutConfig(arms=["react", "acm"], output=str(tmp_path / "t.jsonl"), tensorboard=False)
    cfg.model.name = str(tiny_model_dir)
    cfg.engine.kind = "openai"
    cfg.engine.base_urls = urls
    cfg.env.options = {"preset": "tiny", "seed": 0}
    cfg.env.limit = 2
    cfg.sampling.max_new_tokens = 8
    cfg.agent.max_turns = 2
    rows = run_rollout(cfg)
    trajs = read_trajectories(cfg.output)
    assert len(trajs) == 4 and {r["arm"] for r in rows} == {"react", "acm"}
    calls = [s.call for t in trajs for s in t.steps if s.call]
    assert calls and all(len(c.completion_ids) == len(c.logprobs) > 0 for c in calls)
