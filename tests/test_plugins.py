"""Third-party packages: envs found through the ``agentrl.envs`` entry-point group, never by name,
and commands and eval reports through ``agentrl.commands`` and ``agentrl.eval_reports``.

Each test builds a small package in a temporary folder, pip-installs it into this interpreter
(``--no-build-isolation --no-deps``: nothing is downloaded) and checks, in a fresh Python process
so that plugin loading really runs, what a user of that package would see. The package is
uninstalled afterwards, and also beforehand in case an earlier run was killed midway.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

# pip builds and installs three packages, and each check starts a fresh Python: about 45 s here.
# They pip-install into this interpreter, which the other xdist worker shares: one at a time.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("plugins")]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.0.1"
dependencies = ["agentrl"]

[tool.setuptools]
packages = ["{module}"]

[project.entry-points."agentrl.envs"]
{entry_points}
{extra}"""

ECHO_ENVS = '''\
"""Envs of a third-party package; importing this module registers thirdparty/Echo-v0."""

import agentrl
from agentrl import AgentEnv, Feedback, Message

WORDS = ["apple", "pear", "plum", "quince"]


class Echo(AgentEnv):
    """Say the word you are given (a third-party test env)."""

    def start(self, options):
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [Message("user", f"Say {self.word}.")]

    def respond(self, reply):
        won = reply.content.strip() == self.word
        return Feedback([Message("user", "Right." if won else "Wrong.")], reward=float(won), terminated=True)


class Reverse(Echo):
    """Say the word you are given backwards."""

    def respond(self, reply):
        won = reply.content.strip() == self.word[::-1]
        return Feedback([], reward=float(won), terminated=True)


def register_reverse():
    """Entry points may also name a function: agentrl calls it."""
    agentrl.register("thirdparty/Reverse-v0", Reverse)


agentrl.register("thirdparty/Echo-v0", "agentrl_test_echo.envs:Echo")
'''

ECHO_CLI = '''\
"""What the package adds to the agentrl command line: a command and an eval report."""

import typer

from agentrl_test_echo.envs import WORDS


def words(count: int = typer.Option(4, help="How many words.")) -> None:
    """Print the words thirdparty/Echo-v0 asks for."""
    print("words:", " ".join(WORDS[:count]))


def report(env_id, trajectories):
    if env_id != "thirdparty/Echo-v0":
        return None
    said = sum(t.info.get("said", False) for t in trajectories)
    return f"echo report: {len(trajectories)} episodes, {said} said"
'''

ECHO = {
    "dist": "agentrl-test-echo",
    "module": "agentrl_test_echo",
    "entry_points": 'agentrl_test_echo = "agentrl_test_echo.envs"\n'
    'agentrl_test_reverse = "agentrl_test_echo.envs:register_reverse"',
    "extra": '[project.entry-points."agentrl.commands"]\necho-words = "agentrl_test_echo.cli:words"\n'
    '[project.entry-points."agentrl.eval_reports"]\necho = "agentrl_test_echo.cli:report"\n',
    "files": {"__init__.py": "", "envs.py": ECHO_ENVS, "cli.py": ECHO_CLI},
}
GYMSTYLE_ENVS = '''\
"""Envs written the gymnasium way: an AgentEnv overriding reset/step, and a plain gymnasium.Env."""

import gymnasium

import agentrl
from agentrl import AgentEnv, Message, MessagesSpace, ReplySpace

WORDS = ["apple", "pear", "plum", "quince"]


class GymWayEcho(AgentEnv):
    """Say the word you are given (an AgentEnv written the gymnasium way)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [Message("user", f"Say {self.word}.")], {}

    def step(self, action):
        won = self.parse_reply(action).content.strip() == self.word
        return [Message("user", "Right." if won else "Wrong.")], float(won), True, False, {"success": won}


class PlainEcho(gymnasium.Env):
    """Say the word you are given (a plain gymnasium.Env speaking messages)."""

    observation_space = MessagesSpace()
    action_space = ReplySpace()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [Message("user", f"Say {self.word}.")], {}

    def step(self, action):  # action: an assistant agentrl.Message
        won = action.content.strip() == self.word
        return [Message("user", "Right." if won else "Wrong.")], float(won), True, False, {"success": won}


agentrl.register("thirdparty/GymWayEcho-v0", "agentrl_test_gymstyle.envs:GymWayEcho")
# A gymnasium user's habit: plain gymnasium.register (gymnasium.make then adds its checking wrappers).
gymnasium.register("thirdparty/PlainEcho-v0", "agentrl_test_gymstyle.envs:PlainEcho")
'''

