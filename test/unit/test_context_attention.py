"""The drafter's block attention over its paged context (ops.block_context_attention)
against the gathered path the worker runs on CPU: `forward_block_paged` equals
`forward_block` for non-causal, causal and windowed layers, ragged lengths (an
empty context included) and any slot order. The Triton kernel's parity with
this twin is checked under the interpreter in test_ops_interpret.py."""

import sys
from pathlib import Path

import pytest
import torch

try:
    import sglang_dflash  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from sglang_dflash.config import parse_drafter_config  # noqa: E402
from sglang_dflash.draft import context_slots  # noqa: E402
from sglang_dflash.model import DFlashDrafter, PagedContext  # noqa: E402
from sglang_dflash.ragged import gather_rows  # noqa: E402
from test_model_attention_types import TARGET, raw_config  # noqa: E402

torch.set_num_threads(1)


def _config(**top):
    return parse_drafter_config(raw_config(**top), **TARGET)


@pytest.mark.parametrize("layers", [
    {},  # non-causal, full
    {"layer_types": ["sliding_attention"] * 2, "sliding_window": 6, "use_sliding_window": True,
     "is_causal": True},
    {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 9,
     "use_sliding_window": True, "is_causal": False},
    # sglang's Laguna drafter: the attention output gated after either path's attention
    {"architectures": ["DFlashLagunaForCausalLM"]},
    {"architectures": ["DFlashLagunaForCausalLM"], "gating": "per-element"},
])
def test_paged_block_attention_equals_the_gathered_path(layers):
    cfg = _config(**layers)
    assert cfg.has_masked_layers == ("layer_types" in layers), (cfg.layer_causal, cfg.layer_window)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).eval()
    for p in drafter.parameters():
        torch.nn.init.normal_(p, std=0.2)
    bs, block, slots = 4, cfg.block_size, 300
    shape = (cfg.num_hidden_layers, slots, cfg.num_key_value_heads, cfg.head_dim)
    k_cache, v_cache = torch.randn(shape), torch.randn(shape)
    req_to_token = torch.randperm(slots)[:6 * 48].view(6, 48).to(torch.int32)
    req_pool_indices = torch.tensor([5, 1, 3, 0])
    prefix = torch.tensor([40, 0, 17, 33])
    positions = prefix[:, None] + torch.arange(block)
    embeds = torch.randn(bs, block, cfg.hidden_size)

    rows = req_to_token[req_pool_indices]
    slot_table, valid = context_slots(rows, prefix)
    gathered = drafter.forward_block(embeds, positions, gather_rows(k_cache, slot_table, dim=1),
                                     gather_rows(v_cache, slot_table, dim=1), valid)
    paged = drafter.forward_block_paged(
        embeds, positions, PagedContext(k_cache, v_cache, req_to_token, req_pool_indices, prefix))
    torch.testing.assert_close(paged, gathered, rtol=1e-5, atol=1e-5)
