"""The speculation policy's settings: the public `PolicyConfig` and the internal `Tuning`.

`PolicyConfig` holds what a user sets (JSON through `--speculative-adaptive-config`,
or the `SGLANG_DFLASH_POLICY` alias); every key is validated and a bad one fails
start-up with an error naming it. `Tuning` holds the controller's internal
constants in one place: they are not user settings (each was measured once and
is recorded in docs/decisions.md), but tests and experiments may pass a variant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sglang_dflash.checks import is_finite, is_int, is_real

MODES = ("adaptive", "fixed", "on", "off")
_PREFIX = "speculation policy: "


def policy_error(message: str) -> ValueError:
    return ValueError(_PREFIX + message)


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise policy_error(f"{key} = {value!r} {rule}")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """User settings of the speculation policy (docs/policy.md explains each)."""

    mode: str = "adaptive"  # adaptive | on (W = B-1 always) | off (W = 0) | fixed (fixed_width)
    fixed_width: int | None = None  # verified drafts per step; required iff mode == "fixed"
    switch_margin: float = 0.05  # a width must beat the current one by this fraction ...
    switch_patience: int = 4  # ... for this many consecutive steps before the policy switches
    probe_interval: int = 50  # decode steps between exploratory probes; 0 disables probing
    acceptance_half_life: float = 50.0  # steps; weight of old acceptance observations halves
    trial_steps: int = 128  # decode steps of an on/off trial; 0 disables trials
    trial_close: float = 0.15  # trials run while best-on / off is within 1 +- this

    def __post_init__(self) -> None:
        require(self.mode in MODES, "mode", self.mode, f"must be one of {list(MODES)}")
        if self.mode == "fixed":
            require(is_int(self.fixed_width) and self.fixed_width >= 0, "fixed_width",
                    self.fixed_width, "must be an int >= 0 when mode = 'fixed'")
        else:
            require(self.fixed_width is None, "fixed_width", self.fixed_width,
                    f"is only used with mode = 'fixed' (mode is {self.mode!r})")
        require(is_real(self.switch_margin) and 0 <= self.switch_margin < 1, "switch_margin",
                self.switch_margin, "must be a number in [0, 1)")
        require(is_int(self.switch_patience) and self.switch_patience >= 1, "switch_patience",
                self.switch_patience, "must be an int >= 1")
        require(is_int(self.probe_interval) and self.probe_interval >= 0, "probe_interval",
                self.probe_interval, "must be an int >= 0 (0 disables probing)")
        require(is_real(self.acceptance_half_life) and self.acceptance_half_life > 0,
                "acceptance_half_life", self.acceptance_half_life,
                "must be a number > 0 (inf = no decay)")
        require(is_int(self.trial_steps) and (self.trial_steps == 0 or self.trial_steps >= 8),
                "trial_steps", self.trial_steps, "must be an int >= 8, or 0 (no trials)")
        require(is_finite(self.trial_close) and self.trial_close > 0, "trial_close",
                self.trial_close, "must be a finite number > 0")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicyConfig:
        """Build from a JSON object; unknown keys raise `ValueError` naming them."""
        if not isinstance(d, Mapping):
            raise policy_error(f"config must be a JSON object, got {type(d).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            hint = ""
            if all(str(k).isdigit() for k in unknown):
                hint = (" (batch-size keys are SGLang's EAGLE adaptive format; DFLASH's policy "
                        "takes the keys below)")
            raise policy_error(f"unknown config key(s) {unknown}{hint}; known keys: {known}")
        return cls(**dict(d))


@dataclass(frozen=True, slots=True)
class Tuning:
    """Internal constants of the controller, cost model and trials (not user settings)."""

    urgent_margin: float = 0.30  # a width this much better switches at once (a load burst)
    probe_width: int = 2  # W of the periodic probe while off (largest candidate <= this)
    probe_length: int = 1  # steps a probe runs (the worker uses 2 under the overlap scheduler)
    probe_backoff: int = 4  # the probe interval doubles after each quiet probe, up to this factor
    # ... and further, up to this factor, while off and each probe leaves speculation predicted
    # to lose: there every probe costs plain steps and mostly re-confirms off (a load change,
    # a switch, or a probe that does not confirm brings the interval back down).
    off_probe_backoff: int = 16
    probe_share: float | None = 0.02  # a costly probe's extra time <= this share of the time between
    early_on_probes: int = 3  # early W > 0 probes while off, per batch-size bucket
    early_off_probes: int = 3  # early W = 0 probes while on, per batch-size bucket
    cold_hold: int = 16  # steps the cold start holds the widest width before a step is timed
    stale_off_weight: float = 1.5  # a W = 0 cost cell lighter than this is stale ...
    refresh_close: float = 0.30  # ... and re-measured if off is within this of the current width
    refresh_weight: float = 1.0  # the W = 0 cell's weight a refresh leaves before its own samples
    min_weight: float = 4.0  # floor of an acceptance position's decayed weight; the prior's weight
    prior_rate: float = 0.7  # acceptance rate a_1 before any observation
    cost_ema: float = 0.05  # forgetting factor of the online step-time fit (~1/cost_ema steps)
    cost_prior_weight: float = 1.0  # pseudo-steps holding the fit's scale at the profile's
    cost_outlier_ratio: float = 3.0  # measured / predicted step time clipped to [1/r, r]
    trial_every: int = 1024  # steps between trials while the load holds
    trial_prior: bool = True  # a load's bias < 1 stays as a prior at the next load until measured

    def __post_init__(self) -> None:
        require(is_real(self.urgent_margin) and self.urgent_margin >= 0, "urgent_margin",
                self.urgent_margin, "must be a number >= 0")
        for key in ("probe_width", "probe_length", "probe_backoff", "off_probe_backoff", "cold_hold"):
            value = getattr(self, key)
            require(is_int(value) and value >= 1, key, value, "must be an int >= 1")
        for key in ("early_on_probes", "early_off_probes"):
            value = getattr(self, key)
            require(is_int(value) and value >= 0, key, value, "must be an int >= 0")
        require(self.probe_share is None or (is_real(self.probe_share) and 0 < self.probe_share <= 1),
                "probe_share", self.probe_share, "must be a number in (0, 1], or None")
        for key in ("min_weight", "cost_prior_weight", "stale_off_weight", "refresh_weight"):
            value = getattr(self, key)
            require(is_finite(value) and value > 0, key, value, "must be a finite number > 0")
        require(is_real(self.prior_rate) and 0 <= self.prior_rate <= 1, "prior_rate",
                self.prior_rate, "must be a number in [0, 1]")
        require(is_real(self.cost_ema) and 0 < self.cost_ema <= 1, "cost_ema", self.cost_ema,
                "must be a number in (0, 1]")
        require(is_finite(self.cost_outlier_ratio) and self.cost_outlier_ratio > 1,
                "cost_outlier_ratio", self.cost_outlier_ratio, "must be a finite number > 1")
        require(is_int(self.trial_every) and self.trial_every >= 8, "trial_every",
                self.trial_every, "must be an int >= 8")


TUNING = Tuning()


def load_policy_config(raw: str | None, source: str) -> PolicyConfig:
    """A `PolicyConfig` from inline JSON or a JSON file path (`raw`); None or
    empty gives the default (adaptive). `source` names where it came from, for
    errors (a flag or an environment variable)."""
    raw = (raw or "").strip()
    if not raw:
        return PolicyConfig()
    if not raw.startswith("{"):
        try:
            with open(raw) as f:
                raw = f.read()
        except OSError as e:
            raise policy_error(f"{source}: cannot read {raw!r} ({e.strerror})") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise policy_error(f"{source}: not valid JSON ({e})") from None
    try:
        return PolicyConfig.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from None
