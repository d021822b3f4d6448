"""Group-relative advantages, shared by every trainer: which groups teach and what each sample's
advantage is.

Samples of one task in one iteration form a group (`Trajectory.group_id`); each trainable
sample's advantage is its signal minus the group mean (divided by the group's standard deviation
when `normalize_by_std`). Groups that cannot teach anything are masked *explicitly* and counted:
groups whose signals are all equal (zero variance: every advantage would be 0), groups holding
infrastructure failures (sandbox, verifier, task or policy errors: no reward to compare) and
groups with too few trainable samples. The built-in trainer and the language-model trainer both
call `group_advantages`, so the two mask the same groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal, Protocol

from training.trajectory import Trajectory

InfraFailureRule = Literal["mask_group", "drop_samples"]


class GroupRules(Protocol):
    """The settings `group_advantages` reads; every trainer's config carries them."""

    @property
    def normalize_by_std(self) -> bool:
        """Divide by the group's std (GRPO); False keeps signal-minus-mean (Dr. GRPO)."""
        ...

    @property
    def advantage_epsilon(self) -> float:
        """Added to the std before dividing, and the std below which a group counts as
        zero-variance."""
        ...

    @property
    def fixed_tests_weight(self) -> float:
        """The signal is `reward + w * fixed_fraction` (`training_signal`)."""
        ...

    @property
    def min_group_size(self) -> int:
        """Groups with fewer trainable samples are masked (no baseline to compare to)."""
        ...

    @property
    def infra_failures(self) -> InfraFailureRule:
        """`mask_group`: a group with an infra failure contributes nothing. `drop_samples`: its
        trainable samples, if `min_group_size` remain."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class GroupStats:
    """How the batch's groups were used."""

    groups_total: int
    groups_used: int
    groups_zero_variance: int
    groups_with_infra_failures: int
    groups_too_small: int
    samples_total: int
    samples_used: int
    samples_infra_failed: int


def training_signal(trajectory: Trajectory, rules: GroupRules) -> float:
    """What a trainable trajectory scored, for the group comparison."""
    assert trajectory.reward is not None
    return trajectory.reward + rules.fixed_tests_weight * (trajectory.fixed_fraction or 0.0)


def by_group(trajectories: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories keyed by `Trajectory.group_id` (run / iteration / group / task)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id].append(trajectory)
    return groups


def teaching_members(members: Sequence[Trajectory], rules: GroupRules) -> list[Trajectory]:
    """The samples of one group that may train, before the variance check: none when an infra
    failure masks the group (`mask_group`) or fewer than `min_group_size` remain."""
    if rules.infra_failures == "mask_group" and any(not t.trainable for t in members):
        return []
    trainable = [t for t in members if t.trainable]
    return trainable if len(trainable) >= rules.min_group_size else []


def group_advantages(
    trajectories: Sequence[Trajectory], rules: GroupRules
) -> tuple[dict[str, float], GroupStats]:
    """Advantage per episode id for the trajectories that train; everything else is absent."""
    groups = by_group(trajectories)
    advantages: dict[str, float] = {}
    used = zero_variance = with_infra = too_small = infra_samples = samples_used = 0
    for members in groups.values():
        failed = sum(1 for t in members if not t.trainable)
        infra_samples += failed
        with_infra += bool(failed)
        teaching = teaching_members(members, rules)
        if not teaching:
            too_small += not (failed and rules.infra_failures == "mask_group")
            continue
        signals = [training_signal(t, rules) for t in teaching]
        mean = math.fsum(signals) / len(signals)
        variance = math.fsum((s - mean) ** 2 for s in signals) / len(signals)
        if variance <= rules.advantage_epsilon**2:
            zero_variance += 1
            continue
        scale = math.sqrt(variance) + rules.advantage_epsilon if rules.normalize_by_std else 1.0
        for trajectory, signal in zip(teaching, signals, strict=True):
            advantages[trajectory.episode_id] = (signal - mean) / scale
        used += 1
        samples_used += len(teaching)
    stats = GroupStats(
        groups_total=len(groups),
        groups_used=used,
        groups_zero_variance=zero_variance,
        groups_with_infra_failures=with_infra,
        groups_too_small=too_small,
        samples_total=len(trajectories),
        samples_used=samples_used,
        samples_infra_failed=infra_samples,
    )
    return advantages, stats