GYMSTYLE = {
    "dist": "agentrl-test-gymstyle",
    "module": "agentrl_test_gymstyle",
    "entry_points": 'agentrl_test_gymstyle = "agentrl_test_gymstyle.envs"',
    "files": {"__init__.py": "", "envs.py": GYMSTYLE_ENVS},
}
BROKEN = {
    "dist": "agentrl-test-broken",
    "module": "agentrl_test_broken",
    "entry_points": 'agentrl_test_broken = "agentrl_test_broken"',
    # a command that cannot load, and one that would replace a built-in command
    "extra": '[project.entry-points."agentrl.commands"]\nbroken-words = "agentrl_test_broken:words"\n'
    'train = "agentrl_test_broken:train"\n',
    "files": {"__init__.py": 'raise RuntimeError("this plugin is broken on purpose")\n'},
}


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def require_offline_wheel_build() -> None:
    """setuptools builds wheels by itself from 70.1 on; older ones need the ``wheel`` package."""
    setuptools_version = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    if setuptools_version < (70, 1) and importlib.util.find_spec("wheel") is None:
        pytest.fail(
            f"setuptools {importlib.metadata.version('setuptools')} cannot build a wheel without the "
            "`wheel` package; install setuptools>=70.1 or wheel (.ci/run does)."
        )


def install(package: dict, root: Path) -> Iterator[None]:
    """Write ``package`` under ``root``, pip-install it, yield, and uninstall it."""
    require_offline_wheel_build()
    source = root / package["dist"]
    (source / package["module"]).mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT.format(**{"extra": "", **package}))
    for name, text in package["files"].items():
        (source / package["module"] / name).write_text(text)
    if installed(package["dist"]):  # left over from a run that was killed midway
        pip("uninstall", "-y", package["dist"])
    result = pip("install", "--no-build-isolation", "--no-deps", "--no-cache-dir", str(source))
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield
    finally:
        result = pip("uninstall", "-y", package["dist"])
        assert result.returncode == 0 and not installed(package["dist"]), result.stdout + result.stderr


@pytest.fixture(scope="module")
def echo_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from install(ECHO, tmp_path_factory.mktemp("echo"))


@pytest.fixture(scope="module")
def gymstyle_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from install(GYMSTYLE, tmp_path_factory.mktemp("gymstyle"))


@pytest.fixture
def broken_plugin(tmp_path: Path) -> Iterator[None]:
    yield from install(BROKEN, tmp_path)


