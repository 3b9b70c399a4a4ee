"""``acmrl serve``: an OpenAI-compatible completions server in front of any engine.

It lets several rollout workers share one model (and lets the ``openai`` engine be tested against a
real server). ``POST /v1/completions`` takes a prompt as text or token ids and returns the text,
the completion's token ids (``token_ids``, as vLLM's ``return_token_ids``), per-token logprobs and
``usage.prompt_tokens_details.cached_tokens``. The OpenAI ``user`` field names the session whose
prefix cache the engine keeps. ``response_format`` (OpenAI's structured output, a JSON schema)
constrains the reply (acmrl/engines/structured.py). Concurrent requests are gathered for a few
milliseconds and run as one batch. Standard library only (``http.server``).

With ``allow_adapter_loading`` it also takes vLLM's runtime adapter API: ``POST
/v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` loads a LoRA adapter folder onto its base
and merges it (acmrl's adapter checks apply: the base must be the one it was trained on); a
request whose ``model`` is that name is served by it; ``/v1/unload_lora_adapter`` drops it. At
most ``max_adapters`` are kept (the oldest goes first). GRPO with ``engine.kind=openai`` syncs
its adapter this way after every step. The paths are read from the server's disk: enable it
only where the clients are trusted.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from acmrl.engines.base import Completion, Engine, EngineError, Request
from acmrl.engines.structured import check_response_format, schema_error


class BadRequest(ValueError):
    pass


def parse_request(body: dict[str, Any], tokenizer: Any) -> Request:
    """An engine request from an OpenAI completions body; BadRequest names the bad field."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=False)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        ids = list(prompt)
    else:
        raise BadRequest("'prompt' must be a non-empty string or a non-empty list of token ids")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("'stop' must be a string or a list of strings")
    try:
        max_tokens = int(body.get("max_tokens", 16))
        temperature = float(body.get("temperature", 1.0))
        top_p = float(body.get("top_p", 1.0))
        seed = None if body.get("seed") is None else int(body["seed"])
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling parameter: {exc}") from None
    if max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise BadRequest("need max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
    try:
        schema = check_response_format(body.get("response_format"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if schema is not None and (why := schema_error(schema)):
        raise BadRequest(f"'response_format': the JSON schema cannot be enforced: {why}")
    session = str(body.get("user") or f"anon-{uuid.uuid4().hex}")
    return Request(
        session, ids, max_tokens, temperature, top_p, stop, seed, body.get("response_format")
    )


def completion_body(
    c: Completion, model: str, tokenizer: Any, want_logprobs: bool
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": c.text,
        "finish_reason": c.finish_reason,
        "token_ids": c.completion_ids,
        "logprobs": None,
    }
    if want_logprobs:
        choice["logprobs"] = {
            "tokens": tokenizer.convert_ids_to_tokens(c.completion_ids),
            "token_logprobs": c.logprobs,
            "top_logprobs": None,
        }
    n_out = len(c.completion_ids)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": n_out,
            "total_tokens": c.prompt_tokens + n_out,
            "prompt_tokens_details": {"cached_tokens": c.cached_prefix_tokens},
        },
    }


class Batcher:
    """Collects requests from the HTTP threads and runs them through the engine in batches."""

    def __init__(self, engine: Engine, max_batch: int, wait_s: float = 0.005) -> None:
        self.engine, self.max_batch, self.wait_s = engine, max_batch, wait_s
        self.queue: queue.Queue[tuple[Request, Future]] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, req: Request) -> Completion:
        fut: Future = Future()
        self.queue.put((req, fut))
        return fut.result()

    def close(self) -> None:
        """End the batching thread once the requests queued before are served."""
        self.queue.put(None)  # type: ignore[arg-type]

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.wait_s
            closing = False
            while len(batch) < self.max_batch:
                try:
                    item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._run(batch)
            if closing:
                return

    def _run(self, batch: list[tuple[Request, Future]]) -> None:
        try:
            results = self.engine.generate([r for r, _ in batch])
        except EngineError:  # one bad request must not fail the others
            for req, fut in batch:
                try:
                    fut.set_result(self.engine.generate([req])[0])
                except EngineError as exc:
                    fut.set_exception(exc)
            return
        except Exception as exc:
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for (_, fut), c in zip(batch, results, strict=True):
            fut.set_result(c)


