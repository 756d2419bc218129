"""The ``agentrl`` command line: ``envs``, ``check`` and ``play``, through typer's CliRunner and once
through the installed console script; every command's user errors (one message, exit 2, no
traceback); ``agentrl train``'s summary table, printed from a fake result."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import gymnasium as gym
import pytest
import typer
from gymnasium.spaces import Discrete
from pettingzoo import ParallelEnv
from typer.testing import CliRunner

import agentrl
from agentrl import AgentEnv, Feedback, Message, tool
from agentrl.cli import app
from agentrl.cli.common import parse_kwargs
from agentrl.envs.negotiation import NegotiationEnv
from agentrl.registry import _MULTIAGENT

BUILTIN_IDS = ("agentrl/Calculator-v0", "agentrl/CodeBreaker-v0", "agentrl/Countdown-v0")
BUILTINS = agentrl.registered_ids("agentrl")
# CodeSandbox runs its code in Docker when the engine and image answer (the guard in conftest.py).
BUILTIN_PARAMS = [pytest.param(i, marks=pytest.mark.docker) if "CodeSandbox" in i else i for i in BUILTINS]

runner = CliRunner()


@tool
def shout(text: str) -> str:
    """Repeat a text in capitals.

    Args:
        text: What to shout.
    """
    return text.upper()


class Parrot(AgentEnv):
    """Repeat the secret number back."""

    tools = (shout,)

    def start(self, options):
        self.secret = int(self.np_random.integers(1000, 10000))
        return [Message("system", "You repeat numbers."), Message("user", f"Repeat {self.secret}.")]

    def respond(self, reply):
        if reply.tool_calls:
            return self.call_tools(reply)
        won = reply.content.strip() == str(self.secret)
        return Feedback([Message("user", "Correct." if won else "Try again.")], reward=float(won), terminated=won)


class Unseeded(Parrot):
    """Draws its task from the global random module, so the same seed gives different tasks."""

    def start(self, options):
        self.secret = random.randint(1000, 10**9)
        return [Message("user", f"Repeat {self.secret}.")]


class Crashing(Parrot):
    """Raises on every reply."""

    def respond(self, reply):
        raise RuntimeError("boom")


class Interrupted(Parrot):
    """Stands for a person pressing Ctrl-C while an episode starts."""

    def start(self, options):
        raise KeyboardInterrupt


TEST_ENVS = {
    "clitest/Parrot-v0": Parrot,
    "clitest/Unseeded-v0": Unseeded,
    "clitest/Crashing-v0": Crashing,
    "clitest/Interrupted-v0": Interrupted,
    "clitest/Missing-v0": "clitest_no_such_module:Env",
}


@pytest.fixture
def test_envs():
    """Register the envs above for one test only, so other test modules never see them."""
    for env_id, entry_point in TEST_ENVS.items():
        agentrl.register(env_id, entry_point)
    yield
    for env_id in TEST_ENVS:
        del gym.registry[env_id]


def invoke(*args: str, input: str | None = None):
    result = runner.invoke(app, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def secret_for(seed: int) -> int:
    env = agentrl.make("clitest/Parrot-v0")
    env.reset(seed=seed)
    return env.secret


# --- envs ---------------------------------------------------------------------------------------


def test_builtins_are_registered():
    assert set(BUILTIN_IDS) <= set(BUILTINS)


def test_envs_lists_every_builtin_with_its_description():
    result = invoke("envs")
    assert result.exit_code == 0, result.output
    for env_id in BUILTINS:
        assert env_id in result.output
        assert agentrl.describe(env_id)[:30] in " ".join(result.output.split())


def test_envs_lists_multiagent_envs_with_their_agents():
    ids = agentrl.multiagent_ids("agentrl")
    assert "agentrl/Negotiation-v0" in ids
    result = invoke("envs")
    assert result.exit_code == 0, result.output
    assert "multi-agent" in result.output
    for env_id in ids:
        env = agentrl.make_multiagent(env_id)
        agents = list(env.possible_agents)
        env.close()
        assert env_id in result.output
        for agent in agents:
            assert agent in result.output


def test_envs_in_an_unknown_namespace_suggest_a_known_one():
    result = invoke("envs", "--namespace", "agentrll")
    assert result.exit_code == 0, result.output
    assert "No message envs are registered in namespace 'agentrll'. Did you mean 'agentrl'?" in result.output


def test_envs_shows_a_broken_env_in_its_row(test_envs):
    result = invoke("envs", "--namespace", "clitest")
    assert result.exit_code == 0, result.output
    assert "Repeat the secret number back." in result.output
    assert "could not load: ModuleNotFoundError" in result.output
    assert "agentrl/" not in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"agentrl {agentrl.__version__}"


# --- check --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", BUILTIN_PARAMS)
def test_check_passes_on_every_builtin(env_id):
    result = invoke("check", env_id, "--seed", "3")
    assert result.exit_code == 0, result.output
    assert "passed" in result.output


def test_check_reports_a_broken_env_and_exits_1(test_envs):
    result = invoke("check", "clitest/Unseeded-v0")
    assert result.exit_code == 1
    assert "clitest/Unseeded-v0 failed the check" in result.output
    assert "same observation" in result.output


@pytest.mark.parametrize("env_id", agentrl.multiagent_ids("agentrl"))
def test_check_runs_the_multiagent_checker_on_multiagent_ids(env_id):
    result = invoke("check", env_id, "--seed", "3")
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert f"passed: {env_id}" in output and "multi-agent env contract" in output
    if isinstance(agentrl.make_multiagent(env_id), ParallelEnv):  # checked as registered and as an AECEnv
        assert "as a ParallelEnv: PettingZoo's parallel_api_test" in output
        assert "as an AECEnv (api='aec'): PettingZoo's api_test" in output
    else:
        assert "as an AECEnv: PettingZoo's api_test" in output


def negotiation_with_discrete_actions() -> NegotiationEnv:
    env = NegotiationEnv()
    env._action_spaces = {agent: Discrete(3) for agent in env.possible_agents}
    return env


def test_check_reports_a_broken_multiagent_env_and_exits_1():
    agentrl.register_multiagent("clitest/DiscreteNegotiation-v0", negotiation_with_discrete_actions)
    try:
        result = invoke("check", "clitest/DiscreteNegotiation-v0")
    finally:
        del _MULTIAGENT["clitest/DiscreteNegotiation-v0"]
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert "clitest/DiscreteNegotiation-v0 failed the check as a ParallelEnv" in output
    assert "NegotiationEnv.action_space('trader_0') to be an agentrl.ReplySpace" in output


def test_check_unknown_id_suggests_and_exits_2(test_envs):
    result = invoke("check", "clitest/Parot-v0")
    assert result.exit_code == 2
    assert "Did you mean 'clitest/Parrot-v0'" in result.output
    assert "Traceback" not in result.output


def test_check_rejects_kwargs_without_equals_sign(test_envs):
    result = invoke("check", "clitest/Parrot-v0", "--kwarg", "max_turns")
    assert result.exit_code == 2
    assert "key=value" in result.output


# --- kwargs -------------------------------------------------------------------------------------


def test_kwargs_are_json_when_they_parse_else_strings():
    parsed = parse_kwargs(["n=3", "split=test", "words=[1, 2]", "flag=true", 'quoted="3"', "empty=", "x=a=b"])
    assert parsed == {
        "n": 3,
        "split": "test",
        "words": [1, 2],
        "flag": True,
        "quoted": "3",
        "empty": "",
        "x": "a=b",
    }


@pytest.mark.parametrize("bad", ["max_turns", "=3", "two words=1", "1x=2"])
def test_malformed_kwargs_say_what_was_expected(bad):
    with pytest.raises(typer.BadParameter, match="expected key=value"):
        parse_kwargs([bad])


def test_kwargs_the_env_rejects_exit_2_without_traceback(test_envs):
    result = invoke("play", "clitest/Parrot-v0", "--kwarg", "colour=red", input="")
    assert result.exit_code == 2
    assert "Could not make 'clitest/Parrot-v0'" in result.output and "colour" in result.output


# --- play, random agent -------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", BUILTIN_PARAMS)
def test_random_agent_plays_every_builtin_to_the_end(env_id):
    result = invoke("play", env_id, "--agent", "random", "--seed", "0", "--episodes", "2")
    assert result.exit_code == 0, result.output
    assert "assistant" in result.output and "user" in result.output
    assert "episode 2/2" in result.output and "mean return" in result.output


def test_random_agent_is_capped_and_reproducible(test_envs):
    first = invoke("play", "clitest/Parrot-v0", "--agent", "random", "--seed", "5")
    assert first.exit_code == 0, first.output
    assert "turn cap (20)" in first.output  # Parrot has no turn limit of its own
    assert first.output == invoke("play", "clitest/Parrot-v0", "--agent", "random", "--seed", "5").output
    short = invoke("play", "clitest/Parrot-v0", "--agent", "random", "--seed", "5", "--max-turns", "3")
    assert "turn cap (3)" in short.output and "'turn': 4" not in short.output


def test_env_that_raises_while_playing_exits_1(test_envs):
    result = invoke("play", "clitest/Crashing-v0", "--agent", "random", "--seed", "0")
    assert result.exit_code == 1
    assert "raised while playing: RuntimeError: boom" in result.output


# --- play, human --------------------------------------------------------------------------------


def test_human_wins_with_the_right_answer(test_envs):
    secret = secret_for(7)
    result = invoke("play", "clitest/Parrot-v0", "--seed", "7", input=f"\n\n12\n\n{secret}\n\n")
    assert result.exit_code == 0, result.output
    assert f"Repeat {secret}." in result.output
    assert result.output.index("Try again.") < result.output.index("Correct.")
    assert "reward 1  terminated True" in result.output
    assert "mean return 1 over 1 episode(s)" in result.output


def test_human_reply_spans_lines_until_an_empty_line(test_envs):
    result = invoke("play", "clitest/Parrot-v0", "--seed", "1", input="first line\nsecond line\n\n")
    assert result.exit_code == 0, result.output
    assert "first line" in result.output and "second line" in result.output  # echoed: stdin is no tty
    assert "'turn': 1" in result.output and "'turn': 2" not in result.output
    assert "end of input" in result.output


def test_human_can_call_tools_and_sees_them_listed(test_envs):
    call = '{"name": "shout", "arguments": {"text": "hey there"}}'
    result = invoke("play", "clitest/Parrot-v0", "--seed", "1", input=f"{call}\n\n")
    assert result.exit_code == 0, result.output
    assert "tools you can call" in result.output and "shout" in result.output
    assert "HEY THERE" in result.output


def test_end_of_input_sends_the_last_line_and_stops_all_episodes(test_envs):
    secret = secret_for(2)
    result = invoke("play", "clitest/Parrot-v0", "--seed", "2", "--episodes", "3", input=str(secret))
    assert result.exit_code == 0, result.output
    assert "Correct." in result.output and "episode 2/3" in result.output
    assert "episode 3/3" not in result.output and "end of input" in result.output


def test_env_turn_limit_truncates_human_play(test_envs):
    result = invoke("play", "clitest/Parrot-v0", "-k", "max_turns=2", input="a\n\nb\n\nc\n\n")
    assert result.exit_code == 0, result.output
    assert "truncated True" in result.output and "'turn': 3" not in result.output


@pytest.mark.parametrize("env_id", BUILTIN_PARAMS)
def test_human_plays_every_builtin_until_end_of_input(env_id):
    result = invoke("play", env_id, "--seed", "0", "--split", "test", input="I am not sure.\n\n42\n\n")
    assert result.exit_code == 0, result.output
    assert "I am not sure." in result.output and "summary" in result.output


# --- user errors: one message, exit 2, no traceback, on every command ----------------------------


@pytest.fixture
def paths(tmp_path):
    """A model directory and a config file that do not exist, a config that does, a run dir."""
    config = tmp_path / "train.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nrollout:\n  backend: hf\n  model: {tmp_path / 'no-model'}\n")
    return {
        "model": str(tmp_path / "no-model"),
        "missing": str(tmp_path / "missing.yaml"),
        "config": str(config),
        "run_dir": str(tmp_path / "run"),
    }


def rollout_args(command, env_id="agentrl/Calculator-v0", *extra):
    return lambda p: [command, env_id, "--backend", "hf", "--model", p["model"], *extra]


def train_args(*extra):
    return lambda p: ["train", p["config"], *extra]


# (command line, a fragment of the message); every kind of user error on every command it applies to.
USER_ERRORS = {
    "check: unknown env": (lambda p: ["check", "agentrl/Calculater-v0"], "Did you mean 'agentrl/Calculator-v0'"),
    "check: rejected multi-agent kwarg": (
        lambda p: ["check", "agentrl/Negotiation-v0", "-k", "max_rounds=0"],
        "Could not make 'agentrl/Negotiation-v0'",
    ),
    "check: malformed kwarg": (lambda p: ["check", "agentrl/Calculator-v0", "-k", "max_turns"], "key=value"),
    "check: rejected kwarg": (lambda p: ["check", "agentrl/Calculator-v0", "-k", "colour=1"], "colour"),
    "play: unknown env": (lambda p: ["play", "agentrl/Calculater-v0"], "Did you mean 'agentrl/Calculator-v0'"),
    "play: malformed kwarg": (lambda p: ["play", "agentrl/Calculator-v0", "-k", "=3"], "key=value"),
    "play: rejected kwarg": (lambda p: ["play", "agentrl/Calculator-v0", "-k", "colour=red"], "Could not make"),
    "rollout: unknown env": (rollout_args("rollout", "agentrl/Calculater-v0"), "Did you mean 'agentrl/Calculator-v0'"),
    "rollout: missing model": (rollout_args("rollout", "agentrl/Calculator-v0", "--episodes", "1"), "no-model"),
    "rollout: bad value": (
        rollout_args("rollout", "agentrl/Calculator-v0", "temperature=hot"),
        "RolloutConfig.temperature must be a number, got 'hot'",
    ),
    "rollout: bad combination": (
        rollout_args("rollout", "agentrl/Calculator-v0", "episodes=3", "group_size=2"),
        "episodes 3 is not a multiple of group_size 2",
    ),
    "rollout: unknown field": (
        rollout_args("rollout", "agentrl/Calculator-v0", "temprature=0.5"),
        "Did you mean 'temperature'",
    ),
    "rollout: missing config": (
        lambda p: ["rollout", "agentrl/Calculator-v0", "--config", p["missing"]],
        "Cannot read config",
    ),
    "rollout: malformed override": (
        rollout_args("rollout", "agentrl/Calculator-v0", "temperature"),
        "must look like key=value",
    ),
    "eval: unknown env": (rollout_args("eval", "agentrl/Calculater-v0"), "Did you mean 'agentrl/Calculator-v0'"),
    "eval: missing model": (rollout_args("eval", "agentrl/Calculator-v0", "--episodes", "1"), "no-model"),
    "eval: bad value": (
        rollout_args("eval", "agentrl/Calculator-v0", "backend=nope"),
        "RolloutConfig.backend must be one of",
    ),
    "eval: unknown field": (rollout_args("eval", "agentrl/Calculator-v0", "epsiodes=4"), "Did you mean 'episodes'"),
    "eval: missing config": (
        lambda p: ["eval", "agentrl/Calculator-v0", "--config", p["missing"]],
        "Cannot read config",
    ),
    "eval: malformed override": (rollout_args("eval", "agentrl/Calculator-v0", "=4"), "must look like key=value"),
    "train: unknown env": (train_args("rollout.env_id=agentrl/Calculater-v0"), "Did you mean 'agentrl/Calculator-v0'"),
    "train: missing model": (train_args("steps=1"), "no-model"),
    "train: bad value": (train_args("trainer.lr=abc"), "TrainerConfig.lr must be a number, got 'abc'"),
    "train: bad combination": (train_args("rollout.temperature=0"), "rollout.temperature must be above 0"),
    "train: unknown field": (train_args("trainr.lr=1e-5"), "Did you mean 'trainer'"),
    "train: missing config": (lambda p: ["train", p["missing"]], "Cannot read config"),
    "train: malformed override": (train_args("steps"), "must look like key=value"),
    "train: failing import": (
        train_args("imports=[agentrl_no_such_module]"),
        "imports: cannot import 'agentrl_no_such_module'",
    ),
    "plot: missing run dir": (lambda p: ["plot", p["run_dir"]], "No metrics.jsonl"),
    "envs: unknown option": (lambda p: ["envs", "--colour"], "No such option"),
    "sandbox: unknown option": (lambda p: ["sandbox", "check", "--colour"], "No such option"),
}


@pytest.mark.parametrize("case", USER_ERRORS)
def test_user_errors_print_one_message_and_exit_2(case, paths):
    args, message = USER_ERRORS[case]
    result = invoke(*args(paths), input="")  # invoke re-raises any exception that escaped the CLI
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_agentrl_traceback_shows_the_traceback_of_a_usage_error(monkeypatch):
    monkeypatch.setenv("AGENTRL_TRACEBACK", "1")
    with pytest.raises(agentrl.UnknownEnvError, match="Did you mean 'agentrl/Calculator-v0'"):
        invoke("check", "agentrl/Calculater-v0")


def test_ctrl_c_exits_130(test_envs):
    result = invoke("check", "clitest/Interrupted-v0")
    assert result.exit_code == 130
    assert "interrupted" in result.output


@pytest.mark.e2e  # the console script in a fresh interpreter
@pytest.mark.parametrize(
    "args",
    [
        ["rollout", "agentrl/Calculater-v0", "--backend", "hf", "--model", "/nonexistent"],
        ["eval", "agentrl/Calculater-v0", "--backend", "hf", "--model", "/nonexistent"],
        ["train", "rollout.env_id=agentrl/Calculater-v0", "rollout.backend=hf", "rollout.model=/nonexistent"],
    ],
    ids=["rollout", "eval", "train"],
)
def test_console_script_typo_on_model_commands_is_one_line(args, tmp_path):
    typo = subprocess.run(
        [agentrl_script(), *args], check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert typo.returncode == 2, typo.stderr
    assert "Traceback" not in typo.stderr + typo.stdout
    lines = typo.stderr.strip().splitlines()
    assert len(lines) == 1, typo.stderr  # the message alone, not 30 lines of traceback above it
    assert "Unknown env 'agentrl/Calculater-v0'" in lines[0] and "Did you mean 'agentrl/Calculator-v0'" in lines[0]


# --- the installed console script ---------------------------------------------------------------


def agentrl_script() -> str:
    """The console script installed next to this interpreter (not whatever is first on PATH)."""
    script = Path(sysconfig.get_path("scripts")) / "agentrl"
    if script.exists():
        return str(script)
    found = shutil.which("agentrl")
    assert found, "the agentrl console script is not installed; run pip install -e ."
    return found


def test_console_script_lists_envs_and_suggests_on_typos():
    listing = subprocess.run([agentrl_script(), "envs"], check=False, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    for env_id in (*BUILTIN_IDS, "agentrl/Negotiation-v0"):
        assert env_id in listing.stdout
    typo = subprocess.run(
        [agentrl_script(), "check", "agentrl/Calculater-v0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert typo.returncode == 2
    assert "Did you mean 'agentrl/Calculator-v0'" in typo.stderr
    assert "Traceback" not in typo.stderr + typo.stdout


def test_module_entry_point_matches_script():
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "--version"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == f"agentrl {agentrl.__version__}"


def test_human_solves_a_calculator_problem():
    env = agentrl.make("agentrl/Calculator-v0", split="test")
    env.reset(seed=4)
    answer = env.step("Answer: nothing")[4]["answer"]  # the env reveals the answer when it grades
    result = invoke("play", "agentrl/Calculator-v0", "--seed", "4", "--split", "test", input=f"Answer: {answer:g}\n\n")
    assert result.exit_code == 0, result.output
    assert "reward 1  terminated True" in result.output


def test_rollout_plays_a_multi_agent_env_with_one_policy(tiny_model_dir, tmp_path):
    out = tmp_path / "negotiation.jsonl"
    result = runner.invoke(
        app,
        ["rollout", "agentrl/Negotiation-v0", "--backend", "hf", "--model", str(tiny_model_dir), "--episodes", "2",
         "max_turns=2", "max_tokens=8", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "episodes" in result.output and len(out.read_text().splitlines()) == 4  # one trajectory per agent


class LosesItsBackendOnce(AgentEnv):
    """Say b; the first and third episodes to start lose their backend, as a sandbox's would."""

    started = 0

    def __init__(self, split: str = "train"):
        super().__init__(max_turns=1)

    def start(self, options: dict | None) -> list[Message]:
        number, LosesItsBackendOnce.started = LosesItsBackendOnce.started, LosesItsBackendOnce.started + 1
        if number in (0, 2):
            raise ConnectionError("the sandbox backend does not answer")
        return [Message("user", "Say b")]

    def respond(self, reply: Message) -> Feedback:
        return Feedback([], reward=1.0, terminated=True)


