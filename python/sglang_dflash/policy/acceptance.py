"""Online per-position acceptance rates and the expected commit E(W).

E(W) = 1 + sum_{k=1..W} prod_{j=1..k} a_j, with a_j the conditional acceptance
rate of draft j given drafts 1..j-1 were accepted: the expected tokens a request
commits in a step that verifies W drafts (bonus included). Pooled rates give the
population-mean survival, so bs * E(W) is a batch's expected commit.
Host-side stdlib arithmetic on lists the worker already has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sglang_dflash.checks import is_int
from sglang_dflash.policy.config import policy_error


def expected_commits(rates: Sequence[float]) -> list[float]:
    """E(W) for W = 0..len(rates), in O(len(rates))."""
    out = [1.0]
    survival = 1.0
    for a in rates:
        survival *= a
        out.append(out[-1] + survival)
    return out


def position_counts(width: int, accept_lens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(reached_j, accepted_j) for j = 1..width from accept lengths in [0, width].

    A request with accept_len a < width reaches positions 1..a+1 (rejected at
    a+1); a == width reaches 1..width, all accepted. O(bs + width).
    """
    reached, accepted = [0] * width, [0] * width
    hist = [0] * (width + 1)  # requests by accept_len
    for i, a in enumerate(accept_lens):
        if not (is_int(a) and 0 <= a <= width):
            raise policy_error(f"accept_lens[{i}] = {a!r} must be an int in [0, {width}]")
        hist[a] += 1
    at_least = hist[width]  # requests with accept_len >= j
    for j in range(width, 0, -1):
        accepted[j - 1] = at_least
        reached[j - 1] = at_least + hist[j - 1]
        at_least += hist[j - 1]
    return reached, accepted


class AcceptanceStats:
    """Online conditional acceptance rates a_1..a_{B-1}.

    Position j keeps decayed counts of its own data (accepted A_j of reached N_j)
    and P_j pseudo-observations of a prior, its predecessor's current rate
    (`prior_rate` for position 1):

        a_j = (A_j + P_j * a_{j-1}) / (N_j + P_j),    P_j = `min_weight` at start.

    The predecessor is the prior because a DFlash drafter's conditional rates
    are nearly flat in j, and the last positions are reached only by occasional
    probes while the policy runs narrower. Every step multiplies A_j, N_j, P_j by
    2^(-1/half_life) while N_j + P_j stays >= `min_weight`, so an unreached
    position keeps its last estimate while fresh observations quickly outweigh it.
    Invariants: 0 <= a_j <= 1; weight_j = N_j + P_j >= min_weight.
    """

    def __init__(self, num_positions: int, half_life: float = math.inf,
                 prior_rate: float = 0.7, min_weight: float = 4.0) -> None:
        if not (is_int(num_positions) and num_positions >= 1):
            raise policy_error(f"num_positions = {num_positions!r} must be an int >= 1")
        self.decay = 0.5 ** (1.0 / half_life)
        self.min_weight = float(min_weight)
        self.prior_rate = float(prior_rate)
        self._acc = [0.0] * num_positions  # A_j
        self._reached = [0.0] * num_positions  # N_j
        self._prior = [self.min_weight] * num_positions  # P_j
        self.mean: list[float] = []  # a_j, recomputed on every change
        self._update()

    @property
    def weight(self) -> list[float]:
        return [n + p for n, p in zip(self._reached, self._prior)]

    def _update(self) -> None:
        prev, out = self.prior_rate, []
        for a, n, p in zip(self._acc, self._reached, self._prior):
            prev = (a + p * prev) / (n + p)
            out.append(prev)
        self.mean = out

    def _age(self) -> None:
        if self.decay >= 1.0:
            return
        d, floor = self.decay, self.min_weight
        for j, (n, p) in enumerate(zip(self._reached, self._prior)):
            total = n + p
            f = d if total * d >= floor else (floor / total if total > floor else 1.0)
            self._acc[j] *= f
            self._reached[j] = n * f
            self._prior[j] = p * f

    def tick(self) -> None:
        """Age the estimates by one step (a step without a verify)."""
        self._age()
        self._update()

    def observe(self, width: int, accept_lens: Sequence[int]) -> None:
        """Merge one verify step: `accept_lens[i]` drafts of request i accepted (0..width)."""
        if not (is_int(width) and 0 <= width <= len(self.mean)):
            raise policy_error(f"width = {width!r} must be an int in [0, {len(self.mean)}]")
        self._age()
        reached, accepted = position_counts(width, accept_lens)
        for j in range(width):
            self._acc[j] += accepted[j]
            self._reached[j] += reached[j]
        self._update()

    def rates(self) -> list[float]:
        """a_1..a_{B-1}."""
        return list(self.mean)

    def expected_commit(self, width: int) -> float:
        """E(width): expected committed tokens per request, bonus included."""
        return expected_commits(self.mean[:width])[-1]
