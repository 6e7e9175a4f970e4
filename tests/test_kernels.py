import gpytorch
import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import rbf
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel, KernelAdapter, as_kernel


def _gpytorch_kernels():
    return [
        gpytorch.kernels.RBFKernel(),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5)),
        gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=0.5)),
    ]


@pytest.mark.parametrize("kernel", _gpytorch_kernels(), ids=["rbf", "scale-matern52", "scale-matern12"])
def test_gpytorch_adapter_dense_and_diag(kernel, dtype, device):
    X = torch.rand(3, 7, 2, dtype=dtype, device=device)
    k = as_kernel(kernel).to(device)
    K = k(X, X)
    assert K.shape == (3, 7, 7) and isinstance(K, torch.Tensor)
    assert torch.allclose(k.diag(X), torch.diagonal(K, dim1=-2, dim2=-1), atol=1e-5)


def test_gaussian_kernel_formula(dtype, device):
    X, Y = torch.rand(6, 3, dtype=dtype, device=device), torch.rand(4, 3, dtype=dtype, device=device)
    k = GaussianKernel(lengthscale=0.7, outputscale=2.0).to(device)
    ref = 2.0 * rbf(X.double().cpu(), Y.double().cpu(), 0.7)
    assert torch.allclose(k(X, Y).double().cpu(), ref, atol=1e-6)
    assert torch.allclose(k.diag(X).double().cpu(), torch.full((6,), 2.0, dtype=torch.float64))
    assert GaussianKernel.from_width(5.0).lengthscale.item() == pytest.approx(5.0**0.5)


def test_gaussian_kernel_of_one_input_is_its_gram_matrix():
    """``k(X)`` is ``k(X, X)``, as GPyTorch's kernels read one argument (``model(X)`` calls ``covar_module(X)``)."""
    X = torch.rand(7, 3, dtype=torch.float64)
    k = GaussianKernel(0.3, outputscale=2.0)
    assert torch.equal(k(X), k(X, X))


def test_callable_diag_without_n_by_n():
    calls = []

    def poly(A, B):
        calls.append((A.shape, B.shape))
        return (A @ B.transpose(-1, -2) + 1.0) ** 2

    X = torch.rand(50, 3, dtype=torch.float64)
    k = as_kernel(poly)
    d = k.diag(X)
    assert torch.allclose(d, (1.0 + (X * X).sum(-1)) ** 2)
    assert all(a[-2] == 1 and b[-2] == 1 for a, b in calls)  # never (n, n)


def test_a_kernel_output_is_dense_and_a_strided_one_is_returned_as_it_is():
    """A callable's sparse block and a GPyTorch kernel's lazy one come back dense; a strided tensor is not copied."""
    X = torch.rand(6, 2, dtype=torch.float64)
    dense = GaussianKernel(0.4)(X, X)
    assert as_kernel(lambda A, B: dense).forward(X, X) is dense
    sparse = as_kernel(lambda A, B: dense.to_sparse())(X, X)
    assert sparse.layout == torch.strided and torch.equal(sparse, dense)
    linear = gpytorch.kernels.LinearKernel().double()  # a lazy (low-rank) block in GPyTorch
    out = as_kernel(linear)(X, X)
    assert isinstance(out, torch.Tensor) and torch.equal(out, linear(X, X).to_dense())


def test_callable_with_explicit_diag_and_batch():
    k = as_kernel(lambda A, B: A @ B.transpose(-1, -2), diag=lambda X: (X * X).sum(-1))
    X = torch.rand(2, 5, 3)
    assert k(X, X).shape == (2, 5, 5)
    assert torch.allclose(k.diag(X), torch.diagonal(k(X, X), dim1=-2, dim2=-1))
    assert as_kernel(k) is k and isinstance(k, KernelAdapter)


def test_not_a_kernel():
    with pytest.raises(InputDataError, match="expected a gpytorch Kernel or a callable"):
        as_kernel(3.0)