def test_rollout_counts_the_episodes_played_again_after_a_fault(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(LosesItsBackendOnce, "started", 0)
    if "tests/LosesItsBackendOnce-v0" not in agentrl.registered_ids():
        agentrl.register("tests/LosesItsBackendOnce-v0", entry_point=LosesItsBackendOnce)
    result = runner.invoke(
        app,
        ["rollout", "tests/LosesItsBackendOnce-v0", "--backend", "hf", "--model", str(tiny_model_dir),
         "--episodes", "3", "concurrency=1", "max_tokens=2"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {" ".join(line.strip("│ ").split("│")[0].split()): line.split("│")[-2].strip()
            for line in result.output.splitlines() if line.startswith("│")}  # fmt: skip
    assert rows["episodes"] == "3" and rows["failures"] == "0 (none)"
    assert rows["played again after a fault"] == "2"


# --- agentrl train's summary ------------------------------------------------------------------


def train_summary(capsys, **result_fields) -> tuple[str, list[str]]:
    """The printed summary of a fake TrainResult: its text with whitespace runs made one space, and
    its table's rows as "label │ before │ after"."""
    from types import SimpleNamespace

    from agentrl.cli.train import _print_train_summary

    config = SimpleNamespace(
        rollout=SimpleNamespace(env_id="agentrl/Negotiation-v0", model="tiny"),
        trainer=SimpleNamespace(algorithm="grpo"),
    )
    result = SimpleNamespace(steps=8, run_dir=Path("runs/x"), model_dir=None, plot=None, **result_fields)
    _print_train_summary(config, result)
    out = capsys.readouterr().out
    rows = [" ".join(line.strip("│ ").split()) for line in out.splitlines() if line.startswith("│")]
    return " ".join(out.split()), rows


def test_train_summary_has_one_block_of_rows_per_policy(capsys):
    before = {"eval/trader_0/success_rate": 0.25, "eval/trader_0/reward_mean": 0.5, "eval/trader_1/episodes": 16}
    after = {"eval/trader_0/success_rate": 0.75, "eval/trader_1/reward_mean": 1.25, "eval/trader_1/failed": 1}
    text, rows = train_summary(capsys, policies=["trader_0", "trader_1"], eval_before=before, eval_after=after)
    assert text.startswith("agentrl/Negotiation-v0 · tiny · grpo · 8 steps")
    assert rows == [
        "trader_0 success rate │ 25.0% │ 75.0%",
        "trader_0 mean reward │ 0.500 │ -",
        "trader_0 episodes │ - │ -",
        "trader_0 failed │ - │ -",
        "trader_1 success rate │ - │ -",
        "trader_1 mean reward │ - │ 1.250",
        "trader_1 episodes │ 16 │ -",
        "trader_1 failed │ - │ 1",
    ]
    assert text.count("├") == 1  # a rule between the two blocks


def test_train_summary_shows_what_the_metrics_fn_reported_at_the_first_and_last_step(capsys, tmp_path):
    from types import SimpleNamespace

    from agentrl.cli.train import _print_train_summary
    from agentrl.metrics import MetricsLogger

    prefix = "env/agentrl/Waltz-v0/feedback"
    with MetricsLogger(tmp_path) as logger:
        for step, accuracy in ((1, 0.25), (2, 0.5), (3, 0.75)):
            logger.log(step, {"train/feedback/loss": 1.0, f"{prefix}/labels/accuracy": accuracy})
        logger.log(2, {f"{prefix}/outcomes/fixed": 0.5})  # only step 2 had a revision
    config = SimpleNamespace(
        rollout=SimpleNamespace(env_id="agentrl/Waltz-v0", model="tiny"),
        trainer=SimpleNamespace(algorithm="reinforce_pp"),
        metrics_fn="agentrl.recipes.waltzrl.hooks:waltz_step_metrics",
    )
    result = SimpleNamespace(steps=3, run_dir=tmp_path, model_dir=None, plot=None, eval_before=None, eval_after=None)
    _print_train_summary(config, result)
    out = capsys.readouterr().out
    rows = [" ".join(line.strip("│ ").split()) for line in out.splitlines() if line.startswith("│")]
    assert rows == [
        "feedback/labels/accuracy │ 0.25 (step 1) │ 0.75 (step 3)",
        "feedback/outcomes/fixed │ 0.5 (step 2) │ 0.5 (step 2)",
    ]
    assert "held-out evaluation: off" in out


def test_train_summary_of_a_single_policy_run_has_the_plain_rows(capsys):
    before, after = {"eval/success_rate": 0.5}, {"eval/success_rate": 1.0, "eval/episodes": 4}
    for fields in ({}, {"policies": []}):  # a TrainResult from before the field, and one with it empty
        text, rows = train_summary(capsys, eval_before=before, eval_after=after, **fields)
        assert text.startswith("agentrl/Negotiation-v0 · tiny · grpo · 8 steps")
        assert rows == ["success rate │ 50.0% │ 100.0%", "mean reward │ - │ -", "episodes │ - │ 4", "failed │ - │ -"]


# --- output a person can follow where stdout is not a terminal -----------------------------------


def test_line_progress_prints_each_phase_step_and_evaluation_once(capsys):
    from agentrl.cli.progress import LineProgress

    with LineProgress() as progress:
        hooks = progress.hooks()
        hooks.on_phase("starting the inference engine", 0)
        hooks.on_phase("evaluating (step 0)", 3)
        for _ in range(3):
            hooks.on_advance({})  # an episode: no line of its own
        hooks.on_result({"eval/success_rate": 0.25, "eval/reward_mean": 0.3})
        hooks.on_phase("training", 2)
        for reward in (0.5, 0.75):
            hooks.on_advance({"rollout/reward_mean": reward, "rollout/success_rate": reward})
        hooks.on_result({"eval/a/success_rate": 0.5, "eval/b/success_rate": 1.0, "eval/a/vs_base_success_rate": 0.1})
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines[:6] == [
        "starting the inference engine",
        "starting the inference engine: done in 0:00:00",
        "evaluating (step 0) (3 episodes)",
        "held-out success 25.0%",
        "evaluating (step 0): done in 0:00:00",
        "training (2 steps)",
    ]
    assert lines[6].startswith("step 1/2  reward 0.500  success 50%  0.0 s/step  eta 0:00:00")
    assert lines[7].startswith("step 2/2  reward 0.750  success 75%")
    assert lines[8:] == [
        "held-out a success 50.0%  b success 100.0%  a vs base success 10.0%",
        "training: done in 0:00:00",
    ]


def test_a_resumed_run_counts_its_steps_from_where_it_stopped(capsys):
    # A run resumed after step 27 of 40 says so and goes on at step 28/40, not 1/40.
    from agentrl.cli.progress import LineProgress

    with LineProgress() as progress:
        hooks = progress.hooks()
        hooks.on_phase("training", 40)
        hooks.on_resumed(27)
        hooks.on_advance({"rollout/reward_mean": 0.5, "rollout/success_rate": 0.5})
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines[:2] == ["training (40 steps)", "resumed after step 27"]
    assert lines[2].startswith("step 28/40  reward 0.500")


def test_an_evaluation_between_steps_leaves_the_step_count_and_the_training_phase_going(capsys):
    # eval_every: the loop evaluates after step 2 of 4, then tells the progress that training goes on
    from agentrl.cli.progress import LineProgress

    step = {"rollout/reward_mean": 0.5, "rollout/success_rate": 0.5}
    with LineProgress() as progress:
        hooks = progress.hooks()
        hooks.on_phase("training", 4)
        hooks.on_advance(step)
        hooks.on_advance(step)
        hooks.on_phase("evaluating (step 2)", 3)
        for _ in range(3):
            hooks.on_advance({})
        hooks.on_result({"eval/success_rate": 0.5})
        hooks.on_phase("training", 4)
        hooks.on_resumed(2)
        hooks.on_advance(step)
        hooks.on_advance(step)
    lines = [line.split("] ", 1)[1].split("  ")[0] for line in capsys.readouterr().out.splitlines()]
    assert lines[:2] == ["training (4 steps)", "step 1/4"]
    assert lines[2:5] == ["step 2/4", "evaluating (step 2) (3 episodes)", "held-out success 50.0%"]
    assert lines[5].startswith("evaluating (step 2): done in ")
    assert lines[6:8] == ["step 3/4", "step 4/4"]  # no "training (4 steps)" or "resumed" again
    assert len(lines) == 9 and lines[8].startswith("training: done in ")


def test_a_closed_pipe_stops_the_lines_not_the_run():
    from agentrl.cli.progress import LineProgress

    class Closed:
        def write(self, text: str) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    progress = LineProgress(out=Closed())  # type: ignore[arg-type]
    progress.line("one")  # raises nothing; later lines are not attempted
    assert progress.out is None


def test_eval_on_a_two_agent_env_counts_episodes_not_trajectories(tiny_model_dir):
    sys.path.insert(0, str(Path(__file__).parent))
    import multi_env

    result = invoke(
        "eval", multi_env.ENV_ID, "--model", str(tiny_model_dir), "--backend", "hf", "--episodes", "4",
        "max_tokens=4", "max_length=512",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # CliRunner's stdout is no terminal: lines, not bars, counting episodes
    assert "episodes 4/4" in result.output and "episodes 8/" not in result.output
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.output.splitlines()
        if line.count("│") == 3
    }
    assert rows["episodes"] == "4" and rows["agent trajectories"] == "8"
