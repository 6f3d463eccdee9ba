"""Subprocess body of test_model_class.py (SGLang must be imported after the
CPU runtime is set up): load each drafter checkpoint through SGLang's own
ModelRegistry and model loader interface, compare with `load_drafter`, print
one JSON line {drafter dir: result}.

    python model_class_check.py DRAFTER TARGET [DRAFTER TARGET ...]
"""

import json
import os
import sys


def check(drafter_dir, target_dir) -> dict:
    import torch
    from safetensors.torch import load_file
    from sglang.srt.models.registry import ModelRegistry
    from transformers import AutoConfig

    from sglang_dflash.checkpoint import load_drafter

    hf = AutoConfig.from_pretrained(drafter_dir)
    cls, arch = ModelRegistry.resolve_model_cls(hf.architectures)
    model = cls(hf)
    weights = load_file(os.path.join(drafter_dir, "model.safetensors"))
    out = {"arch": arch, "module": cls.__module__}
    try:
        model.load_weights(iter(weights.items()))
    except ValueError as exc:
        return {**out, "error": str(exc)}
    tcfg = json.load(open(os.path.join(target_dir, "config.json")))
    ref = load_drafter(drafter_dir, target_hidden_size=tcfg["hidden_size"],
                       target_vocab_size=tcfg["vocab_size"],
                       target_num_layers=tcfg["num_hidden_layers"])
    cfg = ref.cfg
    g = torch.Generator().manual_seed(0)
    bs, ctx, block = 2, 11, cfg.block_size
    embeds = torch.randn(bs, block, cfg.hidden_size, generator=g)
    positions = torch.arange(ctx, ctx + block).expand(bs, -1)
    shape = (cfg.num_hidden_layers, bs, ctx, cfg.num_key_value_heads, cfg.head_dim)
    ctx_k, ctx_v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    valid = torch.ones(bs, ctx, dtype=torch.bool)
    with torch.no_grad():
        a = model.eval()(embeds, positions, ctx_k, ctx_v, valid)
        b = ref.forward_block(embeds, positions, ctx_k, ctx_v, valid)
    return {**out, "identical": bool(torch.equal(a, b)), "version": cfg.version}


def main():
    from sglang_dflash import cpu_runtime

    if not cpu_runtime.cuda_available():
        cpu_runtime.activate()
    from sglang_dflash.adapter.plugin import register_model_classes

    register_model_classes()
    pairs = sys.argv[1:]
    print(json.dumps({drafter: check(drafter, target) for drafter, target in zip(pairs[::2], pairs[1::2])}))


if __name__ == "__main__":
    main()
