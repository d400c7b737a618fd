"""The capacity-mode MoE layer never makes the host wait for the device; dropless mode does, once,
for its split sizes (documented in moe_core/model/layer.py).

On a GPU a host sync is an operator whose result the host must read: a scalar read back (``.item()``,
``.tolist()``, ``int(t)``, ``.cpu()`` of a device tensor) or an output whose size depends on the
data (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``). A dispatch mode records
every such operator the layer runs on CPU, where the same operators are called.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moe_core.model.layer import MoELayer

aten = torch.ops.aten
SYNCING = {
    aten._local_scalar_dense.default,  # .item(), .tolist(), int(t), bool(t)
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,  # without output_size
}


class HostSyncs(TorchDispatchMode):
    """Records the operators that would make the host wait for a GPU."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        if func in SYNCING or boolean_index:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


def _layer(dropless: bool, second_expert_policy: str, gate_host_sync: bool = False) -> MoELayer:
    torch.manual_seed(0)
    return MoELayer(
        d_model=16,
        d_ff=32,
        num_experts=4,
        top_k=2,
        capacity_factor=1.0,
        min_capacity=1,
        group_size=8,
        second_expert_policy=second_expert_policy,
        dropless=dropless,
        aux_loss_scale="e2",
        layer_id=0,
        seed=0,
        gate_host_sync=gate_host_sync,
    )


def _syncs_of_a_step(layer: MoELayer) -> list[str]:
    x = torch.randn(2, 16, 16, requires_grad=True)
    with HostSyncs() as syncs:
        y, aux = layer(x)
        (y.square().mean() + aux).backward()
    return syncs.found


@pytest.mark.parametrize("second_expert_policy", ["always", "random"])
def test_capacity_forward_and_backward_never_sync(second_expert_policy):
    layer = _layer(dropless=False, second_expert_policy=second_expert_policy)
    layer.train()
    assert _syncs_of_a_step(layer) == []
    assert layer.last_gating.dropped_fraction > 0  # the capacity drops tokens: the spare-row path ran


def test_the_detector_sees_the_dropless_split_sizes():
    assert _syncs_of_a_step(_layer(dropless=True, second_expert_policy="always"))  # .tolist() of the counts


def test_a_gate_that_reads_its_counts_on_the_host_computes_the_same():
    """moe.gate_host_sync: DeepSpeed-MoE's gate copied its expert counts to the host every forward
    (``.tolist()``, a sync on a GPU that this CPU detector cannot see); the math is unchanged."""
    plain, synced = _layer(False, "always"), _layer(False, "always", gate_host_sync=True)
    x = torch.randn(2, 16, 16)
    assert torch.equal(plain(x)[0], synced(x)[0])
    assert plain.host_expert_counts is None
    assert synced.host_expert_counts == synced.last_gating.tokens_per_expert.tolist()
    assert all(isinstance(c, int) for c in synced.host_expert_counts)