def fresh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command in a new process, outside the source tree, so only installed code is found."""
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=300, cwd=cwd)


def agentrl_cli(*args: str) -> list[str]:
    script = Path(sysconfig.get_path("scripts")) / "agentrl"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "agentrl.cli", *args]


def test_installed_plugin_is_listed(echo_plugin, tmp_path):
    result = fresh(agentrl_cli("envs"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "thirdparty/Echo-v0" in result.stdout and "thirdparty/Reverse-v0" in result.stdout
    assert "Say the word you are given (a third-party" in result.stdout
    assert "agentrl/Calculator-v0" in result.stdout  # the built-ins are still there
    assert "warning" not in result.stderr.lower()


def test_plugin_env_is_made_without_importing_its_package(echo_plugin, tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        import agentrl

        before = "agentrl_test_echo" in sys.modules
        env = agentrl.make("thirdparty/Echo-v0")
        observation, _ = env.reset(seed=0)
        word = env.unwrapped.word
        reward = env.step(word).reward
        reverse = agentrl.make("thirdparty/Reverse-v0")
        reverse.reset(seed=0)
        print(json.dumps({
            "imported_before_make": before,
            "first_message": observation[0].content,
            "reward": reward,
            "reverse_reward": reverse.step(reverse.unwrapped.word[::-1]).reward,
            "class": type(env.unwrapped).__module__,
        }))
        """
    )
    result = fresh([sys.executable, "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["imported_before_make"] is False
    assert seen["first_message"].startswith("Say ")
    assert seen["reward"] == 1.0 and seen["reverse_reward"] == 1.0
    assert seen["class"] == "agentrl_test_echo.envs"


def test_plugin_env_passes_check(echo_plugin, tmp_path):
    result = fresh(agentrl_cli("check", "thirdparty/Echo-v0"), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


def test_broken_plugin_warns_but_agentrl_still_works(broken_plugin, tmp_path):
    listing = fresh(agentrl_cli("envs"), tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "agentrl/Calculator-v0" in listing.stdout
    assert "agentrl_test_broken" in listing.stderr and "broken on purpose" in listing.stderr
    assert "Traceback" not in listing.stderr

    unknown = fresh(agentrl_cli("check", "thirdparty/Nothing-v0"), tmp_path)
    assert unknown.returncode == 2
    assert "Unknown env 'thirdparty/Nothing-v0'" in unknown.stderr
    assert "agentrl_test_broken" in unknown.stderr  # the hint says which plugins failed to load

    help_text = fresh(agentrl_cli("--help"), tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "could not load the agentrl.commands entry point 'broken-words'" in help_text.stderr
    assert "'train' (agentrl_test_broken:train) names a command agentrl has" in help_text.stderr
    assert "broken-words" not in help_text.stdout and "Traceback" not in help_text.stderr
    assert "Train a policy on an env" in help_text.stdout  # the built-in train, not the plugin's


def test_plugin_command_is_on_the_command_line(echo_plugin, tmp_path):
    help_text = fresh(agentrl_cli("--help"), tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "echo-words" in help_text.stdout and "waltz-table" in help_text.stdout  # ours, by the same route
    result = fresh(agentrl_cli("echo-words", "--count", "2"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "words: apple pear"
    assert "warning" not in result.stderr.lower()


@pytest.mark.e2e
def test_plugin_eval_report_is_printed_after_its_envs_episodes(echo_plugin, tiny_model_dir, tmp_path):
    command = agentrl_cli("eval", "thirdparty/Echo-v0", "--model", str(tiny_model_dir), "--backend", "hf",
                          "--episodes", "2", "max_tokens=4", "max_length=256")  # fmt: skip
    result = fresh(command, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "echo report: 2 episodes, 0 said" in result.stdout
    assert "WaltzRL metrics" not in result.stdout  # the Waltz report is for Waltz runs only


GYMSTYLE_IDS = ["thirdparty/GymWayEcho-v0", "thirdparty/PlainEcho-v0"]


@pytest.mark.parametrize("env_id", GYMSTYLE_IDS)
def test_gymnasium_style_plugin_envs_pass_check(gymstyle_plugin, tmp_path, env_id):
    result = fresh(agentrl_cli("check", env_id), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


def test_gymnasium_style_plugin_envs_are_made_and_played_by_the_rollout_engine(gymstyle_plugin, tmp_path):
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        import agentrl
        from agentrl.agents import ChatAgent
        from agentrl.env import as_agent_env
        from agentrl.rollout import RolloutSettings, SingleAgentRollout
        from agentrl.testing import ScriptedPolicy, build_tiny_tokenizer

        seen = {"imported_before_make": "agentrl_test_gymstyle" in sys.modules}
        tokenizer = build_tiny_tokenizer()
        for env_id in sys.argv[1:]:
            env = agentrl.make(env_id)
            seen[env_id + " class"] = type(env.unwrapped).__module__
            agent = ChatAgent.from_env(tokenizer, as_agent_env(env))
            policy = ScriptedPolicy(tokenizer, lambda prompt: prompt.split("Say ")[-1].split(".")[0])
            make_env = lambda: as_agent_env(agentrl.make(env_id))
            engine = SingleAgentRollout(make_env, agent, policy, RolloutSettings(env_id, group_size=2))
            trajectories = asyncio.run(engine.collect(num_groups=2))
            engine.close()
            seen[env_id] = [(t.error, t.reward) for t in trajectories]
        print(json.dumps(seen))
        """
    )
    result = fresh([sys.executable, "-c", script, *GYMSTYLE_IDS], tmp_path)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["imported_before_make"] is False
    for env_id in GYMSTYLE_IDS:
        assert seen[env_id + " class"] == "agentrl_test_gymstyle.envs"
        assert seen[env_id] == [[None, 1.0]] * 4, env_id


def test_gymnasium_style_plugin_env_registered_with_agentrl_is_listed(gymstyle_plugin, tmp_path):
    result = fresh(agentrl_cli("envs"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "thirdparty/GymWayEcho-v0" in result.stdout
