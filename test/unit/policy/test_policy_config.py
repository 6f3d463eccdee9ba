"""PolicyConfig (user settings), Tuning (internal constants) and JSON loading."""

import json
from dataclasses import fields

import pytest
from sglang_dflash.policy import PolicyConfig, Tuning, load_policy_config


def test_public_surface_is_small_and_documented():
    names = [f.name for f in fields(PolicyConfig)]
    assert len(names) <= 8
    assert names[0] == "mode" and PolicyConfig().mode == "adaptive"


def test_from_dict_and_unknown_keys_are_named():
    cfg = PolicyConfig.from_dict({"mode": "fixed", "fixed_width": 3, "switch_margin": 0.1})
    assert (cfg.mode, cfg.fixed_width, cfg.switch_margin) == ("fixed", 3, 0.1)
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['swich_margin'\]"):
        PolicyConfig.from_dict({"swich_margin": 0.1})
    # SGLang's EAGLE adaptive format (batch-size keys) gets a hint, not just "unknown".
    with pytest.raises(ValueError, match="EAGLE adaptive format"):
        PolicyConfig.from_dict({"1": {"candidate_steps": [1, 3]}})
    with pytest.raises(ValueError, match="JSON object"):
        PolicyConfig.from_dict([1, 2])


@pytest.mark.parametrize("bad, key", [
    ({"mode": "auto"}, "mode"), ({"mode": "fixed"}, "fixed_width"), ({"fixed_width": 2}, "fixed_width"),
    ({"switch_margin": -0.1}, "switch_margin"), ({"switch_margin": 1.0}, "switch_margin"),
    ({"switch_patience": 0}, "switch_patience"), ({"switch_patience": True}, "switch_patience"),
    ({"probe_interval": -1}, "probe_interval"), ({"acceptance_half_life": 0}, "acceptance_half_life"),
    ({"trial_steps": 4}, "trial_steps"), ({"trial_close": -0.1}, "trial_close"),
    ({"trial_close": float("inf")}, "trial_close"),
])
def test_bad_settings_name_their_key(bad, key):
    with pytest.raises(ValueError, match=f"speculation policy: {key} = "):
        PolicyConfig(**bad)


@pytest.mark.parametrize("bad, key", [
    ({"probe_width": 0}, "probe_width"), ({"probe_backoff": 0}, "probe_backoff"),
    ({"probe_share": 0}, "probe_share"), ({"probe_share": 1.5}, "probe_share"),
    ({"prior_rate": 1.5}, "prior_rate"), ({"cost_ema": 0.0}, "cost_ema"),
    ({"cost_outlier_ratio": 1.0}, "cost_outlier_ratio"), ({"min_weight": float("nan")}, "min_weight"),
    ({"early_on_probes": -1}, "early_on_probes"), ({"trial_every": 4}, "trial_every"),
])
def test_tuning_is_validated_too(bad, key):
    with pytest.raises(ValueError, match=key):
        Tuning(**bad)


def test_load_inline_file_and_default(tmp_path):
    assert load_policy_config(None, "X") == PolicyConfig()
    assert load_policy_config("  ", "X") == PolicyConfig()
    assert load_policy_config('{"mode": "on"}', "X").mode == "on"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"mode": "off"}))
    assert load_policy_config(str(path), "X").mode == "off"


def test_load_errors_name_the_source_and_key(tmp_path):
    with pytest.raises(ValueError, match="--flag: cannot read"):
        load_policy_config(str(tmp_path / "missing.json"), "--flag")
    with pytest.raises(ValueError, match="--flag: not valid JSON"):
        load_policy_config("{mode: on}", "--flag")
    with pytest.raises(ValueError, match="ENV: speculation policy: switch_patience = 0"):
        load_policy_config('{"switch_patience": 0}', "ENV")
