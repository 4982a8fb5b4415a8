"""pytest 9.2.0 with pytest-xdist 3.8.0: the node id suffix that sends a test to one worker
under ``--dist loadgroup`` (the index is in :mod:`rl_app.upstream`). Only the test suite
imports this module, and it imports nothing private of pytest until a test is sent to a
group: a suite run without xdist starts on any pytest."""

from __future__ import annotations

import pytest


def send_to_group(item: pytest.Item, group: str) -> None:
    """Give ``item`` the node id suffix ``@group``, by which xdist's loadgroup scheduling
    sends every test of ``group`` to the same worker.

    pytest-xdist 3.8.0's ``xdist_group`` marker no longer gets a test that suffix under
    pytest 9: it writes ``item._nodeid``, which pytest 9 does not read (a node keeps its id
    in the private ``_id``). Test:
    ``test_xdist_groups_still_write_a_node_id_pytest_does_not_read``. An older pytest,
    which has no ``_pytest.nodeid``, still reads what the marker writes."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:
        item.add_marker(pytest.mark.xdist_group(group))
        return
    item._id = coerce_node_id(f"{item.nodeid}@{group}")
