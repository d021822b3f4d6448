"""The built-in policy: a small torch network scores proposed candidate actions; sampling picks one.

It learns on CPU from scratch. `training.builtin.proposers` proposes actions from the history and
describes each with features; the network maps features to a logit, and the policy samples
from the softmax over candidates, so the log-probability of every choice is exact and can be
recomputed by the trainer from the stored features (`ScorerRecord`). The last layer starts at
zero: an untrained policy picks uniformly among the candidates, so anything better than that is
learned from rewards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import Any

import torch
from torch import nn

from training.actions import History
from training.builtin.features import FEATURE_COUNT, FEATURE_NAMES, Candidate
from training.builtin.proposers import propose_candidates
from training.errors import PolicyError, TrainerError
from training.policy import Decision, Policy, ScorerRecord


@dataclasses.dataclass(frozen=True, slots=True)
class ScorerConfig:
    """Shape and sampling of the candidate scorer."""

    hidden_size: int = 32
    """Width of the one hidden layer."""
    temperature: float = 1.0
    """Softmax temperature when sampling (the trainer assumes 1.0 when it recomputes logprobs)."""
    greedy: bool = False
    """Take the highest-scoring candidate instead of sampling (evaluation); logprobs still
    report the sampling distribution."""
    init_seed: int = 0
    """Seed of the first layer's initial weights."""


