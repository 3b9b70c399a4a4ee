"""The ``openai`` engine: any OpenAI-compatible completions server (``vllm serve``, ``acmrl serve``).

Token ids go in as the prompt; the completion's ids come back from ``token_ids`` (vLLM's
``return_token_ids``; ``acmrl serve`` always sends them) or, from servers that do not return them,
by tokenising the text locally (then marked in ``Completion.text`` only: the ids are a best effort).
Several base URLs share the load with session affinity: a session always goes to the same server
(the CRC32 of its id picks it), so its prefix stays in that server's cache; when that server is
down after the retries, the next one takes the session. Retries use exponential backoff on
connection errors, timeouts, 429 and 5xx; other errors fail at once with the server's message.
The server's ``usage.prompt_tokens_details.cached_tokens`` becomes ``cached_prefix_tokens``.

:meth:`OpenAIEngine.load_adapter` syncs a trainer's LoRA adapter into every server through the
runtime adapter API that vLLM (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve --enable-lora``)
and ``acmrl serve`` (``allow_adapter_loading: true``) share: ``POST /v1/load_lora_adapter`` under a
new name each time, requests name it as their ``model``, the previous one is unloaded.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from acmrl.engines.base import Completion, Engine, EngineError, Request

RETRY_STATUS = {429, 500, 502, 503, 504}


class _Retryable(Exception):
    pass


class OpenAIEngine(Engine):
    name = "openai"
    loads_policy = True  # a trainer syncs its servers after each update

    def __init__(
        self,
        base_urls: list[str],
        model: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        concurrency: int = 16,
    ) -> None:
        if not base_urls:
            raise EngineError("the openai engine needs at least one base URL")
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.model, self.tokenizer, self.api_key = model, tokenizer, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self._pool = ThreadPoolExecutor(max_workers=concurrency)
        self._jitter = random.Random(0)

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter in ``path`` (a folder every server can read) from now on: loaded
        on every server under a fresh name (a server caches adapters by name), which the next
        requests ask for; the previous adapter is unloaded. Any server refusing is an error."""
        name = f"acmrl-{uuid.uuid4().hex[:12]}"
        body = {"lora_name": name, "lora_path": os.path.abspath(path)}
        for url in self.base_urls:
            self._admin(url, "load_lora_adapter", body)
        old, self.model = getattr(self, "_adapter", None), name
        self._adapter = name
        if old is not None:
            for url in self.base_urls:
                self._admin(url, "unload_lora_adapter", {"lora_name": old})

    def _request(self, url: str, route: str, body: dict[str, Any]) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        return urllib.request.Request(
            f"{url}/v1/{route}", data=data, headers=headers, method="POST"
        )

    def _admin(self, url: str, route: str, body: dict[str, Any]) -> str:
        """POST an adapter-management call; its reply is plain text on vLLM."""
        try:
            with urllib.request.urlopen(
                self._request(url, route, body), timeout=self.timeout_s
            ) as resp:
                return resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise EngineError(
                f"{url} refused /v1/{route} (HTTP {exc.code}): {detail}. vLLM needs "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora; acmrl serve needs "
                "allow_adapter_loading=true"
            ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise EngineError(f"{url}: /v1/{route} failed: {exc}") from None

    def server_for(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % len(self.base_urls)

    def generate(self, requests: list[Request]) -> list[Completion]:
        return list(self._pool.map(self._one, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _body(self, req: Request) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.prompt_ids,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "user": req.session_id,
        }
        if req.stop:
            body["stop"] = req.stop
            body["include_stop_str_in_output"] = True  # vLLM: keep the stop text, as hf does
        if req.seed is not None:
            body["seed"] = req.seed
        if req.response_format is not None:
            body["response_format"] = req.response_format
        return body

    def _one(self, req: Request) -> Completion:
        t0 = time.perf_counter()
        first = self.server_for(req.session_id)
        errors = []
        for k in range(len(self.base_urls)):  # affinity first, then fail over in order
            url = self.base_urls[(first + k) % len(self.base_urls)]
            try:
                data = self._post_with_retries(url, self._body(req))
                return self._completion(req, data, time.perf_counter() - t0)
            except _Retryable as exc:
                errors.append(f"{url}: {exc}")
        raise EngineError(f"session {req.session_id}: every server failed: " + "; ".join(errors))

    def _post_with_retries(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + self._jitter.random() / 4))
            try:
                return self._post(url, body)
            except _Retryable as exc:
                last = str(exc)
        raise _Retryable(f"gave up after {self.max_retries + 1} attempts ({last})")

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            request = self._request(url, "completions", body)
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code in RETRY_STATUS:
                raise _Retryable(f"HTTP {exc.code}: {detail}") from None
            raise EngineError(f"{url} refused the request (HTTP {exc.code}): {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None
        except json.JSONDecodeError as exc:
            raise _Retryable(f"the reply is not JSON ({exc.msg})") from None

    def _completion(self, req: Request, data: dict[str, Any], wall: float) -> Completion:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"malformed completion reply: {str(data)[:300]}") from None
        text = choice.get("text", "")
        ids = choice.get("token_ids")
        if ids is None:  # a server without return_token_ids: our best reconstruction
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        lp = (choice.get("logprobs") or {}).get("token_logprobs") or [0.0] * len(ids)
        usage = data.get("usage") or {}
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        return Completion(
            req.session_id,
            list(ids),
            [float(x) if x is not None else 0.0 for x in lp],
            int(cached),
            choice.get("finish_reason") or "stop",
            text,
            int(usage.get("prompt_tokens", len(req.prompt_ids))),
            wall,
        )
