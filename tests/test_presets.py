"""The named presets' schedules: the CPU preset's batch grows with the training rows."""

from __future__ import annotations

import math

import pytest

from geodbk.dataset.protocols import SPACE_TIME
from geodbk.fit.protocol import configs
from geodbk.models.config import CPU, PAPER, run_preset


@pytest.mark.parametrize(
    ("n_rows", "batch"),
    [(None, 1024), (500, 1024), (27_000, 1024), (51_199, 1024), (51_200, 2048), (113_000, 4096),
     (204_800, 8192), (10_000_000, 8192)],
)
def test_cpu_batch_doubles_while_an_epoch_keeps_25_steps(n_rows, batch):
    """PR's 113k training rows train at batch 4096 (27 steps an epoch), HI's 27k at 1024; the
    learning rate grows with the square root of the batch; the batch stops at 8192."""
    got, lr, _ = CPU.schedule(n_rows)
    assert got == batch
    assert lr == pytest.approx(CPU.lr * math.sqrt(batch / 1024))
    if n_rows is not None and batch > CPU.batch_size:
        assert n_rows / batch >= 25
    if n_rows is not None and batch < CPU.max_batch_size:
        assert n_rows / (2 * batch) < 25


@pytest.mark.parametrize(("n_rows", "epochs"), [(None, 20), (27_000, 20), (75_000, 20), (113_000, 14),
                                              (1_500_000, 1), (10_000_000, 1)])
def test_cpu_epochs_pass_at_most_1_5_million_rows_through_the_network(n_rows, epochs):
    """HI (27k training rows) trains 20 epochs, PR (113k) 14; at least one epoch."""
    assert CPU.schedule(n_rows)[2] == epochs
    if n_rows is not None and epochs > 1:
        assert (epochs - 1) * n_rows < CPU.row_passes


def test_explicit_settings_win_over_the_scaled_schedule():
    _, train = CPU.configs(113_000)
    assert (train.batch_size, train.lr, train.epochs) == (4096, pytest.approx(0.02), 14)
    _, train = CPU.configs(113_000, batch_size=512)
    assert (train.batch_size, train.lr) == (512, CPU.lr)  # an explicit batch keeps the preset's lr
    _, train = CPU.configs(113_000, lr=0.5, epochs=3)
    assert (train.batch_size, train.lr, train.epochs) == (4096, 0.5, 3)
    # the paper's schedule is fixed, and a fit passes its training rows through the protocol
    assert PAPER.schedule(10_000_000) == (PAPER.batch_size, PAPER.lr, PAPER.epochs)
    assert run_preset("paper").configs(10_000_000)[1].batch_size == 1024
    assert configs(SPACE_TIME, "cpu", 113_000)[1].batch_size == 4096


@pytest.mark.parametrize(("n_rows", "epochs"), [(800, 500), (2_074, 167), (5_500, 84), (12_000, 42), (27_000, 20)])
def test_cpu_epochs_grow_until_a_small_region_takes_500_steps(n_rows, epochs):
    """A city's 2k training rows make 3 steps of 1024 an epoch: 20 epochs would be 60 steps.
    The epochs grow to the fewest that take 500; HI's 27k rows (27 steps an epoch) keep 20."""
    batch, _, got = CPU.schedule(n_rows)
    assert got == epochs
    steps = math.ceil(n_rows / batch)
    assert got * steps >= CPU.min_steps and (got == CPU.epochs or (got - 1) * steps < CPU.min_steps)


def test_fit_help_gives_the_presets_numbers():
    """`geodbk fit --help` quotes the presets (it cannot import them: the CLI parser stays
    torch-free), so this ties its text to them; it once said 40 epochs after the preset went to 20."""
    from geodbk.cli import build_parser

    fit = build_parser()._subparsers._group_actions[0].choices["fit"]  # type: ignore[union-attr]
    text = " ".join(fit.format_help().split())
    assert f"h={CPU.hidden}, r={CPU.rank}, {CPU.epochs} epochs of batch {CPU.batch_size}" in text
    assert f"under {CPU.min_steps} steps" in text
    assert f"the paper's h={PAPER.hidden}, r={PAPER.rank}, {PAPER.epochs} epochs" in text
    helps = {action.dest: action.help for action in fit._actions}
    assert helps["epochs"].startswith(f"maximum training epochs (default {CPU.epochs},")
    assert f"(default {CPU.hidden}; {PAPER.hidden} with --paper-size)" in helps["hidden"]
    assert f"(default {CPU.rank}; {PAPER.rank} with --paper-size)" in helps["rank"]