@settings(max_examples=20, deadline=None)
@given(st.one_of(st.just(0.0), st.just(-1.0), st.just(float("nan")), st.just(float("inf"))))
def test_gaussian_kernel_bad_hyperparameters(v):
    with pytest.raises(InputDataError, match="expected a finite number > 0"):
        GaussianKernel(lengthscale=v)


@pytest.mark.parametrize("ard", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_fast_rbf_path_matches_gpytorch(ard, scaled):
    """(Scale)RBFKernel is evaluated by one GEMM + exp; values and gradients equal GPyTorch's own path."""
    torch.manual_seed(0)
    base = gpytorch.kernels.RBFKernel(ard_num_dims=3 if ard else None).double()
    base.lengthscale = torch.tensor([[0.7, 1.3, 2.0]] if ard else [[0.9]], dtype=torch.float64)
    k = gpytorch.kernels.ScaleKernel(base).double() if scaled else base
    if scaled:
        k.outputscale = torch.tensor(1.7, dtype=torch.float64)
    adapter = as_kernel(k)
    assert adapter.extra_repr() == "fast stationary path"
    X1 = (1e3 + torch.randn(2, 7, 3, dtype=torch.float64)).requires_grad_()  # far from the origin
    X2 = 1e3 + torch.randn(2, 4, 3, dtype=torch.float64)
    fast = adapter(X1, X2)
    ref = k(X1, X2).to_dense()
    assert torch.allclose(fast, ref, atol=1e-10)
    g_fast = torch.autograd.grad(fast.sum(), [X1, base.raw_lengthscale])
    g_ref = torch.autograd.grad(k(X1, X2).to_dense().sum(), [X1, base.raw_lengthscale])
    for a, b in zip(g_fast, g_ref):
        assert torch.allclose(a, b, atol=1e-9)


def test_other_gpytorch_kernels_take_the_generic_path():
    assert as_kernel(gpytorch.kernels.PeriodicKernel()).extra_repr() == ""
    assert as_kernel(gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2]))).extra_repr() == ""
    assert as_kernel(gpytorch.kernels.RBFKernel(active_dims=[0])).extra_repr() == ""
    batched_matern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(batch_shape=torch.Size([2])))
    assert as_kernel(batched_matern).extra_repr() == ""


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
@pytest.mark.parametrize("grad", [False, True])
def test_fast_matern_path_matches_gpytorch(nu, grad):
    """(Scale)MaternKernel is evaluated by one GEMM; values (both paths) and gradients equal GPyTorch's own."""
    torch.manual_seed(0)
    base = gpytorch.kernels.MaternKernel(nu=nu, ard_num_dims=3).double()
    base.lengthscale = torch.tensor([[0.7, 1.3, 2.0]], dtype=torch.float64)
    k = gpytorch.kernels.ScaleKernel(base).double()
    k.outputscale = torch.tensor(1.7, dtype=torch.float64)
    adapter = as_kernel(k)
    assert adapter.extra_repr() == "fast stationary path"
    X1 = (1e3 + torch.randn(2, 7, 3, dtype=torch.float64)).requires_grad_(grad)
    X2 = 1e3 + torch.randn(2, 4, 3, dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        fast = adapter(X1, X2)
        ref = k(X1, X2).to_dense()
    assert torch.allclose(fast, ref, atol=1e-10)
    if grad:
        g_fast = torch.autograd.grad(fast.sum(), [X1, base.raw_lengthscale, k.raw_outputscale])
        g_ref = torch.autograd.grad(k(X1, X2).to_dense().sum(), [X1, base.raw_lengthscale, k.raw_outputscale])
        for a, b in zip(g_fast, g_ref):
            assert torch.allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_gaussian_cross_fused_no_grad_path_equals_the_formula(dtype, shape):
    """The in-place (no autograd) path, with the outputscale folded into the exponent, equals the formula."""
    from torchbkb.gp.kernels import gaussian_cross

    g = torch.Generator().manual_seed(1)
    A = 5.0 + torch.randn(*shape, 50, 4, generator=g, dtype=torch.float64)
    B = 5.0 + torch.randn(*shape, 7, 4, generator=g, dtype=torch.float64)
    s = torch.tensor(2.5, dtype=torch.float64)
    ref = s * torch.exp(-0.5 * ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1))
    with torch.no_grad():
        fast = gaussian_cross(A.to(dtype), B.to(dtype), s.to(dtype))
        plain = gaussian_cross(A.to(dtype), B.to(dtype))
    assert fast.dtype == dtype and fast.shape == ref.shape
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(fast.double(), ref, atol=tol) and torch.allclose(plain.double(), ref / s, atol=tol)
    assert float(fast.max()) <= 2.5 * (1 + 1e-6)  # the cap: k(x, x') <= s
    Ag = A.clone().requires_grad_()
    assert torch.allclose(gaussian_cross(Ag, B, s), ref, atol=1e-12)


