"""Which runner a placed run takes: the fused one (a whole chunk of iterations in one
`jit`) or the staged one (stages on component meshes)."""

from __future__ import annotations

from rlinf_jax.config.schema import FlowConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.sharding import Placement


def fused(flow: FlowConfig, placement: Placement) -> bool:
    """True for the fused runner: it needs every component collocated, one micro-batch and
    no staleness (the fastest layout for small models); ``flow.runner`` may force either,
    and forcing fused where it cannot apply is bad input."""
    fusable = placement.mode == "collocated" and flow.num_micro_batches == 1 and flow.max_staleness == 0
    if flow.runner == "fused" and not fusable:
        raise BadInput(
            f"flow.runner=fused needs a collocated placement, flow.num_micro_batches=1 and flow.max_staleness=0 "
            f"(got {placement.mode}, {flow.num_micro_batches}, {flow.max_staleness}); use flow.runner=auto"
        )
    return flow.runner == "fused" or (flow.runner == "auto" and fusable)
