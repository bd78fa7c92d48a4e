"""How many epochs the workers train between two agreements on a SIGTERM: a pure function of
the all-reduced pace, so every worker picks the same epoch."""

from __future__ import annotations

import pytest

from worker.callbacks import AGREEMENT_PERIOD, epochs_until_next_agreement


@pytest.mark.parametrize(
    ("seconds_summed", "replicas", "epochs", "expected"),
    [
        (2 * 0.4, 2, 1, int(AGREEMENT_PERIOD // 0.4)),  # short epochs: several per agreement
        (2 * 0.4 * 5, 2, 5, int(AGREEMENT_PERIOD // 0.4)),  # the pace over 5 epochs, not the sum
        (4 * 30.0, 4, 1, 1),  # epochs longer than the period: every boundary
        (2 * AGREEMENT_PERIOD, 2, 1, 1),  # exactly the period
        (1e-9, 1, 1, 1000),  # instant epochs: bounded
        (0.0, 2, 1, 1),  # nothing measured: every boundary
        (float("nan"), 2, 1, 1),
        (1.0, 0, 1, 1),
        (1.0, 2, 0, 1),
    ],
)
def test_the_next_agreement_follows_the_pace(
    seconds_summed: float, replicas: int, epochs: int, expected: int
) -> None:
    assert epochs_until_next_agreement(seconds_summed, replicas, epochs) == expected
