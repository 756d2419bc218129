"""``textarena/<Game>``: every TextArena game as a PettingZoo ``AECEnv`` in messages.

TextArena (``pip install textarena``, 0.7.x; Guertler et al., 2025) is a pack of turn-based text
games for one to many players: board games, card games, negotiation, deduction. Each of its ids
(``TicTacToe-v0``, ``KuhnPoker-v0-long``, ...) is made here as ``textarena/<id>``:

    env = agentrl.make_multiagent("textarena/TicTacToe-v0")

How a game maps onto agentrl's multi-agent contract (:mod:`agentrl.multiagent`):

- **agents**: ``player_0`` ... ``player_{n-1}``; TextArena's player id ``i`` is ``player_i``, and the
  game's own turn order picks ``agent_selection`` (an invalid move gives the same player another
  try where the game allows one).
- **observations**: what TextArena sent a player since its last turn, as one user message of
  ``[GAME] ...`` / ``[Player 1] ...`` lines (the format of TextArena's ``LLMObservationWrapper``,
  without its repetition of the whole history: the agent's own conversation keeps that). A
  player's own move is not echoed back. The game's rules are the first message; ``system_prompt``
  adds a system message before them.
- **actions**: the reply text, through the game's own action wrappers (``ActionFormattingWrapper``
  puts ``[...]`` around a reply that has none); its observation wrappers are not used.
- **rewards**: TextArena's, at the end, to every player (a win is +1, a loss -1, a draw 0 in
  two-player games; other games score their own way). The end is ``terminated``: turn limits are
  rules of the games.
- **info** at the end, per player: ``success`` (the reward is positive: a win) and ``textarena``:
  the game, the reward, ``outcome`` (``win``, ``loss`` or ``draw``: the reward's sign), ``moves``
  (replies sent), ``invalid_moves`` (replies the game refused), ``lost_by_invalid_move`` and the
  game's ``reason``.
- **seeds**: TextArena draws from the ``random`` module (and a few games from ``numpy.random``).
  Each env here keeps its own state of both, swapped in around its calls to the game under one
  lock, and each reset plays a fresh copy of the game as made, so episodes played side by side in
  one process do not share a stream and ``reset(seed=s)`` replays the same game.
- **players**: ``num_players`` (default: 2 where the game allows 2, else the fewest it allows).

Games that cannot run offline are refused with the reason when made (:data:`NEEDS_NETWORK`: a jury
or opponent that is a paid model on OpenRouter, or NLTK corpora downloaded at run time), as are
games whose module does not import on this Python (some use Python 3.12's f-strings) or whose
data files the wheel lacks; ``agentrl envs -n textarena`` lists every id with its players or the
reason.
"""

from __future__ import annotations

import copy
import importlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv

from agentrl.envs._random import OwnRandom
from agentrl.envs._split import check_split
from agentrl.multiagent import MessageList, MessageSpaces, register_multiagent
from agentrl.registry import register_namespace
from agentrl.types import Message, Trajectory

NAMESPACE = "textarena"
INSTALL_HINT = "pip install 'agentrl-platform[textarena]' (or: pip install 'textarena>=0.7.4,<0.8')"

_PAID_MODEL = "its jury or opponent is a paid model on OpenRouter (network and an API key)"
_NLTK = "it reads NLTK corpora, which NLTK downloads from the network at run time"
NEEDS_NETWORK: dict[str, str] = {
    "Debate": _PAID_MODEL,
    "GuessWho": _PAID_MODEL,
    "ScenarioPlanning": _PAID_MODEL,
    "TwentyQuestions": _PAID_MODEL,
    "Codenames": _NLTK,
    "DontSayIt": _NLTK,
    "Hangman": _NLTK,
    "LetterAuction": _NLTK,
    "SpellingBee": _NLTK,
    "WordChains": _NLTK,
    "WordLadder": _NLTK,
    "WordSearch": _NLTK,
    "Wordle": _NLTK,
}
"""TextArena 0.7's game families (the folder under ``textarena.envs``) that cannot run offline, and why."""

MAX_PLAYERS = 8
"""The most players a game is tried with when its default count is looked for."""
_WRAPPER_SUFFIXES = ("-train", "-raw")


class GameUnavailable(RuntimeError):
    """A TextArena game that cannot be played here (network, Python version, missing data)."""


class GameStuck(RuntimeError):
    """A TextArena game that cannot go on from where it is (a bug of the game): the episode fails,
    counted as an env error."""


