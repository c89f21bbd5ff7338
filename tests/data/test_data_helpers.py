"""The comparison helpers must be able to fail."""

import numpy as np
import pytest
from fixtures.data import assert_each_once, assert_same_batches, decode_rows, encoded_rows


def test_decode_rejects_rows_that_were_not_written_for_their_entry():
    x = encoded_rows(np.arange(5))
    assert list(decode_rows(x)) == [0, 1, 2, 3, 4]
    x[2, 7] += 0.5
    with pytest.raises(AssertionError, match="rows do not hold"):
        decode_rows(x)


def test_each_once_fails_on_a_repeat_or_a_loss():
    assert_each_once([3, 1, 2], [1, 2, 3])
    with pytest.raises(AssertionError):
        assert_each_once([1, 1, 2], [1, 2, 3])
    with pytest.raises(AssertionError):
        assert_each_once([1, 2], [1, 2, 3])


def test_same_batches_fails_on_different_order_or_count():
    x = encoded_rows(np.arange(8)).reshape(8, 1, -1)
    y = np.arange(8)
    a = [(x[:4], y[:4]), (x[4:], y[4:])]
    assert_same_batches(a, list(a))
    with pytest.raises(AssertionError, match="differs"):
        assert_same_batches(a, [a[1], a[0]])
    with pytest.raises(ValueError):  # zip(strict=True): one more batch on one side
        assert_same_batches(a, a + a[:1])
