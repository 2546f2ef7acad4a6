"""The hot path's array parameters as literal text (pgworker.store.arrays): what the
server reads back is exactly what was meant, for every string a result or key can hold."""

from __future__ import annotations

import pytest

from pgworker.store.arrays import bigint_array, boolean_array, text_array

pytestmark = pytest.mark.integration

TRICKY = ["", "NULL", "null", 'a "quoted" word', "back\\slash", "\\", '\\"', "{braces}", "a,b", "  spaced  ",
          "new\nline\ttab", "ünïcødé ✓", '{"json": [1, "two", null]}', "}", "{", '"', "x" * 10_000, None]


def test_text_array_reads_back_as_given(conn):
    [(back,)] = conn.execute("SELECT %s::text[]", [text_array(TRICKY)]).fetchall()
    assert back == TRICKY
    [(empty,)] = conn.execute("SELECT %s::text[]", [text_array([])]).fetchall()
    assert empty == []


def test_bigint_and_boolean_arrays_read_back_and_refuse_injected_elements(conn):
    ids = [1, 2**62, 0, 42]
    [(back, flags)] = conn.execute("SELECT %s::bigint[], %s::boolean[]",
                                   [bigint_array(ids), boolean_array([1, 0, "x", None])]).fetchall()
    assert back == ids and flags == [True, False, True, False]
    with pytest.raises(ValueError):
        bigint_array(["1,2"])  # a caller's Lease holding text cannot add elements