def game_ids() -> list[str]:
    """TextArena's game ids, without the ``-train`` / ``-raw`` copies of an id that differ from it
    only in TextArena's observation wrappers (this adapter formats observations itself)."""
    registry = _textarena_registry()
    ids = []
    for game_id, game_spec in registry.items():
        base = next((game_id[: -len(s)] for s in _WRAPPER_SUFFIXES if game_id.endswith(s)), None)
        if base in registry and registry[base].kwargs == game_spec.kwargs:
            continue
        ids.append(game_id)
    return ids


def register_games() -> None:
    """Register every TextArena game as ``textarena/<id>`` (the registry calls this the first time
    a ``textarena/`` id is asked for or listed)."""
    for game_id in game_ids():
        # An id of TextArena's may hold a "/" (Taboo-v0-city/country), which a namespace/Name id cannot.
        register_multiagent(f"{NAMESPACE}/{game_id.replace('/', '-')}", TextArenaEnv, {"game": game_id})


class TextArenaEnv(MessageSpaces, AECEnv[str, MessageList, "str | Message | None"]):
    """A TextArena game: its players take turns, each reading the game's messages and replying with a move."""

    metadata: dict[str, Any] = {"name": "textarena", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        game: str,
        split: str = "train",
        num_players: int | None = None,
        system_prompt: str | None = None,
        max_moves: int | None = None,
        render_mode: str | None = None,
        **game_kwargs: Any,
    ):
        """
        Args:
            game: a TextArena id, e.g. ``TicTacToe-v0``.
            split: ``train`` or ``test``, as agentrl's evaluation asks; a game has no task list to
                split, so held-out episodes differ from training ones by their seeds only (the
                evaluation's are offset) and by who plays the other seats.
            num_players: how many play (default: 2 where the game allows it, else its fewest).
            system_prompt: a system message each player reads before the game's rules.
            max_moves: end the episode as truncated (a cut, not a rule of the game: every reward 0)
                after this many replies in all; ``None``: when the game ends. A game may run on
                without end: TextArena 0.7.4's Poker keeps dealing to a player with no chips left
                who replies with invalid moves. A training run's ``rollout.max_turns`` cuts each
                player's turns either way.
            render_mode: ``None`` or ``ansi`` (the game's board, where it draws one).
            game_kwargs: override the game's registered arguments (e.g. ``max_turns``).
        """
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        if max_moves is not None and max_moves < 1:
            raise ValueError(f"max_moves must be a positive number of replies or None, got {max_moves!r}.")
        self.max_moves = max_moves
        self.game_id = game
        self.split = check_split(split)
        self.system_prompt = system_prompt
        self.render_mode = render_mode
        self._new_game = _make_game(game, game_kwargs)
        self.game = copy.deepcopy(self._new_game)
        self._random = OwnRandom()
        self.num_players = num_players if num_players is not None else self._default_players()
        self.metadata = {**self.metadata, "name": f"textarena_{game}"}
        self.possible_agents = [f"player_{i}" for i in range(self.num_players)]
        self.agents: list[str] = []
        self._make_spaces(self.possible_agents)
        self._pending: dict[str, list[Message]] = {}
        self._moves: dict[str, int] = {}
        self._invalid: dict[str, int] = {}
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection = self.possible_agents[0]

    # --- PettingZoo ---------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._seed(seed)
        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        self._random.seed(game_seed)
        # A fresh copy of the game as made: some games keep what they drew in the game object, not
        # in its state (KuhnPoker shuffles its deck in place), so a reused one would not replay a seed.
        self.game = copy.deepcopy(self._new_game)
        with self._random.swapped_in():
            self.game.reset(num_players=self.num_players, seed=game_seed)
        self._watch_state()
        self.agents = list(self.possible_agents)
        self._pending = {a: [] for a in self.agents}
        if self.system_prompt:
            for agent in self.agents:
                self._pending[agent].append(Message("system", self.system_prompt))
        self._moves = {a: 0 for a in self.agents}
        self._invalid = {a: 0 for a in self.agents}
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._deliver()

    def observe(self, agent: str) -> MessageList:
        """The messages ``agent`` has not seen yet (what came since its last turn)."""
        return MessageList(self._pending.get(agent, []))

    def step(self, action: str | Message | None) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(action)
            return
        if not self.agents:
            raise RuntimeError("TextArenaEnv.step was called outside an episode; call reset() first.")
        if action is None:
            raise ValueError(f"TextArenaEnv.step needs {agent}'s reply (text or an assistant Message), got None.")
        text = action.content if isinstance(action, Message) else str(action)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self._pending[agent] = []
        self._moves[agent] += 1
        with self._random.swapped_in():
            done, _ = self.game.step(action=text)
        if done:
            self._finish()
        elif self.max_moves is not None and sum(self._moves.values()) >= self.max_moves:
            self._finish(cut=True)
        else:
            self._deliver()
        self._accumulate_rewards()

    def render(self) -> str | None:
        if self.render_mode != "ansi" or not self.agents:
            return None
        board = getattr(self.game, "get_board_str", None)
        return board() if callable(board) else None

    def close(self) -> None:
        pass  # a TextArena game holds nothing to free; its own close() scores the game (see _finish)

    # --- the game ------------------------------------------------------------------------------------

    @property
    def _state(self) -> Any:
        return self.game.state

    def _agent(self, player_id: int) -> str:
        return f"player_{player_id}"

    def _deliver(self) -> None:
        """Hand the player whose turn it is what the game sent it, and select it."""
        player_id, observation = self.game.get_observation()
        agent = self._agent(player_id)
        text = self._format(player_id, observation)
        self._pending[agent].append(Message("user", text or "[GAME] It is your turn."))
        self.agent_selection = agent

    def _finish(self, cut: bool = False) -> None:
        """The game is over (``cut``: the episode is, at ``max_moves``): pay every player, and hand
        each the messages it has not seen (the result)."""
        rewards = {} if cut else self._state.rewards or {}
        game_info = {} if cut else getattr(self._state, "game_info", {}) or {}
        for player_id, agent in enumerate(self.possible_agents):
            info = game_info.get(player_id, {})
            reason = f"cut after {self.max_moves} moves (max_moves)" if cut else str(info.get("reason", ""))
            text = self._format(player_id, self._state.observations.get(player_id, []))
            self._state.observations[player_id] = []
            if reason and reason not in text:  # TextArena keeps the result in game_info; say it
                text = f"{text}\n[GAME] Game over: {reason}".strip()
            if text:
                self._pending[agent].append(Message("user", text))
            reward = float(rewards.get(player_id, 0.0))
            self.rewards[agent] = reward
            self.terminations[agent] = not cut
            self.truncations[agent] = cut
            self.infos[agent] = {
                "success": reward > 0,
                "textarena": {
                    "game": self.game_id,
                    "reward": reward,
                    "outcome": "unfinished" if cut else "win" if reward > 0 else "loss" if reward < 0 else "draw",
                    "moves": self._moves[agent],
                    "invalid_moves": self._invalid[agent],
                    "lost_by_invalid_move": bool(info.get("invalid_move", False)),
                    "reason": reason,
                },
            }
        self.agent_selection = self.agents[0]

    def _format(self, player_id: int, observation: Any) -> str:
        """TextArena's ``(sender, message, kind)`` tuples as ``[sender] message`` lines, leaving out
        the player's own moves."""
        if isinstance(observation, str):  # a game that formats its own observations
            return observation.strip()
        import textarena as ta

        roles = getattr(self._state, "role_mapping", {}) or {}
        lines = []
        for sender, message, kind in observation:
            if sender == player_id and kind == ta.ObservationType.PLAYER_ACTION:
                continue
            name = "GAME" if sender == ta.GAME_ID else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}")
        return "\n".join(lines).strip()

    def _watch_state(self) -> None:
        """Count each move the game refuses (TextArena's states report one through
        ``set_invalid_move``, called while the mover is ``agent_selection``), and refuse to pass the
        turn when every player is eliminated but the game is not over: TextArena 0.7.4's
        ``FFAMultiPlayerState.step`` then looks for a live player forever (PublicGoodsGame, when
        both players' invalid moves eliminate them), holding the lock every game here needs."""
        state = self._state
        refuse: Callable[..., Any] = state.set_invalid_move
        pass_turn: Callable[..., Any] = state.step

        def set_invalid_move(*args: Any, **kwargs: Any) -> Any:
            self._invalid[self.agent_selection] += 1
            return refuse(*args, **kwargs)

        def step(*args: Any, **kwargs: Any) -> Any:
            eliminated = set(getattr(state, "elimination_order", ()))
            if not state.done and len(eliminated) >= state.num_players:
                raise GameStuck(
                    f"TextArena's {self.game_id} eliminated every player without ending the game (its state "
                    "would look for a live player forever, a bug of TextArena 0.7.4); this episode cannot go on."
                )
            return pass_turn(*args, **kwargs)

        state.set_invalid_move = set_invalid_move
        state.step = step

    def _default_players(self) -> int:
        """2 where the game allows two players, else the fewest it allows (its reset refuses the rest)."""
        errors = []
        for n in (2, *(k for k in range(1, MAX_PLAYERS + 1) if k != 2)):
            try:
                with self._random.swapped_in():
                    self.game.reset(num_players=n, seed=0)
                return n
            except (AssertionError, ValueError) as e:
                errors.append(f"{n}: {e}")
            except (FileNotFoundError, LookupError) as e:  # data the wheel lacks, or a corpus to download
                raise GameUnavailable(f"TextArena's {self.game_id} lacks its data here: {type(e).__name__}: {e}") from e
        raise GameUnavailable(
            f"TextArena's {self.game_id} could not be reset with 1 to {MAX_PLAYERS} players "
            f"({'; '.join(errors[:3])}); pass num_players= the game allows."
        )


