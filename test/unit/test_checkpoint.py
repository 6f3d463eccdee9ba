"""Strict drafter checkpoint save / load."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.checkpoint import (  # noqa: E402
    load_drafter,
    load_state_strict,
    mask_embedding_for,
    save_drafter,
    update_weights_in_place,
)
from sglang_dflash.config import parse_drafter_config  # noqa: E402
from sglang_dflash.model import DFlashDrafter  # noqa: E402

torch.set_num_threads(1)

TARGET = dict(target_hidden_size=32, target_vocab_size=96, target_num_layers=4)


ARCHITECTURES = {1: "DFlashDraftModel", 2: "DFlash2DraftModel", "laguna": "DFlashLagunaForCausalLM"}


def cfg_dict(version=1):
    dflash = {"block_size": 4, "target_layer_ids": [0, 2], "mask_token_id": 95}
    if version == 2:
        dflash.update(conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=5)
    return {
        "architectures": [ARCHITECTURES[version]],
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "vocab_size": 96, "rope_theta": 10000.0, "num_target_layers": 4,
        "dflash_config": dflash,
    }


def saved(tmp_path, version=1, seed=0):
    raw = cfg_dict(version)
    torch.manual_seed(seed)
    model = DFlashDrafter(parse_drafter_config(raw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_drafter(model, raw, tmp_path)
    return model.eval(), tmp_path


def rewrite_weights(path: Path, mutate):
    weights = load_file(str(path / "model.safetensors"))
    mutate(weights)
    save_file(weights, str(path / "model.safetensors"))


def block_outputs(model):
    gen = torch.Generator().manual_seed(1)
    cfg = model.cfg
    feats = torch.randn(5, 2 * 32, generator=gen)
    k, v = model.context_kv(model.context_features(feats), torch.arange(5))
    embeds = torch.randn(1, cfg.block_size, 32, generator=gen)
    pos = torch.arange(5, 5 + cfg.block_size)[None]
    valid = torch.ones(1, 5, dtype=torch.bool)
    return model.forward_block(embeds, pos, k[:, None], v[:, None], valid)


@pytest.mark.parametrize("version", [1, 2, "laguna"])
def test_round_trip_identical(tmp_path, version):
    model, path = saved(tmp_path, version)
    loaded = load_drafter(path, **TARGET)
    assert loaded.cfg == model.cfg
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with torch.no_grad():
        assert torch.equal(block_outputs(loaded), block_outputs(model))
    assert json.loads((path / "config.json").read_text()) == cfg_dict(version)


def test_save_is_deterministic(tmp_path):
    _, a = saved(tmp_path / "a")
    _, b = saved(tmp_path / "b")
    for name in ("model.safetensors", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_model_prefix_and_sharding_tolerated(tmp_path):
    model, path = saved(tmp_path)
    weights = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(weights)
    save_file({"model." + n: weights[n] for n in names[:10]}, str(path / "part-1.safetensors"))
    save_file({n: weights[n] for n in names[10:]}, str(path / "part-2.safetensors"))
    loaded = load_drafter(path, **TARGET)
    assert torch.equal(loaded.fc.weight, model.fc.weight)


def test_dtype_cast(tmp_path):
    _, path = saved(tmp_path)
    assert load_drafter(path, **TARGET, dtype=torch.bfloat16).fc.weight.dtype == torch.bfloat16


def expect_error(path, *words, **target):
    with pytest.raises(ValueError) as info:
        load_drafter(path, **(target or TARGET))
    message = str(info.value)
    assert message.startswith(f"invalid DFlash drafter checkpoint at {path}: "), message
    for word in words:
        assert word in message, (word, message)
    return message


def test_missing_weight(tmp_path):
    _, path = saved(tmp_path, version=2)
    rewrite_weights(path, lambda w: [w.pop("layers.1.mlp_conv.base_kernel"),
                                     w.pop("candidate_selector.successor_codebook")])
    expect_error(path, "missing weights", "layers.1.mlp_conv.base_kernel",
                 "candidate_selector.successor_codebook")


def test_missing_laguna_weights(tmp_path):
    """A Laguna drafter's gates and context norms are weights like any other."""
    _, path = saved(tmp_path, version="laguna")
    rewrite_weights(path, lambda w: [w.pop("layers.0.self_attn.g_proj.weight"),
                                     w.pop("aux_hidden_norms.1.weight")])
    expect_error(path, "missing weights", "layers.0.self_attn.g_proj.weight", "aux_hidden_norms.1.weight")


def test_extra_tensors_are_ignored_with_a_warning(tmp_path, caplog):
    """sglang's load_weights skips names it has no parameter for (HF rotary
    caches, a copy of the target's embedding or head); so do we, saying so."""
    model, path = saved(tmp_path)
    extras = {"lm_head.weight": torch.zeros(96, 32),
              "model.embed_tokens.weight": torch.zeros(96, 32),
              "layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4),
              "layers.1.self_attn.q_proj.bias": torch.zeros(32)}
    rewrite_weights(path, lambda w: w.update(extras))
    with caplog.at_level("WARNING", logger="sglang_dflash.checkpoint"):
        loaded = load_drafter(path, **TARGET)
    for name in ("lm_head.weight", "embed_tokens.weight", "rotary_emb.inv_freq", "q_proj.bias"):
        assert name in caplog.text, (name, caplog.text)
    assert "ignoring 4 tensors" in caplog.text
    with torch.no_grad():
        assert torch.equal(block_outputs(loaded), block_outputs(model))


def test_extra_tensors_are_listed_when_a_weight_is_missing(tmp_path):
    _, path = saved(tmp_path)
    rewrite_weights(path, lambda w: [w.update({"lm_head.weight": torch.zeros(96, 32)}),
                                     w.pop("norm.weight")])
    expect_error(path, "missing weights ['norm.weight']", "unexpected weights ['lm_head.weight']")


def test_domino_projector_weights_are_refused(tmp_path):
    _, path = saved(tmp_path)
    rewrite_weights(path, lambda w: w.update({"prefix_gru.weight_ih_l0": torch.zeros(4, 32)}))
    expect_error(path, "Domino projector weights", "prefix_gru.weight_ih_l0")


def test_native_export_aliases(tmp_path):
    model, path = saved(tmp_path)
    rewrite_weights(path, lambda w: w.update({
        "encoder.fc.weight": w.pop("fc.weight"),
        "encoder.output_norm_enc.weight": w.pop("hidden_norm.weight")}))
    loaded = load_drafter(path, **TARGET)
    assert torch.equal(loaded.fc.weight, model.fc.weight)
    assert torch.equal(loaded.hidden_norm.weight, model.hidden_norm.weight)


def test_extra_tensors_ignored_by_load_state_strict(caplog):
    model = DFlashDrafter(parse_drafter_config(cfg_dict()))
    pairs = [(n, t.clone()) for n, t in model.state_dict().items()]
    pairs.append(("rotary_emb.inv_freq", torch.ones(4)))
    target = DFlashDrafter(parse_drafter_config(cfg_dict()))
    with caplog.at_level("WARNING", logger="sglang_dflash.checkpoint"):
        load_state_strict(target, pairs, origin="DFlashDraftModel")
    assert "DFlashDraftModel" in caplog.text and "rotary_emb.inv_freq" in caplog.text
    with pytest.raises(ValueError, match=r"for DFlashDraftModel: missing weights \['fc.weight'\]"):
        load_state_strict(target, [p for p in pairs if p[0] != "fc.weight"],
                          origin="DFlashDraftModel")


def test_attention_bias_weights(tmp_path):
    raw = cfg_dict()
    raw["attention_bias"] = True
    torch.manual_seed(0)
    model = DFlashDrafter(parse_drafter_config(raw))
    assert model.layers[0].self_attn.o_proj.bias is not None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_drafter(model, raw, tmp_path)
    loaded = load_drafter(tmp_path, **TARGET)
    with torch.no_grad():
        assert torch.equal(block_outputs(loaded), block_outputs(model))
    rewrite_weights(tmp_path, lambda w: w.pop("layers.1.self_attn.v_proj.bias"))
    expect_error(tmp_path, "missing weights", "layers.1.self_attn.v_proj.bias")


# ---------------------------------------------------------------------------
# mask_embedding.pt
# ---------------------------------------------------------------------------


def write_mask_embedding(path, **saved):
    torch.save(saved, path / "mask_embedding.pt")


def test_mask_embedding_is_loaded_and_exposed(tmp_path):
    _, path = saved(tmp_path)
    assert load_drafter(path, **TARGET).mask_embedding is None
    emb = torch.randn(32)
    write_mask_embedding(path, embedding=emb, mask_token_id=95)
    loaded = load_drafter(path, **TARGET, dtype=torch.bfloat16)
    assert loaded.mask_embedding_token_id == 95
    assert loaded.mask_embedding.dtype == torch.bfloat16  # cast with the weights
    assert torch.equal(loaded.mask_embedding, emb.to(torch.bfloat16))
    assert "mask_embedding" not in loaded.state_dict()  # not a weight
    assert torch.equal(mask_embedding_for(loaded, 95), loaded.mask_embedding)
    with pytest.raises(ValueError, match="mask_token_id = 95.*resolved mask token id is 7"):
        mask_embedding_for(loaded, 7)
    # save_drafter writes it back.
    save_drafter(loaded.float(), cfg_dict(), tmp_path / "again")
    again = load_drafter(tmp_path / "again", **TARGET)
    assert again.mask_embedding_token_id == 95


def test_mask_embedding_without_config_mask_id(tmp_path):
    raw = cfg_dict()
    del raw["dflash_config"]["mask_token_id"]
    model = DFlashDrafter(parse_drafter_config(raw))
    save_drafter(model, raw, tmp_path)
    write_mask_embedding(tmp_path, embedding=torch.ones(32), mask_token_id=torch.tensor(40))
    loaded = load_drafter(tmp_path, **TARGET)
    assert loaded.cfg.mask_token_id is None and loaded.mask_embedding_token_id == 40
    assert mask_embedding_for(loaded, 40) is not None


@pytest.mark.parametrize("saved_dict,words", [
    (dict(embedding=torch.ones(32), mask_token_id=7), ["mask_token_id = 7", "differs", "95"]),
    (dict(embedding=torch.ones(1, 32), mask_token_id=95), ["shape [1, 32]", "expected [32]"]),
    (dict(embedding=torch.ones(32), mask_token_id=95, per_position=True), ["per_position"]),
    (dict(embedding=torch.full((32,), float("nan")), mask_token_id=95), ["non-finite"]),
    (dict(embedding=torch.ones(32)), ["'mask_token_id'"]),
    (dict(embedding=torch.ones(32), mask_token_id=500), ["mask_token_id = 500"]),
])
def test_bad_mask_embedding(tmp_path, saved_dict, words):
    _, path = saved(tmp_path)
    write_mask_embedding(path, **saved_dict)
    expect_error(path, "mask_embedding.pt", *words)


def test_misnamed_weight(tmp_path):
    _, path = saved(tmp_path, version=2)
    rewrite_weights(path, lambda w: w.update(
        {"candidate_selector.pred_codebook": w.pop("candidate_selector.predecessor_codebook")}))
    msg = expect_error(path, "missing weights", "candidate_selector.predecessor_codebook",
                       "unexpected weights", "candidate_selector.pred_codebook")
    assert "missing" in msg


def test_wrong_shape(tmp_path):
    _, path = saved(tmp_path)
    rewrite_weights(path, lambda w: w.update({"fc.weight": torch.zeros(32, 96)}))
    expect_error(path, "fc.weight", "[32, 96]", "expected [32, 64]")


def test_non_finite(tmp_path):
    _, path = saved(tmp_path)

    def poison(w):
        w["norm.weight"][3] = float("nan")
    rewrite_weights(path, poison)
    expect_error(path, "norm.weight", "non-finite")


def test_no_weight_files(tmp_path):
    _, path = saved(tmp_path)
    (path / "model.safetensors").unlink()
    expect_error(path, "no *.safetensors")


def test_no_config(tmp_path):
    _, path = saved(tmp_path)
    (path / "config.json").unlink()
    expect_error(path, "config.json not found")


def test_hidden_size_mismatch(tmp_path):
    _, path = saved(tmp_path)
    expect_error(path, "hidden_size = 32", "target's hidden_size = 64",
                 **{**TARGET, "target_hidden_size": 64})


def test_vocab_mismatch(tmp_path):
    _, path = saved(tmp_path)
    expect_error(path, "vocab_size = 96", "target's vocab_size = 128",
                 **{**TARGET, "target_vocab_size": 128})


def test_target_layer_ids_out_of_range(tmp_path):
    _, path = saved(tmp_path)
    raw = cfg_dict()
    raw["dflash_config"]["target_layer_ids"] = [0, 5]
    (path / "config.json").write_text(json.dumps(raw))
    expect_error(path, "dflash_config.target_layer_ids[1] = 5", "out of range",
                 "4 layers")


