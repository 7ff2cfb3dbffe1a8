"""``forward_step``: Megatron-Bridge's GPT forward step, with the overlapped path made whole.

Contract
--------
Same signature and loss function as MB 0.6.2's ``megatron.bridge.training.gpt_step.forward_step``
(``(state, data_iterator, model, return_schedule_plan=False)``). The normal path is MB's own,
untouched. The overlapped path (``return_schedule_plan=True``, what MCore's combined-1F1B schedule
calls) assembles the model inputs with MB's own ``_forward_step_common`` - batch, context-parallel
split, MTP inputs, FLOPs accounting, packed-sequence parameters - exactly as the normal path does,
then builds the schedule plan from *all* of them. MB 0.6.2 passes only tokens, positions, mask,
labels and loss mask there: with packed (THD) data its overlapped step silently attends across
sequence boundaries (rule ``packed-sequences-forward-step``). Recognised by the rules through
``PASSES_PACKED_SEQ_PARAMS``. Pinned to MB 0.6.2's private helpers; the ``tested-versions`` rule
warns on any other pair. Importing this module imports Megatron-Bridge.
"""

from __future__ import annotations

from ..target import shims

shims.install()

from megatron.bridge.training import gpt_step as _mb  # noqa: E402
from megatron.core.utils import get_model_config  # noqa: E402

from .facts import PASSES_PACKED_SEQ_PARAMS  # noqa: E402


class _CaptureForwardArgs:
    """Stands in for the model inside MB's ``_forward_step_common``: attribute reads go to the real
    model (config, process groups, VPP stage); the call records the inputs instead of running."""

    def __init__(self, model) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "forward_args", None)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_model"), name)

    def __call__(self, **forward_args):
        object.__setattr__(self, "forward_args", forward_args)


def forward_step(state, data_iterator, model, return_schedule_plan: bool = False):
    if not return_schedule_plan:
        return _mb.forward_step(state, data_iterator, model, return_schedule_plan=False)
    if not get_model_config(model).overlap_moe_expert_parallel_comm:
        raise RuntimeError("return_schedule_plan=True needs overlap_moe_expert_parallel_comm (MCore calls it so)")
    capture = _CaptureForwardArgs(model)
    _, loss_mask = _mb._forward_step_common(state, data_iterator, capture, return_schedule_plan=False)
    inputs = capture.forward_args
    plan = model.build_schedule_plan(
        inputs["input_ids"], inputs["position_ids"], inputs["attention_mask"],
        labels=inputs["labels"], loss_mask=loss_mask,  # loss_mask: as MB's own overlapped path (MTP)
        # packed_seq_params: what MB 0.6.2's own overlapped path drops. padding_mask: MB 0.6.2 passes
        # none to the model; forwarded only so that a step which does pass one keeps it on this path.
        packed_seq_params=inputs.get("packed_seq_params"), padding_mask=inputs.get("padding_mask"),
    )
    rerun = state.cfg.rerun_state_machine
    return plan, _mb._create_loss_function(loss_mask, check_for_nan_in_loss=rerun.check_for_nan_in_loss,
                                           check_for_spiky_loss=rerun.check_for_spiky_loss)


setattr(forward_step, PASSES_PACKED_SEQ_PARAMS, True)
