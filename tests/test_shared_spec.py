"""A shared table's spec: what a segment cannot hold is refused with a named error (issue 37 item 4)."""

import os

import numpy as np
import pytest

import replaystore as rs
from replaystore.shared import SharedTable


@pytest.mark.parametrize(
    "spec",
    [
        {"a": ((), object)},
        {"obs": ((2,), np.float32), "info": ((), np.dtype("O"))},
        {"rec": ((), np.dtype([("x", np.int32), ("y", object)]))},
    ],
)
def test_an_object_dtype_is_invalid_argument_and_leaves_nothing(tmp_path, spec):
    with pytest.raises(rs.InvalidArgument, match="object"):
        SharedTable.create("objspec", 8, spec, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []
