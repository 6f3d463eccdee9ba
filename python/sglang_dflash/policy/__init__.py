"""The speculation policy: which verify width each decode step runs.

config.py (settings), acceptance.py (online acceptance rates, E(W)),
cost_model.py (step time t(bs, W)), trials.py (on/off trials by served
throughput), controller.py (`SpeculationPolicy`, the per-step decision).
Host-side stdlib arithmetic only: nothing here imports torch or SGLang.
"""

from sglang_dflash.policy.acceptance import AcceptanceStats, expected_commits
from sglang_dflash.policy.config import (
    MODES, TUNING, PolicyConfig, Tuning, load_policy_config, policy_error,
)
from sglang_dflash.policy.controller import SpeculationPolicy, best_width_bruteforce
from sglang_dflash.policy.cost_model import CostModel, bucket_of, bucket_range

__all__ = [
    "MODES", "TUNING", "AcceptanceStats", "CostModel", "PolicyConfig", "SpeculationPolicy",
    "Tuning", "best_width_bruteforce", "bucket_of", "bucket_range", "expected_commits",
    "load_policy_config",
    "policy_error",
]
