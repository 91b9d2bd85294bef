"""Triton's classification extension on the outputs the engine hands back."""

from __future__ import annotations

import numpy as np
import pytest

from edged.engine.classification import classify
from edged.errors import InvalidInput


def test_a_bytes_output_is_refused_naming_its_kserve_datatype_not_numpys() -> None:
    words = np.array([b"cat", b"dog"], dtype=object)
    with pytest.raises(InvalidInput) as caught:
        classify(words, 1, None, False, "m", "OUT")
    assert str(caught.value) == ("model m: output 'OUT' is BYTES: classification needs a numeric or BOOL output; "
                                 "ask for it without \"classification\"")


def test_the_best_classes_come_first_with_their_labels() -> None:
    top = classify(np.array([[0.1, 0.7, 0.2]], dtype=np.float32), 2, ["a", "b", "c"], True, "m", "OUT")
    assert [t.decode() for t in top[0]] == ["0.700000:1:b", "0.200000:2:c"]
