"""A multi-agent env served by ``agentrl serve``, played as if it were here: :class:`RemoteParallelEnv`
and :class:`RemoteAECEnv`, PettingZoo envs whose ``reset`` / ``step`` are HTTP calls to one session.

Each agent's action space carries its tools' schemas and reply prefix from ``GET /envs`` (the tools
run on the server, in its ``step``), so an agent renders the same prompt as for the env in process.
The faults are :class:`~agentrl.server.remote.RemoteEnv`'s: retries for a busy or restarting
server, a session made again at the next ``reset`` when the server lost it, and an
:class:`~agentrl.server.remote.EnvServerError` for the episode otherwise (the rollout counts it).

>>> env = RemoteParallelEnv("http://127.0.0.1:8000", "agentrl/Negotiation-v0", split="test")  # doctest: +SKIP
>>> observations, infos = env.reset(seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

from agentrl.env import MessagesSpace, ReplySpace
from agentrl.server.remote import EnvClient, EnvServerError, _remote_tool
from agentrl.types import Message


class _Session:
    """One session of ``env_id`` on the server: made at the first reset, made again when the server
    lost it (404) or broke it (409), deleted at :meth:`close`."""

    def __init__(self, client: EnvClient, env_id: str, split: str | None, env_kwargs: Mapping[str, Any]):
        self.client, self.env_id = client, env_id
        self.create = {"env_id": env_id, "split": split, "env_kwargs": dict(env_kwargs)}
        self.id: str | None = None

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> Any:
        body = {"seed": seed, "options": options}
        if self.id is None:
            self.id = self._new()
        try:
            return self.client.request("POST", f"/sessions/{self.id}/reset", body)
        except EnvServerError as e:
            if e.status not in (404, 409):  # 404: expired or the server restarted; 409: broken
                raise
            if e.status == 409:
                self._delete_quietly(self.id)
            self.id = self._new()
            return self.client.request("POST", f"/sessions/{self.id}/reset", body)

    def step(self, body: dict[str, Any]) -> Any:
        if self.id is None:
            raise RuntimeError(
                f"{self.env_id} on {self.client.url}: step was called before reset(); call reset() first."
            )
        return self.client.request("POST", f"/sessions/{self.id}/step", body)

    def close(self) -> None:
        session_id, self.id = self.id, None
        if session_id is not None:
            self._delete_quietly(session_id)

    def _new(self) -> str:
        return str(self.client.request("POST", "/sessions", self.create)["session_id"])

    def _delete_quietly(self, session_id: str) -> None:
        try:
            self.client.request("DELETE", f"/sessions/{session_id}")
        except Exception:  # the server is gone, or already forgot it: nothing is left to close
            pass


class _RemoteAgents:
    """What both kinds share: the session, and the agents and their spaces from the server's
    description. ``split`` and ``env_kwargs`` go to the server when the session is made; ``client``
    shares connections among envs; ``spec`` is what ``GET /envs`` said of ``env_id``."""

    kind = ""

    def __init__(
        self,
        url: str,
        env_id: str,
        *,
        split: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        token: str | None = None,
        client: EnvClient | None = None,
        spec: Mapping[str, Any] | None = None,
    ):
        self.client = client or EnvClient(url, token)
        self._owns_client = client is None
        spec = spec or self.client.env_spec(env_id)
        if spec["kind"] != self.kind:
            raise TypeError(f"{env_id!r} on {self.client.url} is a {spec['kind']} env, not {self.kind}.")
        self._session = _Session(self.client, env_id, split, env_kwargs or {})
        self.possible_agents = list(spec["agents"])
        self.agents: list[str] = []
        self.metadata = {"name": f"remote:{env_id}", "is_parallelizable": self.kind == "parallel"}
        self._actions = {
            agent: ReplySpace([_remote_tool(s) for s in about["tools"]], reply_prefix=about["reply_prefix"])
            for agent, about in spec["agents"].items()
        }
        self._observations = {agent: MessagesSpace() for agent in self.possible_agents}

    def observation_space(self, agent: str) -> MessagesSpace:
        return self._observations[agent]

    def action_space(self, agent: str) -> ReplySpace:
        return self._actions[agent]

    def close(self) -> None:
        self._session.close()
        if self._owns_client:
            self.client.close()


class RemoteParallelEnv(_RemoteAgents, ParallelEnv[str, list[Message], Any]):
    """One session of a parallel multi-agent env on an env server (see the module docstring)."""

    kind = "parallel"

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        data = self._session.reset(seed, options)
        self.agents = list(data["agents"])
        return _observations(data), {a: dict(i) for a, i in data["infos"].items()}

    def step(self, actions: dict[str, Any]) -> Any:
        data = self._session.step({"actions": {a: _reply(r) for a, r in actions.items()}})
        self.agents = list(data["agents"])
        return (
            _observations(data),
            {a: float(r) for a, r in data["rewards"].items()},
            {a: bool(t) for a, t in data["terminations"].items()},
            {a: bool(t) for a, t in data["truncations"].items()},
            {a: dict(i) for a, i in data["infos"].items()},
        )


class RemoteAECEnv(_RemoteAgents, AECEnv[str, list[Message], Any]):
    """One session of a turn-based (AEC) multi-agent env on an env server (see the module docstring)."""

    kind = "aec"

    def __init__(self, url: str, env_id: str, **options: Any):
        super().__init__(url, env_id, **options)
        self._last: tuple[Any, ...] = ([], 0.0, True, False, {})
        self.agent_selection = ""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._took(self._session.reset(seed, options))

    def step(self, action: Any) -> None:
        self._took(
            self._session.step({"agent": self.agent_selection, "reply": None if action is None else _reply(action)})
        )

    def last(self, observe: bool = True) -> tuple[Any, ...]:
        """The selected agent's observation (the messages since it last acted), reward, termination,
        truncation and info."""
        return self._last

    def observe(self, agent: str) -> Any:
        return self._last[0] if agent == self.agent_selection else None

    def _took(self, data: Mapping[str, Any]) -> None:
        self.agents = list(data["agents"])
        self.agent_selection = data["agent_selection"] or ""
        observation = [Message.from_dict(m) for m in data["observation"] or []]
        self._last = (observation, float(data["reward"]), bool(data["termination"]), bool(data["truncation"]),
                      dict(data["info"]))  # fmt: skip


def remote_multiagent_factory(
    url: str, env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, token: str | None = None
) -> Callable[[], RemoteParallelEnv | RemoteAECEnv]:
    """A function making a fresh remote env of ``env_id`` each call, of the kind the server says,
    all sharing one :class:`EnvClient` and one read of ``GET /envs``. ``env_kwargs["split"]``, if
    set, is the session's split."""
    kwargs = dict(env_kwargs or {})
    split = kwargs.pop("split", None)
    client = EnvClient(url, token)
    spec = client.env_spec(env_id)
    kind = RemoteParallelEnv if spec["kind"] == "parallel" else RemoteAECEnv
    return lambda: kind(url, env_id, split=split, env_kwargs=kwargs, client=client, spec=spec)


def _observations(data: Mapping[str, Any]) -> dict[str, list[Message]]:
    return {a: [Message.from_dict(m) for m in messages] for a, messages in data["observations"].items()}


def _reply(action: Any) -> Any:
    if isinstance(action, Message):
        return action.to_dict()
    if isinstance(action, str):
        return action
    raise TypeError(
        f"a remote multi-agent env takes a reply as a str or an assistant Message, got {type(action).__name__}."
    )
