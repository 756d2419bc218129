"""PCL's pieces: the selection by hand, the value model on the tiny model (starts at 0.5, padding
changes nothing, online updates follow the observed success rates)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainers.curriculum import PromptCurriculum, PromptValueModel, closest_to_target


def test_closest_to_target_by_hand() -> None:
    assert closest_to_target([0.9, 0.45, 0.1, 0.6, 0.5], 3) == [4, 1, 3]
    assert closest_to_target([0.4, 0.6, 0.5], 3) == [2, 0, 1]  # 0.4 and 0.6 tie: the lower index first
    assert closest_to_target(torch.tensor([0.0, 0.2, 0.9]), 1, target=0.25) == [1]
    with pytest.raises(ValueError, match="between 1 and the 3 candidates"):
        closest_to_target([0.1, 0.2, 0.3], 4)
    with pytest.raises(ValueError, match="between 1 and the 2 candidates"):
        closest_to_target([0.1, 0.2], 0)


def test_the_value_model_starts_at_one_half_and_ignores_padding(tiny_model_dir) -> None:
    torch.manual_seed(0)
    model = PromptValueModel(tiny_model_dir)
    short, long = [5, 6, 7], [5, 6, 7, 8, 9, 10, 11]
    with torch.no_grad():
        assert model([short, long]).tolist() == [0.5, 0.5]
        torch.nn.init.normal_(model.head.weight, std=0.5)  # a head that reads the hidden state
        alone = model([short])
        batched = model([short, long])
    torch.testing.assert_close(batched[:1], alone, atol=1e-6, rtol=0)
    assert abs(float(batched[0] - batched[1])) > 1e-4  # different prompts, different predictions
    with pytest.raises(ValueError, match="at least one token"):
        model([[]])


def test_online_updates_follow_the_success_rates_and_steer_the_selection(tiny_model_dir) -> None:
    torch.manual_seed(0)
    curriculum = PromptCurriculum(PromptValueModel(tiny_model_dir), lr=1e-3)
    easy, hard, middle = [11, 12, 13, 14], [21, 22, 23], [31, 32, 33, 34, 35]
    losses = [curriculum.update([easy, hard, middle], [1.0, 0.0, 0.5]) for _ in range(40)]
    assert losses[-1] < losses[0] / 10
    easy_v, hard_v, middle_v = curriculum.predict([easy, hard, middle])
    assert easy_v > 0.8 and hard_v < 0.2 and abs(middle_v - 0.5) < 0.1
    assert curriculum.select([easy, hard, middle], 1) == [2]
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        curriculum.update([easy], [1.5])
    with pytest.raises(ValueError, match="2 prompts and 1 success rates"):
        curriculum.update([easy, hard], [0.5])
