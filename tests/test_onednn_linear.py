"""oneDNN linear layers (specrepro.models.use_onednn_linear): same outputs as nn.Linear, training unaffected."""

import copy

import pytest
import torch

from specrepro.models import OneDNNLinear, use_onednn_linear

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_linear_pointwise"), reason="torch without oneDNN ops")


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8, bias=False))


@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 5, 16), (3, 16)])
def test_outputs_equal_nn_linear(shape):
    ref, net = _net(), _net()
    assert use_onednn_linear(net) == 2 and all(type(m) is OneDNNLinear for m in (net[0], net[2]))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-6)


def test_training_uses_autograd_and_repacks_after_updates():
    ref, net = _net(), _net()
    use_onednn_linear(net)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    for m in (ref, net):
        with torch.no_grad():
            m(x)  # packs the weights of net before the update
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m(x).pow(2).sum().backward()
        opt.step()
    torch.testing.assert_close(net[0].weight.grad, ref[0].weight.grad)
    with torch.no_grad():  # the stale packed copy must not be used after the optimizer step
        torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-6)


def test_deepcopy_and_dtype_change_fall_back_cleanly():
    ref, net = _net(), _net()
    use_onednn_linear(net)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        net(x)
        torch.testing.assert_close(copy.deepcopy(net)(x), ref(x), rtol=1e-5, atol=1e-6)
        half = copy.deepcopy(net).to(torch.bfloat16)
        torch.testing.assert_close(half(x.bfloat16()), ref.to(torch.bfloat16)(x.bfloat16()))


@pytest.mark.skipif(torch.bfloat16 not in __import__("specrepro.models").models.onednn_packed_dtypes(),
                    reason="oneDNN does not run bfloat16 on this CPU")
def test_bfloat16_layers_are_packed_and_give_the_same_bits():
    """In bfloat16, F.linear is oneDNN's kernel too; the packed layer must give its output bit for bit."""
    ref, net = _net().to(torch.bfloat16), _net().to(torch.bfloat16)
    assert use_onednn_linear(net) == 2
    for shape in [(1, 1, 16), (1, 7, 16), (3, 16)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(4)).bfloat16()
        with torch.inference_mode():
            assert torch.equal(net(x), ref(x))
    with torch.no_grad():  # a dtype change re-packs rather than reading the bfloat16 packing
        torch.testing.assert_close(net.float()(x.float()), ref.float()(x.float()), rtol=1e-5, atol=1e-6)
