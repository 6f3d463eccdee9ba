"""Weight operations on a live DFLASH server (`update_weights_from_*`,
`begin/end_weight_update`, `check_weights`), for the drafter as SGLang's
"draft" runner.

SGLang's scheduler applies each weight operation to the runners its `selector`
names: "target", "draft" or "all" (the default; disk and IPC updates always
use it). Our drafter is not a ModelRunner, so this module gives it the runner
interface those operations call, bound to the selector (a hook on the
manager's runner selection):

* Tensors (`update_weights_from_tensor`, `update_weights_from_distributed`)
  under "draft" are all the drafter's, under published names (`model.`
  allowed); a name it lacks is refused. Under "all" the same tensors also go to
  the target, so only exact published drafter names are taken and the target's
  (`model.*`, `lm_head.*`) are left to it. Upstream's drafter takes any name it
  can map after stripping `model.`, so a target update under "all" overwrites
  its layers with the target's of the same index.
* Disk and checkpoint-engine IPC updates carry the target's checkpoint: the
  drafter keeps its weights (a drafter is loaded from its own checkpoint only
  at start-up; upstream loads the target's tensors into it).
* After any update that reached the target, a trained mask embedding
  (`mask_embedding.pt`) is written again into the target's embedding row,
  which the target's new weights overwrote.
* `check_weights` (snapshot / compare / checksum / reset) covers the
  drafter's parameters and buffers through SGLang's own `WeightChecker`.

Context rows the drafter projected before an update stay in its cache until
their slots are reused (SGLang flushes the radix cache after an update unless
`flush_cache` is false); they only change what is drafted, never what is
committed, since the target verifies every token.
"""

from __future__ import annotations

import logging

from sglang.srt.runtime_context import get_parallel

from sglang_dflash.checkpoint import update_weights_in_place

logger = logging.getLogger(__name__)

SELECT_TARGET = ("sglang.srt.managers.scheduler_components.weight_updater."
                 "SchedulerWeightUpdaterManager._select_runners")
_ROLES = {"all": ("target", "draft"), "target": ("target",), "draft": ("draft",)}


class DrafterWeightRunner:
    """The drafter in a weight operation: `weight_updater` and `check_weights`
    as SGLang calls them on a ModelRunner. `draft`: the selector names the
    drafter; `target`: it names the target too (the tensors are shared and the
    mask embedding row is restored after the target's load)."""

    def __init__(self, worker, *, draft: bool, target: bool):
        self.worker = worker
        self.draft = draft
        self.target = target
        self.weight_updater = self

    # ---- session ----------------------------------------------------------------

    def begin_weight_update(self) -> None:
        """Nothing to unpack: the drafter's weights are kept as loaded."""

    def end_weight_update(self, *, run_post_load: bool = True) -> None:
        """Nothing to repack (see begin_weight_update)."""

    # ---- loads ------------------------------------------------------------------

    def update_weights_from_disk(self, model_path, load_format=None, recapture_cuda_graph=False):
        return self._done(0, "the drafter keeps its weights: a disk update loads the target")

    def update_weights_from_ipc(self, recv_req):
        return self._done(0, "the drafter keeps its weights: an IPC update loads the target")

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        if not self.draft:
            return self._done(0, "the drafter is not selected")
        if load_format == "flattened_bucket":
            named_tensors = _reconstruct_bucket(named_tensors)
        elif load_format not in (None, "direct"):
            if self.target:  # a target-specific loader: its tensors are not ours
                return self._done(0, f"the drafter keeps its weights: load_format {load_format!r} "
                                     "is the target's")
            return False, (f"sglang-dflash drafter: load_format {load_format!r} is not supported "
                           "for drafter weights (use the default or 'flattened_bucket')")
        return self._load(named_tensors, "update_weights_from_tensor")

    def load_weights_from_distributed(self, named_tensors):
        if not self.draft:
            return self._done(0, "the drafter is not selected")
        return self._load(named_tensors, "update_weights_from_distributed")

    def _load(self, named_tensors, origin: str):
        rank = get_parallel().tp_rank
        pairs = [(name, _local_tensor(tensor, rank)) for name, tensor in named_tensors]
        try:
            count = update_weights_in_place(self.worker.drafter, pairs, origin=origin, shared=self.target)
        except ValueError as exc:
            logger.error("sglang-dflash: %s", exc)
            return False, str(exc)
        return self._done(count, f"drafter: {count} tensors updated")

    def _done(self, count: int, note: str):
        """Success; SGLang reports the last runner's message, so it says what
        happened to both."""
        if self.target:
            self.worker.merge_mask_embedding()
        if count:
            logger.info("sglang-dflash: %s", note)
        return True, f"Succeeded to update model weights ({note})."

    # ---- checks -----------------------------------------------------------------

    def check_weights(self, action, allow_quant_error=False, skip_tensor_list=None, *, role):
        if not self.draft:
            return None
        return self.worker.drafter_weight_checker.handle(
            action, allow_quant_error=allow_quant_error, skip_tensor_list=skip_tensor_list, role=role)


def _local_tensor(tensor, rank: int):
    """This rank's tensor from SGLang's per-rank serialized wrapper, or the tensor."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor

    return tensor.get(rank) if isinstance(tensor, LocalSerializedTensor) else tensor


def _reconstruct_bucket(bucket: dict):
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    return FlattenedTensorBucket(flattened_tensor=bucket["flattened_tensor"],
                                 metadata=bucket["metadata"]).reconstruct_tensors()


def bind_drafter_runner(original, manager, *args, **kwargs):
    """AROUND `SchedulerWeightUpdaterManager._select_runners(selector)`: under our
    DFLASH worker the drafter's runner is bound to the selector, and is listed
    (after the target's) whenever the target or the drafter is selected."""
    runners = original(manager, *args, **kwargs)
    from sglang_dflash.adapter.worker import DFlashWorker

    worker = getattr(manager, "draft_worker", None)
    if not isinstance(worker, DFlashWorker):
        return runners
    selector = kwargs.get("selector", args[0] if args else "all")
    roles = _ROLES[selector]  # the original has refused anything else
    others = [(role, r) for role, r in runners if not isinstance(r, DrafterWeightRunner)]
    return others + [("draft", DrafterWeightRunner(worker, draft="draft" in roles,
                                                   target="target" in roles))]
