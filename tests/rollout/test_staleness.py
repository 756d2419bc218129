"""The staleness window on its own: the formula, queries that change nothing, resume."""

from __future__ import annotations

import pytest

from agentrl.rollout import StalenessWindow
from agentrl.rollout.staleness import required_groups, take_required


def test_capacity_is_one_batch_plus_one_per_staleness_step():
    assert StalenessWindow(groups_per_step=4, max_staleness=0).capacity == 4
    assert StalenessWindow(groups_per_step=4, max_staleness=2).capacity == 12


def test_synchronous_window_opens_only_after_a_batch_is_trained():
    window = StalenessWindow(groups_per_step=2, max_staleness=0)
    window.start(2)
    assert window.room() == 0
    window.trained(1)  # half a batch trained is not a batch: one more group may start, no more
    assert window.room() == 1
    window.trained(1)
    assert window.room() == 2 and window.in_flight == 0


def test_room_is_a_query():
    window = StalenessWindow(groups_per_step=3, max_staleness=1, started=5, trained_groups=1, lost=1)
    before = (window.started, window.trained_groups, window.lost)
    assert [window.room() for _ in range(3)] == [3, 3, 3]
    assert (window.started, window.trained_groups, window.lost) == before


def test_lost_groups_free_their_places():
    window = StalenessWindow(groups_per_step=2, max_staleness=1)
    window.start(4)
    window.set_lost(1)
    assert window.room() == 1
    window.set_lost(1)  # the buffer's total, not an increment: saying it twice changes nothing
    assert window.room() == 1
    with pytest.raises(ValueError, match="cannot decrease"):
        window.set_lost(0)


def test_starting_more_than_the_room_is_refused():
    window = StalenessWindow(groups_per_step=2, max_staleness=0)
    with pytest.raises(ValueError, match="starting 3 groups with room for 2"):
        window.start(3)


def test_a_resumed_window_counts_the_buffered_groups_as_in_flight():
    window = StalenessWindow(groups_per_step=2, max_staleness=1, started=3)
    assert window.in_flight == 3 and window.room() == 1


@pytest.mark.parametrize("groups_per_step, max_staleness", [(0, 0), (2, -1)])
def test_bad_settings_say_what_was_expected(groups_per_step, max_staleness):
    with pytest.raises(ValueError, match="must be"):
        StalenessWindow(groups_per_step, max_staleness)


def test_in_flight_never_exceeds_capacity_over_a_random_run():
    import random

    rng = random.Random(0)
    window = StalenessWindow(groups_per_step=3, max_staleness=2)
    lost = 0
    for _ in range(2000):
        action = rng.random()
        if action < 0.5:
            window.start(rng.randint(0, window.room()))
        elif action < 0.8 and window.in_flight >= 3:
            window.trained(3)
        elif window.in_flight > 0:
            lost += 1
            window.set_lost(lost)
        assert 0 <= window.in_flight <= window.capacity


def test_a_batch_must_hold_the_groups_at_the_end_of_their_bound():
    # k = 1, B = 2: "a" started at version 0 is trained now or never; of the four groups started
    # at or before version 1, two must come now (the batch after takes the other two).
    starts = {"a": 0, "b": 1, "c": 1, "d": 1}
    assert required_groups(starts, version=1, max_staleness=1, groups_per_step=2) == [
        (["a"], 1),
        (["a", "b", "c", "d"], 2),
    ]


def test_a_synchronous_batch_must_hold_every_group_in_flight():
    starts = {"a": 3, "b": 3}
    assert required_groups(starts, version=3, max_staleness=0, groups_per_step=2) == [(["a", "b"], 2)]


def test_nothing_is_required_while_every_group_has_batches_to_spare():
    assert required_groups({"a": 2, "b": 2}, version=2, max_staleness=2, groups_per_step=2) == []


def test_taking_the_required_groups_oldest_first_never_lets_one_go_stale():
    """A simulation of the controller: groups start whenever the window has room, finish after a
    random number of steps, and each batch takes the required groups (waiting for them) and then
    any finished ones. No group is ever trained more than max_staleness versions after it started."""
    import random

    rng = random.Random(1)
    for max_staleness in (0, 1, 2, 3):
        per_step = 3
        window = StalenessWindow(per_step, max_staleness)
        version, next_id = 0, 0
        starts: dict[str, int] = {}
        done_at: dict[str, int] = {}
        for _ in range(60):
            for _ in range(window.room()):
                group = f"g{next_id}"
                next_id += 1
                starts[group], done_at[group] = version, version + rng.choice([0, 0, 0, 1, 3])
                window.start(1)
            required = required_groups(starts, version, max_staleness, per_step)
            batch, _ = take_required(required, lambda g: True, per_step)  # what the batch waits for, then takes
            finished = sorted((g for g in starts if g not in batch and done_at[g] <= version), key=done_at.get)
            batch += finished[: per_step - len(batch)]
            assert len(batch) <= per_step
            for group in batch:
                assert version - starts.pop(group) <= max_staleness
            window.trained(len(batch))
            version += 1


def test_take_required_waits_for_an_older_group_before_taking_newer_ones():
    required = [(["a"], 1), (["a", "b", "c"], 2)]
    assert take_required(required, lambda g: g != "a", room=2) == ([], True)
    assert take_required(required, lambda g: g in "ab", room=2) == (["a", "b"], False)
    assert take_required(required, lambda g: g == "a", room=2) == (["a"], True)  # b or c still to come


def test_take_required_is_not_fooled_by_a_set_already_full():
    # Two of S_0 are needed and they also fill S_1's need of one: nothing to wait for.
    required = [(["a", "b"], 2), (["a", "b", "c", "d"], 1)]
    assert take_required(required, lambda g: True, room=3) == (["a", "b"], False)


def test_take_required_stops_at_the_room_left():
    assert take_required([(["a", "b", "c"], 3)], lambda g: True, room=2) == (["a", "b"], False)