def test_gaussian_kernel_left_on_the_cpu_follows_its_inputs(dtype, device):
    """Its scalar hyperparameters are 0-dim buffers: a kernel never moved with .to() still evaluates (and
    returns its diagonal) on the inputs' device, like a plain function of them."""
    X = torch.rand(5, 2, dtype=dtype, device=device)
    k = GaussianKernel(lengthscale=0.5, outputscale=1.5)  # buffers stay on the CPU
    with torch.no_grad():
        K = k(X, X[:3])
    assert K.device == X.device and K.dtype == dtype and k.diag(X).device == X.device
    assert torch.allclose(k.diag(X).double().cpu(), torch.full((5,), 1.5, dtype=torch.float64))
    assert torch.allclose(K.double().cpu(), 1.5 * rbf(X.double().cpu(), X[:3].double().cpu(), 0.5), atol=1e-5)


def test_gaussian_kernel_is_accurate_for_float32_inputs_far_from_the_origin():
    g = torch.Generator().manual_seed(0)
    X = (torch.rand(50, 3, generator=g) * 3 + 1e6).float()
    Y = (torch.rand(20, 3, generator=g) * 3 + 1e6).float()
    k = GaussianKernel(0.7)
    assert (k(X, Y).double() - k(X.double(), Y.double())).abs().max() < 1e-5  # centred before scaling


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_block_of_a_set_with_itself_has_the_exact_diagonal(nu, device):
    """k(X, X)'s diagonal is the outputscale exactly in float32: the distance expansion's rounding, amplified by the
    square root (a Matérn-½ kernel loses ~1e-4 at r ≈ √1e-7), never reaches it."""
    X = (torch.rand(3, 40, 5, device=device) * 50.0 + 1e3).float()
    k = as_kernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=nu))).to(device)
    K = k(X, X)
    ref = k.diag(X)
    assert torch.equal(torch.diagonal(K, dim1=-2, dim2=-1), ref)
    Xg = X.clone().requires_grad_()
    Kg = k(Xg, Xg)
    Kg.sum().backward()
    assert torch.equal(torch.diagonal(Kg, dim1=-2, dim2=-1).detach(), ref) and torch.isfinite(Xg.grad).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("nu", [None, 0.5, 1.5, 2.5])