def game_metrics(
    policy_id: str, samples: Sequence[Trajectory], previous: Sequence[Mapping[str, float]]
) -> dict[str, float]:
    """A ``metrics_fn`` for TextArena runs: of ``samples``' games (those that ended), the shares
    ``win``, ``draw`` and ``loss``; ``invalid_move_rate``, the share of the policy's moves the game
    refused; ``lost_by_invalid_move``, the share of games lost that way. Logged per training step
    and, before and after training, of the held-out games (``.../held_out/...``)."""
    games = [t.info["textarena"] for t in samples if "textarena" in t.info]
    if not games:
        return {}
    outcomes = Counter(g["outcome"] for g in games)
    moves = sum(g["moves"] for g in games)
    return {
        **{outcome: outcomes[outcome] / len(games) for outcome in ("win", "draw", "loss")},
        "invalid_move_rate": sum(g["invalid_moves"] for g in games) / max(moves, 1),
        "lost_by_invalid_move": sum(g["lost_by_invalid_move"] for g in games) / len(games),
    }


def env(**kwargs: Any) -> TextArenaEnv:
    """The env as an ``AECEnv`` (PettingZoo's module convention)."""
    return TextArenaEnv(**kwargs)


register_namespace(NAMESPACE, register_games)


def _textarena_registry() -> dict[str, Any]:
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"textarena/ ids need the textarena package: {INSTALL_HINT}.") from e
    return ENV_REGISTRY


