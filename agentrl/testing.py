"""Helpers for tests: a tiny offline chat tokenizer and model, log-prob oracles, a scripted policy.

Tests must never download a model or a tokenizer. :func:`build_tiny_tokenizer` trains a byte-level
BPE tokenizer in-process (well under a second) on a small corpus kept in this module, and dresses
it as a ChatML chat model: ``<|im_start|>`` / ``<|im_end|>`` turns, ``<|im_end|>`` as the
end-of-turn and eos token, ``<|endoftext|>`` as padding, and a Hermes-style chat template with tool
calling. Because it is byte-level, any text round-trips exactly through ``encode`` / ``decode``;
because training is deterministic, every build has the same vocabulary, so a tiny model built
with :data:`TINY_VOCAB_SIZE` embeddings can be saved and reloaded next to it.

>>> from agentrl.testing import build_tiny_tokenizer
>>> tokenizer = build_tiny_tokenizer()
>>> text = tokenizer.apply_chat_template(
...     [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
... )
>>> text
'<|im_start|>user\\nWhat is 2 + 3?<|im_end|>\\n<|im_start|>assistant\\n'
>>> tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
True

Use it in your own tests as a fixture::

    @pytest.fixture(scope="session")
    def tokenizer():
        return build_tiny_tokenizer()

The oracles (:func:`token_logprobs`, :func:`token_entropy`, :func:`reference_logprobs`) are the
plain full-logits computations that the trainer's and the engines' log-probs are checked against;
:class:`ScriptedPolicy` answers from a script, for tests of the machinery around a policy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.policies.base import Generation, Sampling

if TYPE_CHECKING:  # torch and transformers are imported only when a function needs them
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from agentrl.types import Trajectory

#: The size of the tiny tokenizer's vocabulary, special tokens included. Build tiny models with
#: exactly this many embeddings.
TINY_VOCAB_SIZE = 1024
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Special tokens in id order: ``<|endoftext|>`` is 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2.
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)

#: A ChatML template with Hermes-style tool calling, written for agentrl's tests. Tools go into the
#: system turn as JSON lines; an assistant's tool calls are ``<tool_call>`` JSON blocks after its
#: text (one ``\\n`` apart, the shape :func:`agentrl.tool_calls.format_tool_calls` writes);
#: consecutive ``tool`` messages become one user turn of ``<tool_response>`` blocks. Every piece of
#: output is an explicit string expression, so whitespace never depends on Jinja's trimming rules.
TINY_CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system_text = messages[0].content or '' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system_text = none %}{%- set turns = messages %}{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if system_text %}{{- system_text + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call the functions listed in <tools></tools> below.\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object in a <tool_call></tool_call> block:\\n'"
    ' + \'<tool_call>\\n{"name": <function-name>, "arguments": <arguments-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif system_text is not none %}"
    "{{- '<|im_start|>system\\n' + system_text + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in turns %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or turns[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or turns[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Text the tokenizer should compress well: chat scaffolding, tool calls, arithmetic and prose.
# Everything else still encodes, byte by byte.
_PROSE = """\
You are a helpful assistant. You answer questions about numbers, words and the weather.
The user asks a question and the assistant answers it. When a tool can help, the assistant calls
the tool, reads the result, and then gives the final answer in one short sentence.
What is the sum of two and three? The sum of two and three is five.
What is the product of six and seven? Six times seven is forty two.
Please compute the expression and tell me the answer. Let me compute that for you.
The answer is correct. That is not right, try again. Good job! Well done.
I will use the calculator tool to check the result before I answer.
Thank you for your help. You are welcome. Is there anything else I can do?
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
A function takes arguments and returns a value. An error means the call failed.
Read the file, write the file, run the code, and report what happened.
The weather in Paris is sunny today, with a high of 21 degrees and a light wind.
In Berlin it is cloudy and cool; in Rome it is warm and dry; in London it rains.
Search the documents for the keyword and return the first three matching lines.
Count the words in the sentence: one two three four five six seven eight nine ten.
Agents act in environments, receive observations and rewards, and learn a policy.
The episode ends when the task is solved or the number of turns runs out.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.
January, February, March, April, May, June, July, August, September, October, November, December.
Red, orange, yellow, green, blue, indigo and violet are the colours of the rainbow.
Apples, bananas, cherries, grapes, lemons, mangoes, oranges, peaches and pears grow on farms.
The library opens at nine in the morning and closes at six in the evening, except on holidays.
Her favourite book describes a journey across mountains, rivers, forests and frozen lakes.
Students learn algebra, geometry, history, chemistry, biology, physics and literature at school.
If the number is even, divide it by two; otherwise multiply it by three and add one.
Python, Rust, Java, Go and JavaScript are programming languages; SQL queries a database.
Hello, world! How are you today? I am fine, thanks. Goodbye, see you tomorrow.
"""

_JSON = """\
{"name": "calculate", "arguments": {"expression": "2 + 3"}}
{"name": "calculate", "arguments": {"expression": "(4 * 5) - 6"}}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "reinforcement learning", "limit": 3}}
{"name": "read_file", "arguments": {"path": "/tmp/data.txt"}}
{"type": "function", "function": {"name": "calculate", "description": "Evaluate an arithmetic expression.", \
"parameters": {"type": "object", "properties": {"expression": {"type": "string", \
"description": "The expression to evaluate."}}, "required": ["expression"]}}}
{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}, \
"flag": {"type": "boolean"}, "items": {"type": "array"}}, "required": ["a", "b"], "nullable": true}
{"result": 5, "error": null, "ok": true, "values": [1, 2, 3], "text": "done"}
"""

_CHAT = """\
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is 2 + 3?<|im_end|>
<|im_start|>assistant
Let me compute that.
<tool_call>
{"name": "calculate", "arguments": {"expression": "2 + 3"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
5
</tool_response><|im_end|>
<|im_start|>assistant
The answer is 5.<|im_end|>
# Tools

You may call the functions listed in <tools></tools> below.
To call a function, answer with a JSON object in a <tool_call></tool_call> block:
Error: unknown tool; available tools: calculate, search. Error: bad arguments for calculate.
"""


def _corpus() -> list[str]:
    arithmetic = [
        f"{a} + {b} = {a + b}; {a} * {b} = {a * b}; {a + b} - {b} = {a}"
        for a in range(0, 30, 3)
        for b in range(1, 20, 4)
    ]
    return [_PROSE, _JSON, _CHAT, *arithmetic]


def build_tiny_tokenizer(save_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Train the tiny ChatML tokenizer (deterministic, offline); save it to ``save_dir`` if given.

    The result is a ``transformers`` fast tokenizer with :data:`TINY_VOCAB_SIZE` tokens,
    ``eos_token`` ``<|im_end|>``, ``pad_token`` ``<|endoftext|>``, no BOS token, and
    :data:`TINY_CHAT_TEMPLATE` as its chat template (tools, tool calls and tool results included).

    >>> tokenizer = build_tiny_tokenizer()
    >>> len(tokenizer) == TINY_VOCAB_SIZE, tokenizer.eos_token
    (True, '<|im_end|>')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # No prefix space: " hello" and "hello" must stay different texts, or decode(encode(x)) != x.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, seen in the corpus or not, so any UTF-8 text can be encoded.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=TINY_CHAT_TEMPLATE,
        # Decoding must give back the exact text, spaces before punctuation included.
        clean_up_tokenization_spaces=False,
        model_max_length=32_768,
    )
    if len(tokenizer) != TINY_VOCAB_SIZE:  # the corpus ran out of merges; grow it
        raise RuntimeError(
            f"The tiny tokenizer has {len(tokenizer)} tokens, not TINY_VOCAB_SIZE={TINY_VOCAB_SIZE}; "
            "the built-in corpus is too small for that many merges."
        )
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


def build_tiny_model(save_dir: str | Path, *, layers: int = 2, hidden: int = 128, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Llama chat model and its tokenizer to ``save_dir``.

    The model has :data:`TINY_VOCAB_SIZE` embeddings, ``hidden // 64`` attention heads of size 64
    (vLLM's CPU attention rejects smaller head sizes), tied input and output embeddings and fp32
    weights; it loads in transformers and in vLLM like any checkpoint. Returns ``save_dir``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden % 64:
        raise ValueError(f"hidden must be a multiple of the head size 64, got {hidden}.")
    tokenizer = build_tiny_tokenizer(save_dir)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(save_dir))
    return Path(save_dir)


def reference_model(path: str | Path) -> PreTrainedModel:
    """The checkpoint at ``path`` in transformers, fp32, in eval mode: the independent reference
    that a backend's log-probs are checked against."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


# --- oracles: full-logits reference implementations ------------------------------------------------
# Plain and slow on purpose: every position's logits, one sequence at a time. Tests check the fast
# paths against them: the trainer's (agentrl.trainers.models.generated_logprobs, which applies the
# head only where a loss exists) and every engine's recorded log-probs.


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` log-probs of each token under the logits one position earlier (0 at position 0).

    Computed in float32 (or the logits' dtype if wider) as ``logit[token] - logsumexp(logits)``,
    one sequence at a time, so the full ``[B, T, V]`` log-softmax is never materialised; gradients
    flow back to the logits. ``temperature`` must be the sampling temperature of the engine whose
    log-probs these are compared with (vLLM divides the logits by it before its log-probs).
    """
    _check_logits(logits)
    if input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"input_ids must be [B, T] = {tuple(logits.shape[:2])} like the logits, got {tuple(input_ids.shape)}."
        )
    rows = []
    for b, row in enumerate(_predicting_rows(logits, temperature)):
        chosen = row.gather(-1, input_ids[b, 1:, None]).squeeze(-1)
        rows.append(chosen - row.logsumexp(dim=-1))
    return _shift(rows, logits)


def token_entropy(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` entropy (nats) of the distribution each token was drawn from, aligned like
    :func:`token_logprobs` (0 at position 0)."""
    _check_logits(logits)
    rows = []
    for row in _predicting_rows(logits, temperature):
        # H = logsumexp(l) - sum softmax(l) * l, without forming log_softmax's [T, V] output twice.
        rows.append(row.logsumexp(dim=-1) - (row.softmax(dim=-1) * row).sum(-1))
    return _shift(rows, logits)


def reference_logprobs(model: PreTrainedModel, token_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
    """The log-prob of each of ``token_ids`` given the ones before it, by one forward pass of
    ``model`` and :func:`token_logprobs` of its logits at ``temperature`` (0.0 for the first token,
    which has nothing before it)."""
    import torch

    ids = torch.tensor([list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits
    return token_logprobs(logits, ids, temperature=temperature)[0].tolist()


def max_logprob_gap(model: PreTrainedModel, trajectories: Iterable[Trajectory], temperature: float = 1.0) -> float:
    """The largest difference between a trajectory's recorded log-prob and :func:`reference_logprobs`
    at the sampling ``temperature``, over every generated token (loss mask 1) of ``trajectories``.

    Raises ``ValueError`` if there is no generated token to compare: a check over nothing passes
    whatever the backend does.
    """
    gaps = []
    for trajectory in trajectories:
        expected = reference_logprobs(model, trajectory.token_ids, temperature)
        gaps += [abs(a - b) for a, b, m in zip(trajectory.logprobs, expected, trajectory.loss_mask) if m]
    if not gaps:
        raise ValueError("max_logprob_gap got no generated tokens to compare.")
    return max(gaps)


def _check_logits(logits: torch.Tensor) -> None:
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}.")


def _predicting_rows(logits: torch.Tensor, temperature: float) -> Iterator[torch.Tensor]:
    """Each sequence's logits at positions 0..T-2 (those that predict a next token), upcast to at
    least float32 and divided by ``temperature``, one sequence at a time."""
    import torch

    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    # Half-precision logits are upcast: the log-probs feed ratios that must resolve 1e-3 changes.
    dtype = torch.promote_types(logits.dtype, torch.float32)
    for b in range(logits.shape[0]):
        row = logits[b, :-1].to(dtype)
        yield row / temperature if temperature != 1.0 else row


def _shift(per_position: list[torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    """Stack rows of ``T - 1`` values computed from positions ``0..T-2`` and move them one to the
    right, so that position ``t`` describes token ``t`` and position 0 holds 0."""
    import torch

    batch_size = logits.shape[0]
    body = torch.stack(per_position) if per_position else torch.zeros((batch_size, 0), device=logits.device)
    return torch.cat([body.new_zeros((batch_size, 1)), body], dim=1)


class ScriptedPolicy:
    """A :class:`~agentrl.policies.base.Policy` that answers from a script instead of a model.

    For tests of the machinery around a policy and for overhead benchmarks, never as a stand-in
    for a real engine. ``reply`` maps the decoded prompt to the completion text (or is a fixed
    text); ``delay`` simulates generation time: seconds, the seconds of the first calls in order (0
    after them; unlike a function, a list pickles into a Ray actor), or a function of the call
    number. Every token gets log-prob ``-1.0``; a completion ends with the end-of-turn ids unless
    ``max_tokens`` cuts it first.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        reply: str | Callable[[str], str],
        *,
        end_of_turn_ids: Sequence[int] = (),
        delay: float | Sequence[float] | Callable[[int], float] = 0.0,
        decode_prompt: bool = True,
    ):
        self.tokenizer = tokenizer
        self.reply = reply
        self.end_of_turn_ids = list(end_of_turn_ids) or [tokenizer.eos_token_id]
        self.delay = delay
        self.decode_prompt = decode_prompt and callable(reply)
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        call = self.calls
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if callable(self.delay):
                delay = self.delay(call)
            elif isinstance(self.delay, Sequence):
                delay = self.delay[call] if call < len(self.delay) else 0.0
            else:
                delay = self.delay
            if delay:
                await asyncio.sleep(delay)
            if callable(self.reply):
                prompt = str(self.tokenizer.decode(list(prompt_ids))) if self.decode_prompt else ""
                text = self.reply(prompt)
            else:
                text = self.reply
            ids = self.tokenizer.encode(text, add_special_tokens=False) + self.end_of_turn_ids
            finish = "stop"
            if len(ids) > sampling.max_tokens:
                ids, finish = ids[: sampling.max_tokens], "length"
            return Generation(ids, [-1.0] * len(ids), self._version, finish)  # type: ignore[arg-type]
        finally:
            self.in_flight -= 1

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        for _ in named_tensors:
            pass
        self._version += 1
        return self._version

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        return self.update_weights(named_tensors)

    def close(self) -> None:
        pass


# --- real servers and a real browser, for tests and benchmarks ----------------------------------


def train_in_subprocess(
    config: str | Path, overrides: Sequence[str], run_dir: str | Path, *, export: bool = False
) -> float:
    """``agentrl train CONFIG OVERRIDES run_dir=RUN_DIR resume=false export=EXPORT`` in a process of
    its own (a fresh engine each time, for benchmarks that compare runs one after the other);
    returns its wall time in seconds. A failed run raises ``RuntimeError`` with the end of its stderr."""
    command = [sys.executable, "-m", "agentrl.cli", "train", str(config), *overrides]
    command += [f"run_dir={run_dir}", "resume=false", f"export={str(export).lower()}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.perf_counter() - started


def serve_in_subprocess(env_ids: Sequence[str], port: int, timeout: float = 60.0) -> Any:
    """``agentrl serve ENV_IDS --port PORT`` in a process of its own (its own session, so
    ``os.killpg`` stops it), returned once ``/healthz`` answers."""
    import httpx  # noqa: PLC0415

    command = [sys.executable, "-m", "agentrl.cli", "serve", *env_ids, "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"agentrl serve did not come up within {timeout:g} s")


def headless_chromium(window: str = "1400,1000") -> Any:
    """A selenium driver of Debian's ``chromium`` through its ``chromium-driver`` (nothing downloaded)."""
    import shutil  # noqa: PLC0415

    from selenium import webdriver  # noqa: PLC0415  (a dev dependency)
    from selenium.webdriver.chrome.options import Options  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        raise RuntimeError(
            "Debian's chromium and chromium-driver are not installed (scripts/install.sh installs them)."
        )
    options = Options()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={window}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


# --- the machine's Docker Engine, killed and started again (fault tests, benchmarks/chaos.py) ---------

DOCKERD_ARGV = ("dockerd", "--bridge=none", "--iptables=false")
"""How ``scripts/install.sh`` starts the engine (no bridge, no iptables: containers have no network)."""
DOCKERD_LOG = os.environ.get("DOCKERD_LOG", "/var/log/agentrl-dockerd.log")  # install.sh's default
DOCKERD_PID_FILES = ("/var/run/docker.pid", "/var/run/docker/containerd/containerd.pid")
"""dockerd's (default ``--pidfile``) and its containerd's: while the pid in one still exists, if only
as a zombie not yet reaped by init, a new dockerd refuses to start or waits on that dead containerd."""
DOCKERD_WAIT_S = 60.0  # install.sh's; a restart stops the dead engine's containers (10 s)


def dockerd_pid() -> int | None:
    """The pid of the local ``dockerd`` process that is alive (not a zombie), or None."""
    found = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    alive = [int(pid) for pid in found if process_state(int(pid)) not in (None, "Z")]
    return alive[0] if len(alive) == 1 else None


def process_state(pid: int) -> str | None:
    """``R``, ``S``, ``Z``... of ``pid`` (field 3 of ``/proc/<pid>/stat``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def engine_answers() -> bool:
    """Whether ``docker info`` answers."""
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def kill_dockerd() -> None:
    """SIGKILL the engine (its containers live on, without it) and wait until it is gone."""
    pid = dockerd_pid()
    if pid is None:
        raise RuntimeError("no dockerd process runs here to kill")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_state(pid) not in (None, "Z"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd {pid} outlived SIGKILL by 10 s")
        time.sleep(0.05)


def start_dockerd() -> None:
    """Start the engine as scripts/install.sh does (detached, its log appended to ``DOCKERD_LOG``)
    and wait until ``docker info`` answers; nothing is done if it answers already."""
    if engine_answers():
        return
    if dockerd_pid() is None:
        for pid_file in DOCKERD_PID_FILES:
            _forget_if_dead(pid_file)
        # Detached through `sh ... &`: dockerd's parent is init, not this process, so it is reaped when it dies.
        subprocess.run(
            ["setsid", "sh", "-c", '"$@" </dev/null >>"$AGENTRL_DOCKERD_LOG" 2>&1 &', "sh", *DOCKERD_ARGV],
            env={**os.environ, "AGENTRL_DOCKERD_LOG": DOCKERD_LOG},
            check=True,
        )
    deadline = time.monotonic() + DOCKERD_WAIT_S
    while not engine_answers():
        if time.monotonic() > deadline:
            log = Path(DOCKERD_LOG)
            tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
            raise RuntimeError(
                f"dockerd did not answer within {DOCKERD_WAIT_S:g} s; the end of {DOCKERD_LOG}:\n" + "\n".join(tail)
            )
        time.sleep(0.5)


def _forget_if_dead(pid_file: str) -> None:
    """Remove ``pid_file`` if its process is dead: gone, or still a zombie after 10 s."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 10
    while process_state(pid) == "Z" and time.monotonic() < deadline:
        time.sleep(0.1)  # init reaps it soon (dockerd's containerd dies with it, a zombie for a second)
    if process_state(pid) in (None, "Z"):
        os.remove(pid_file)
