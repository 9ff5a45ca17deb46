"""DAPO dynamic sampling: which groups a batch keeps, and how many rounds it took."""

import numpy as np
import pytest

from rlinf_jax.rollout.dynamic_sampling import collect_informative_groups


def scripted_sampler(rounds_rewards, group_size):
    """Returns the scripted rewards round by round; group ids tell which group was kept."""
    calls = []

    def sample(rnd):
        calls.append(rnd)
        rewards = np.asarray(rounds_rewards[rnd], np.float32)
        g = rewards.size // group_size
        ids = np.arange(g) + 100 * rnd
        return {"id": ids, "tokens": np.stack([ids, ids], axis=1)}, rewards

    return sample, calls


def test_first_round_enough():
    # Groups of 2: [1,0] informative, [1,1] not, [0,1] informative.
    sample, calls = scripted_sampler([[1, 0, 1, 1, 0, 1]], 2)
    batch, report = collect_informative_groups(sample, num_groups=2, group_size=2, max_resample=3)
    assert batch["id"].tolist() == [0, 2] and batch["tokens"].shape == (2, 2)
    assert calls == [0] and report.rounds == 1 and report.filled and report.informative_groups == 2


def test_resamples_until_full():
    rounds = [[1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 1]]
    sample, calls = scripted_sampler(rounds, 2)
    batch, report = collect_informative_groups(sample, num_groups=3, group_size=2, max_resample=5)
    # Round 0 keeps group 2; round 1 has none; round 2 supplies two more (ids 200, 201).
    assert batch["id"].tolist() == [2, 200, 201]
    assert calls == [0, 1, 2] and report.rounds == 3 and report.sampled_groups == 9 and report.filled
    assert report.metrics()["rollout/sampling_rounds"] == 3.0


def test_bounded_rounds_pad_with_uninformative_groups():
    rounds = [[1, 1, 0, 1], [0, 0, 1, 1]]
    sample, calls = scripted_sampler(rounds, 2)
    batch, report = collect_informative_groups(sample, num_groups=2, group_size=2, max_resample=1)
    # One informative group (id 1) in two rounds; the slot left is filled from the last round.
    assert batch["id"].tolist() == [1, 100]
    assert calls == [0, 1] and not report.filled and report.informative_groups == 1


def test_bad_arguments():
    sample, _ = scripted_sampler([[1, 1]], 2)
    with pytest.raises(ValueError):
        collect_informative_groups(sample, num_groups=0, group_size=2, max_resample=1)
    with pytest.raises(ValueError, match="at least 2"):
        collect_informative_groups(sample, num_groups=2, group_size=2, max_resample=0)
