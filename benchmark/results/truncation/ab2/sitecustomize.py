# Throwaway A/B of two whole policies in one engine: with AB_SLICE=s, odd s-second slices run the
# configured policy (SGLANG_DFLASH_POLICY, e.g. adaptive + truncate_below "auto", ragged verify),
# even slices a deep copy of it with truncate_below = 0 (no truncation). Each policy learns only
# from its own slices' steps (but for the one step in flight at a slice boundary). The slice is
# fixed at the start of each decode step. AB_OUT=path: committed tokens and steps per policy.
import os
if os.environ.get("AB_SLICE"):
    import copy, dataclasses, json, time
    _period = float(os.environ["AB_SLICE"])
    import sglang_dflash.adapter.worker as W
    _build = W.DFlashWorker._build_policy
    _decode = W.DFlashWorker._decode
    _feedback = W.DFlashWorker.on_verify_complete_cpu
    _counts = {"old": [0, 0, set()], "new": [0, 0, set()]}  # tokens, steps, slices

    def _now():
        s = int(time.perf_counter() / _period)
        return ("new" if s % 2 else "old"), s

    def _build_both(self):
        new = _build(self)
        old = copy.deepcopy(new)
        old.cfg = dataclasses.replace(new.cfg, truncate_below=0.0)
        self._ab = {"new": new, "old": old}
        self._ab_key = "new"
        return new

    def _policy_get(self):
        return self._ab[self._ab_key]

    def _decode_ab(self, batch, on_publish):
        self._ab_key, s = _now()
        self._ragged = self._ab_key == "new"  # the demo pair runs on our torch_native verify backend
        _counts[self._ab_key][2].add(s)
        return _decode(self, batch, on_publish)

    def _on_verify(self, num_correct, batch_size=0):
        acc = list(num_correct)
        c = _counts[self._ab_key]
        c[0] += sum(acc) + len(acc); c[1] += 1
        if (_counts["old"][1] + _counts["new"][1]) % 50 == 0 and os.environ.get("AB_OUT"):
            json.dump({k: {"tokens": v[0], "steps": v[1], "slices": len(v[2]),
                           "yield": self._ab[k].truncation_yield.snapshot(),
                           "spec_steps": self._ab[k].spec_steps} for k, v in _counts.items()},
                      open(os.environ["AB_OUT"], "w"))
        return _feedback(self, num_correct, batch_size)

    W.DFlashWorker._build_policy = _build_both
    W.DFlashWorker.policy = property(_policy_get, lambda self, value: None)
    W.DFlashWorker._decode = _decode_ab
    W.DFlashWorker.on_verify_complete_cpu = _on_verify