class Adapters:
    """The runtime LoRA adapters of a server: name -> a batcher over the merged model."""

    def __init__(self, make_engine: Callable[[str], Engine], max_batch: int, keep: int) -> None:
        self.make_engine, self.max_batch, self.keep = make_engine, max_batch, keep
        self.batchers: dict[str, Batcher] = {}
        self.lock = threading.Lock()

    def load(self, name: str, path: str) -> None:
        engine = self.make_engine(path)  # outside the lock: loading takes a while
        with self.lock:
            if name in self.batchers:
                self.batchers.pop(name).close()
            self.batchers[name] = Batcher(engine, self.max_batch)
            while len(self.batchers) > self.keep:
                self.batchers.pop(next(iter(self.batchers))).close()

    def unload(self, name: str) -> bool:
        with self.lock:
            batcher = self.batchers.pop(name, None)
        if batcher is not None:
            batcher.close()
        return batcher is not None

    def get(self, name: str) -> Batcher | None:
        with self.lock:
            return self.batchers.get(name)


def make_server(
    engine: Engine,
    tokenizer: Any,
    model_name: str,
    host: str,
    port: int,
    max_batch: int,
    adapters: Adapters | None = None,
) -> ThreadingHTTPServer:
    batcher = Batcher(engine, max_batch)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per error only
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind}})

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif self.path.rstrip("/") == "/v1/models":
                names = [model_name, *(adapters.batchers if adapters else [])]
                data = [{"id": n, "object": "model"} for n in names]
                self._send(200, {"object": "list", "data": data})
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def _adapter_call(self, route: str) -> None:
            if adapters is None:
                self._error(
                    404,
                    f"{route}: adapter loading is off (serve with allow_adapter_loading=true)",
                    "not_found",
                )
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                name = body["lora_name"]
                if not isinstance(name, str) or not name or name == model_name:
                    raise BadRequest("'lora_name' must be a new, non-empty name")
                if route == "/v1/load_lora_adapter":
                    adapters.load(name, str(body["lora_path"]))
                    self._send(200, {"status": "ok", "message": f"adapter {name!r} loaded"})
                elif adapters.unload(name):
                    self._send(200, {"status": "ok", "message": f"adapter {name!r} unloaded"})
                else:
                    self._error(404, f"no adapter {name!r}", "not_found")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError, BadRequest) as exc:
                self._error(400, f"bad adapter request: {exc}", "invalid_request_error")
            except Exception as exc:  # the adapter would not load: say why, keep serving
                self._error(400, f"cannot load the adapter: {exc}", "invalid_request_error")

        def do_POST(self) -> None:
            route = self.path.rstrip("/")
            if route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                self._adapter_call(route)
                return
            if route != "/v1/completions":
                self._error(404, f"no route {self.path}; use /v1/completions", "not_found")
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                req = parse_request(body, tokenizer)
            except (json.JSONDecodeError, BadRequest) as exc:
                self._error(400, str(exc), "invalid_request_error")
                return
            served = batcher
            asked = body.get("model")
            if adapters is not None and asked not in (None, model_name):
                served = adapters.get(str(asked))
                if served is None:
                    self._error(404, f"no model or adapter {asked!r}", "not_found")
                    return
            try:
                c = served.submit(req)
            except EngineError as exc:
                self._error(400, str(exc), "invalid_request_error")
                return
            except Exception as exc:  # the engine failed: report it, keep serving
                self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
                return
            self._send(
                200,
                completion_body(
                    c, str(asked or model_name), tokenizer, body.get("logprobs") is not None
                ),
            )

    return ThreadingHTTPServer((host, port), Handler)
