import pytest

from agentrl.config import ConfigError, field_docs, load_config
from agentrl.run import RolloutConfig


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env_id: agentrl/Countdown-v0\nepisodes: 8\ngroup_size: 4\ntemperature: 0.5\n")
    config = load_config(RolloutConfig, path, ["episodes=16", "backend=hf", "system_prompt=Be brief."])
    assert (config.env_id, config.episodes, config.group_size, config.temperature) == (
        "agentrl/Countdown-v0",
        16,
        4,
        0.5,
    )
    assert (config.backend, config.system_prompt) == ("hf", "Be brief.")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["episods=3"], "Unknown field 'episods' in overrides for RolloutConfig. Did you mean 'episodes'?"),
        (["episodes=ten"], "RolloutConfig.episodes must be an integer, got 'ten'"),
        (["backend=tgi"], "RolloutConfig.backend must be one of \\['vllm', 'hf', 'openai'\\]"),
        (["episodes=10", "group_size=4"], "episodes 10 is not a multiple of group_size 4 \\(10 = 2 x 4 \\+ 2\\)"),
        (["max_tokens=4096", "max_length=1024"], "max_tokens 4096 must be below max_length 1024"),
        (["temperature"], "must look like key=value"),
    ],
)
def test_bad_configs_say_what_was_expected(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(RolloutConfig, None, overrides)


def test_a_non_mapping_yaml_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(RolloutConfig, path)


def test_every_field_has_a_doc():
    docs = field_docs(RolloutConfig)
    missing = [name for name in RolloutConfig.__dataclass_fields__ if not docs.get(name)]
    assert not missing


def test_sections_fill_from_nested_yaml_and_dotted_overrides(tmp_path):
    from dataclasses import dataclass, field

    @dataclass
    class Inner:
        lr: float = 1.0
        """Learning rate."""

    @dataclass
    class Outer:
        inner: Inner = field(default_factory=Inner)
        """A section."""
        steps: int = 1
        """Steps."""

    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\ninner:\n  lr: 0.5\n")
    assert load_config(Outer, path) == Outer(Inner(0.5), 3)
    assert load_config(Outer, path, ["inner.lr=2e-3"]).inner.lr == 2e-3
    with pytest.raises(ConfigError, match="Did you mean 'lr'"):
        load_config(Outer, None, ["inner.lrr=1"])
    with pytest.raises(ConfigError, match="is a section"):
        load_config(Outer, None, ["inner=3"])
    with pytest.raises(ConfigError, match="steps must be an integer"):
        load_config(Outer, None, ["steps.x=3"])