def test_save_rejects_mismatched_config(tmp_path):
    model = DFlashDrafter(parse_drafter_config(cfg_dict()))
    raw = cfg_dict()
    raw["num_hidden_layers"] = 3
    with pytest.raises(ValueError, match="differs"):
        save_drafter(model, raw, tmp_path)


ASSETS = Path(sys.modules["sglang_dflash"].__file__).resolve().parent / "assets" / "tiny"


@pytest.mark.parametrize("name,version", [("drafter-random", 1), ("dflash2-random", 2),
                                          ("drafter-trained", 1), ("hybrid-drafter-trained", 1)])
def test_bundled_tiny_drafters_load(name, version):
    if not (ASSETS / name / "config.json").is_file():
        pytest.skip(f"{ASSETS / name} not built (python -m sglang_dflash.tools.tiny_models)")
    target = json.loads((ASSETS / "target" / "config.json").read_text())
    model = load_drafter(ASSETS / name, target_hidden_size=target["hidden_size"],
                         target_vocab_size=target["vocab_size"],
                         target_num_layers=target["num_hidden_layers"])
    assert model.cfg.version == version and model.cfg.block_size == 8
    assert model.cfg.mask_token_id is not None


# ---- live weight updates (update_weights_in_place) -----------------------------------


def _pair_models(version=2):
    """Two drafters of one config with different weights: (live, source)."""
    raw = cfg_dict(version)
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(DFlashDrafter(parse_drafter_config(raw)).eval())
    return models


def _states_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("version", [1, 2])
def test_update_in_place_selector_draft(version):
    """Every tensor is the drafter's; the `model.` alias is allowed; storage is
    kept (captured graphs keep reading the parameters they captured)."""
    live, source = _pair_models(version)
    storage = {n: p.data_ptr() for n, p in live.named_parameters()}
    pairs = [(("model." + n) if i % 2 else n, t.clone()) for i, (n, t) in enumerate(source.state_dict().items())]
    assert update_weights_in_place(live, pairs, origin="test", shared=False) == len(pairs)
    assert _states_equal(live, source)
    assert storage == {n: p.data_ptr() for n, p in live.named_parameters()}


def test_update_in_place_shared_takes_only_exact_drafter_names():
    """Selector "all": the target's tensors ride along; `model.layers.0...` is the
    target's layer 0 (same shape as the drafter's) and must not be loaded."""
    live, source = _pair_models()
    before = {k: v.clone() for k, v in live.state_dict().items()}
    name, tensor = next(iter(source.state_dict().items()))
    target_side = [("model." + n, t.clone()) for n, t in source.state_dict().items()]
    target_side += [("lm_head.weight", torch.zeros(96, 32)), ("model.embed_tokens.weight", torch.zeros(96, 32))]
    assert update_weights_in_place(live, target_side, origin="test", shared=True) == 0
    assert all(torch.equal(before[k], v) for k, v in live.state_dict().items())
    assert update_weights_in_place(live, target_side + [(name, tensor)], origin="test", shared=True) == 1
    assert torch.equal(live.state_dict()[name], tensor)


@pytest.mark.parametrize("bad, words", [
    (lambda n, t: [("layers.9.mlp.up_proj.weight", t)], "the drafter has no weights ['layers.9.mlp.up_proj.weight']"),
    (lambda n, t: [(n, t[:1])], "has shape"),
    (lambda n, t: [(n, torch.full_like(t, float("nan")))], "non-finite"),
    (lambda n, t: [(n, t.long())], "float dtype"),
    (lambda n, t: [(n, t), ("model." + n, t)], "more than once"),
])
def test_update_in_place_refusals_change_nothing(bad, words):
    """A refused update names its fault and leaves every weight as it was, even
    the valid tensors sent with the bad one."""
    live, source = _pair_models()
    before = {k: v.clone() for k, v in live.state_dict().items()}
    good = list(source.state_dict().items())
    name, tensor = good[-1]
    with pytest.raises(ValueError, match="drafter weight update from test refused") as info:
        update_weights_in_place(live, good[:-1] + bad(name, tensor.clone()), origin="test", shared=False)
    assert words in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in live.state_dict().items())
