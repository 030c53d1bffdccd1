"""The capability types of the model layer and the posterior algebra on PosteriorFactors."""

import pytest
import torch

from geodbk.models import GPOutput, KernelModel, PosteriorFactors, ZooModel


def test_a_zoo_model_without_forward_raises_not_implemented():
    class Empty(ZooModel):
        pass

    with pytest.raises(NotImplementedError, match="Empty"):
        Empty()(torch.zeros(3, 2))
    assert list(Empty().backbone_parameters()) == []


def test_a_kernel_model_must_give_its_kernel_and_posterior():
    class Constant(KernelModel):
        def forward(self, x, tests=None):
            return GPOutput(torch.zeros(len(x)), torch.ones(len(x)), torch.ones(()))

    model = Constant()
    assert isinstance(model, ZooModel) and model(torch.zeros(2, 1)).mean.shape == (2,)
    with pytest.raises(NotImplementedError, match="kernel"):
        model.kernel(torch.zeros(2, 1))
    with pytest.raises(NotImplementedError, match="posterior_factors"):
        model.posterior_factors(torch.zeros(2, 1))


def random_factors(n: int, generator: torch.Generator) -> PosteriorFactors:
    """Factors with every part present, float64: a low-rank part, a smaller subtracted one, an
    RBF part on scaled inputs and an independent diagonal."""

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return PosteriorFactors(
        plus=normal(n, 5),
        minus=0.2 * normal(n, 3),
        rbf_inputs=normal(n, 2),
        rbf_outputscale=torch.tensor(0.7, dtype=torch.float64),
        diagonal=normal(n).abs(),
    )


def dense_covariance(f: PosteriorFactors) -> torch.Tensor:
    """The (n, n) covariance the factors stand for, written out."""
    z = f.rbf_inputs
    return (
        f.plus @ f.plus.T
        - f.minus @ f.minus.T
        + f.rbf_outputscale * torch.exp(-0.5 * torch.cdist(z, z) ** 2)
        + torch.diag(f.diagonal)
    )


def part(f: PosteriorFactors, rows) -> PosteriorFactors:
    return PosteriorFactors(f.plus[rows], f.minus[rows], f.rbf_inputs[rows], f.rbf_outputscale, f.diagonal[rows])


def test_the_difference_variance_is_the_dense_quadratic_form():
    f = random_factors(12, torch.Generator().manual_seed(0))
    cov = dense_covariance(f)
    start, end = slice(0, 6), slice(6, 12)
    expected = torch.diagonal(cov[end, end]) + torch.diagonal(cov[start, start]) - 2 * torch.diagonal(cov[end, start])
    assert (expected > 0).all()
    torch.testing.assert_close(part(f, end).difference_variance(part(f, start)), expected, rtol=1e-12, atol=1e-12)


def test_the_grouped_variance_is_the_dense_quadratic_form_over_unsorted_batches():
    generator = torch.Generator().manual_seed(1)
    f = random_factors(17, generator)
    cov = dense_covariance(f)
    weights = torch.rand(17, generator=generator, dtype=torch.float64)
    groups = torch.tensor([2, 0, 1, 2, 2, 0, 1, 1, 0, 2, 0, 0, 1, 2, 1, 0, 2])
    expected = torch.stack(
        [weights[groups == g] @ cov[groups == g][:, groups == g] @ weights[groups == g] for g in range(4)]
    )
    batches = [(part(f, rows), weights[rows], groups[rows]) for rows in (slice(0, 5), slice(5, 11), slice(11, 17))]
    got = PosteriorFactors.grouped_variance(batches, 4, block=3)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got[3] == 0.0  # an empty group
    assert PosteriorFactors.grouped_variance([], 2).tolist() == [0.0, 0.0]


def test_factors_in_double():
    f = PosteriorFactors(torch.ones(2, 3), diagonal=torch.ones(2))
    g = f.double()
    assert g.plus.dtype == g.diagonal.dtype == torch.float64 and g.minus is None