@pytest.mark.parametrize("scaled", [False, True])
def test_stationary_diag_is_gpytorchs_exactly(dtype, nu, scaled):
    base = gpytorch.kernels.RBFKernel(ard_num_dims=3) if nu is None else gpytorch.kernels.MaternKernel(nu=nu)
    k = (gpytorch.kernels.ScaleKernel(base) if scaled else base).to(dtype)
    if scaled:
        k.outputscale = 1.7
    X = 3 * torch.randn(2, 50, 3, dtype=dtype)
    want = k(X, X, diag=True)
    got = as_kernel(k).diag(X)
    assert got.shape == (2, 50) and got.dtype == dtype and torch.equal(got, want.to_dense() if hasattr(want, "to_dense")
                                                                     else want)
    got.add_(1.0)  # a tensor of its own, not a view of the outputscale
    assert torch.equal(as_kernel(k).diag(X[0]), want[0])
    if scaled:  # differentiable in the outputscale, as GPyTorch's
        as_kernel(k).diag(X).sum().backward()
        assert k.raw_outputscale.grad is not None and bool(k.raw_outputscale.grad != 0)


def test_frozen_adapter_reads_hyperparameters_once_per_device_and_dtype(monkeypatch):
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double().requires_grad_(False)
    X = torch.rand(20, 2, dtype=torch.float64)
    live, frozen = KernelAdapter(k), KernelAdapter(k, frozen=True)
    before = frozen(X, X)
    assert torch.equal(before, live(X, X))
    reads = []
    cls = type(k.base_kernel)
    monkeypatch.setattr(cls, "lengthscale", property(lambda self: reads.append(1) or self.raw_lengthscale_constraint
                                                     .transform(self.raw_lengthscale)))
    for _ in range(3):
        frozen(X, X), frozen.diag(X)
    assert reads == []  # the snapshot
    live(X, X)
    assert reads == [1]  # a live adapter reads the kernel at every call
    out = frozen.float()(X.float(), X.float())  # moved or cast: read again
    assert out.dtype == torch.float32 and reads == [1, 1]
    monkeypatch.undo()
    k.base_kernel.lengthscale = 2.0  # a live adapter follows the kernel
    assert not torch.allclose(live(X, X), before)


def test_frozen_adapter_keeps_no_snapshot_of_a_differentiable_kernel():
    k = gpytorch.kernels.RBFKernel().double()
    frozen = KernelAdapter(k, frozen=True)
    X = torch.rand(10, 2, dtype=torch.float64)
    frozen(X, X).sum().backward()
    first = k.raw_lengthscale.grad.clone()
    k.raw_lengthscale.grad = None
    frozen(X, X).sum().backward()  # a second graph through the parameter, not through a cached tensor
    assert torch.equal(k.raw_lengthscale.grad, first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("make", [
    lambda: GaussianKernel(0.7, 2.0),
    lambda: as_kernel(GaussianKernel(0.7)),
    lambda: as_kernel(gpytorch.kernels.RBFKernel()),
    lambda: as_kernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=3))),
    lambda: as_kernel(gpytorch.kernels.MaternKernel(nu=0.5)),
    lambda: as_kernel(lambda A, B: A @ B.transpose(-1, -2)),
])
def test_against_a_fixed_set_gives_the_kernels_values_bitwise(make, dtype):
    """The arms' side computed once changes no value: rows for one arm and for a block, inputs far from 0."""
    k = make().to(dtype)
    X = torch.rand(300, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).mul(5).add(100).to(dtype)
    rows = k.against(X)
    with torch.no_grad():
        for idx in ([3], [5, 7, 299]):
            want = k(X[idx], X)
            assert torch.equal(rows(X[idx]), want.to_dense() if hasattr(want, "to_dense") else want)


def test_against_keeps_the_gradient_when_autograd_asks_for_it():
    base = gpytorch.kernels.RBFKernel().double()
    X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    rows = as_kernel(base).against(X)
    rows(X[:4]).sum().backward()
    assert base.raw_lengthscale.grad is not None and bool(base.raw_lengthscale.grad.abs().sum() > 0)


def test_against_calls_a_subclass_with_its_own_forward():
    class Halved(GaussianKernel):
        def forward(self, X1, X2):
            return 0.5 * super().forward(X1, X2)

    X = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    k = Halved(0.5).double()
    with torch.no_grad():
        assert torch.equal(k.against(X)(X[:2]), k(X[:2], X))