def _make_game(game_id: str, overrides: dict[str, Any]) -> Any:
    """TextArena's game ``game_id`` with its action wrappers (not its observation wrappers), or
    :class:`GameUnavailable` saying why it cannot run here."""
    import textarena as ta

    registry = _textarena_registry()
    if game_id not in registry:
        from agentrl.suggest import did_you_mean

        hint = did_you_mean(game_id, list(registry)) or "Run `agentrl envs -n textarena` for the list."
        raise ValueError(f"TextArena has no game {game_id!r}. {hint}")
    game_spec = registry[game_id]
    entry_point = game_spec.entry_point
    family = entry_point.split(".")[2] if isinstance(entry_point, str) and entry_point.count(".") >= 2 else ""
    if family in NEEDS_NETWORK:
        raise GameUnavailable(f"TextArena's {game_id} cannot be played offline: {NEEDS_NETWORK[family]}.")
    try:
        if isinstance(entry_point, str):
            module, name = entry_point.split(":")
            game_class = getattr(importlib.import_module(module), name)
        else:
            game_class = entry_point
    except SyntaxError as e:
        raise GameUnavailable(
            f"TextArena's {game_id} does not import on this Python ({e.msg} in {e.filename}, line "
            f"{e.lineno}): its code needs a newer Python (3.12 allows nested quotes in f-strings)."
        ) from e
    except ImportError as e:
        raise GameUnavailable(f"TextArena's {game_id} needs a package that is not installed: {e}.") from e
    try:
        game = game_class(**{**game_spec.kwargs, **overrides})
    except (FileNotFoundError, LookupError) as e:
        raise GameUnavailable(f"TextArena's {game_id} lacks its data here: {type(e).__name__}: {e}".strip()) from e
    for wrapper in game_spec.default_wrappers or []:
        if issubclass(wrapper, ta.ActionWrapper):
            game = wrapper(game)
    return game