class CandidateScorer(nn.Module):
    """features (N, F) -> logits (N,)."""

    def __init__(self, feature_count: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(feature_count, hidden_size)
        self.out = nn.Linear(hidden_size, 1)
        # Zero output layer: the untrained policy is uniform over candidates, and the first
        # gradient step moves every logit by the same rule rather than by random init noise.
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(torch.tanh(self.hidden(features))).squeeze(-1)
        return logits


class CandidateScorerPolicy(Policy):
    """Proposes candidates from the history and samples one by the network's scores."""

    name = "candidate-scorer"
    kind = "builtin"

    def __init__(self, config: ScorerConfig | None = None, *, seed: int = 0) -> None:
        self.config = config or ScorerConfig()
        generator = torch.Generator().manual_seed(self.config.init_seed)
        self.network = CandidateScorer(FEATURE_COUNT, self.config.hidden_size)
        with torch.no_grad():
            bound = 1.0 / FEATURE_COUNT**0.5
            self.network.hidden.weight.uniform_(-bound, bound, generator=generator)
            self.network.hidden.bias.uniform_(-bound, bound, generator=generator)
        self.updates = 0
        """Optimizer steps applied so far; part of `version`."""
        self._generator = torch.Generator().manual_seed(seed)
        self._version: str | None = None

    # -- the policy interface -------------------------------------------------------------------

    @property
    def version(self) -> str:
        if self._version is None:
            digest = hashlib.sha256()
            for tensor in self.network.state_dict().values():
                digest.update(tensor.detach().numpy().tobytes())
            self._version = f"{self.name}@{self.updates}:{digest.hexdigest()[:8]}"
        return self._version

    def seed(self, seed: int) -> None:
        """Reseed sampling, so an episode's choices depend only on its own seed."""
        self._generator.manual_seed(seed)

    def candidates(self, history: History) -> list[Candidate]:
        return propose_candidates(history)

    def act(self, history: History) -> Decision:
        return self.choose(self.candidates(history))

    def choose(self, candidates: list[Candidate]) -> Decision:
        """Sample (or, greedy, take the best of) `candidates` by the network's scores."""
        if not candidates:
            raise PolicyError("no candidate actions to choose from")
        features = torch.tensor([c.features for c in candidates], dtype=torch.float32)
        with torch.no_grad():
            logits = self.network(features) / self.config.temperature
            log_probs = torch.log_softmax(logits, dim=-1)
        if self.config.greedy:
            index = int(torch.argmax(logits).item())
        else:
            index = int(torch.multinomial(log_probs.exp(), 1, generator=self._generator).item())
        record = ScorerRecord(tuple(c.features for c in candidates), index)
        return Decision((candidates[index].action,), float(log_probs[index].item()), record)

    # -- what the trainer uses -------------------------------------------------------------------

    def distributions_of(self, records: list[ScorerRecord]) -> list[torch.Tensor]:
        """Log-probabilities (with gradient) over each record's candidates, one vector per
        record — batched in one forward pass."""
        for record in records:
            if len(record.features[0]) != FEATURE_COUNT:
                raise TrainerError(
                    f"a step was recorded with {len(record.features[0])} features per candidate "
                    f"but this policy scores {FEATURE_COUNT}; train on trajectories from the "
                    "same rollyard version"
                )
        sizes = [len(record.features) for record in records]
        flat = torch.tensor(
            [row for record in records for row in record.features], dtype=torch.float32
        )
        logits = self.network(flat)
        return [
            torch.log_softmax(logits[offset : offset + size], dim=-1)
            for offset, size in zip(_offsets(sizes), sizes, strict=True)
        ]

    def log_probs_of(self, records: list[ScorerRecord]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities (with gradient) of the chosen candidates, and the entropies of the
        distributions they were chosen from, one per record."""
        return chosen_and_entropies(self.distributions_of(records), records)

    def mark_updated(self) -> None:
        """Called by the trainer after each optimizer step: the version changes with the
        parameters."""
        self.updates += 1
        self._version = None

    def feature_weights(self) -> dict[str, float]:
        """A readable summary of what was learned: d logit / d feature at the zero vector."""
        features = torch.zeros(1, FEATURE_COUNT, requires_grad=True)
        self.network(features).sum().backward()
        assert features.grad is not None
        return dict(zip(FEATURE_NAMES, features.grad[0].tolist(), strict=True))

    # -- serialization --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "config": dataclasses.asdict(self.config),
            "feature_names": list(FEATURE_NAMES),
            "network": {k: v.clone() for k, v in self.network.state_dict().items()},
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.name:
            raise TrainerError(f"checkpoint is for {state.get('kind')!r}, not {self.name!r}")
        if list(state["feature_names"]) != list(FEATURE_NAMES):
            raise TrainerError(
                "checkpoint was trained on another feature set; it cannot drive this version of "
                "the candidate scorer (retrain, or load it with the rollyard version that wrote it)"
            )
        self.network.load_state_dict(state["network"])
        self.updates = int(state["updates"])
        self._version = None

    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], *, seed: int = 0, **config_changes: Any
    ) -> CandidateScorerPolicy:
        config = dataclasses.replace(ScorerConfig(**state["config"]), **config_changes)
        policy = cls(config, seed=seed)
        policy.load_state_dict(state)
        return policy

    def to_bytes(self) -> bytes:
        """The state dict as bytes (for a checkpoint row, or to ship to Dask workers)."""
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        return buffer.getvalue()

    @classmethod
    def from_bytes(
        cls, data: bytes, *, seed: int = 0, **config_changes: Any
    ) -> CandidateScorerPolicy:
        state = torch.load(io.BytesIO(data), weights_only=True)
        return cls.from_state_dict(state, seed=seed, **config_changes)

    def __getstate__(self) -> dict[str, Any]:
        return {"bytes": self.to_bytes(), "generator": self._generator.get_state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        loaded = torch.load(io.BytesIO(state["bytes"]), weights_only=True)
        self.__init__(ScorerConfig(**loaded["config"]))  # type: ignore[misc]
        self.load_state_dict(loaded)
        self._generator.set_state(state["generator"])


def chosen_and_entropies(
    distributions: list[torch.Tensor], records: list[ScorerRecord]
) -> tuple[torch.Tensor, torch.Tensor]:
    """From `CandidateScorerPolicy.distributions_of`: the log-probability of each record's chosen
    candidate, and each distribution's entropy."""
    chosen = [
        log_probs[record.chosen_index]
        for log_probs, record in zip(distributions, records, strict=True)
    ]
    entropies = [-(log_probs.exp() * log_probs).sum() for log_probs in distributions]
    return torch.stack(chosen), torch.stack(entropies)


def _offsets(sizes: list[int]) -> list[int]:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return offsets
