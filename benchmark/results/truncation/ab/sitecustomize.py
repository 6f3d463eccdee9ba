# Throwaway A/B switch: with AB_SLICE=s, odd s-second slices run ragged verify, even slices do not.
# AB_OUT=path: committed tokens and decode steps per slice parity (written every 50 steps).
import os
if os.environ.get("AB_SLICE"):
    import json, time
    _period = float(os.environ["AB_SLICE"])
    def _new():
        return int(time.perf_counter() / _period) % 2 == 1
    import sglang_dflash.adapter.worker as W
    _orig = W.DFlashWorker.ragged
    W.DFlashWorker.ragged = property(lambda self: _orig.fget(self) and _new())
    _counts = {"old": [0, 0], "new": [0, 0]}  # tokens, steps
    _slices = {"old": set(), "new": set()}
    _feedback = W.DFlashWorker.on_verify_complete_cpu
    def _on_verify(self, num_correct, batch_size=0):
        k = "new" if _new() else "old"
        acc = list(num_correct)
        _counts[k][0] += sum(acc) + len(acc); _counts[k][1] += 1
        _slices[k].add(int(time.perf_counter() / _period))
        if (_counts["old"][1] + _counts["new"][1]) % 50 == 0 and os.environ.get("AB_OUT"):
            json.dump({k: {"tokens": v[0], "steps": v[1], "slices": len(_slices[k])} for k, v in _counts.items()},
                      open(os.environ["AB_OUT"], "w"))
        return _feedback(self, num_correct, batch_size)
    W.DFlashWorker.on_verify_complete_cpu = _on_verify
