"""detlogp keeps no process group alive: after destroy_process_group the group (its sockets and
worker threads) is freed at once, not at interpreter exit, where gloo's threads can be stopped
while they release a tensor and abort the process. A communicator kept past the group's end
says so instead of touching a dead group."""

import pytest

torch = pytest.importorskip("torch")

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import group_lifetime_worker
    from spawn import run_workers

    out, codes = run_workers(group_lifetime_worker.main, tmp_path_factory.mktemp("lifetime"), 2,
                             TIMEOUT_S)
    assert codes == [0, 0], codes
    return out


def test_destroy_frees_the_group(ranks):
    for rank, res in enumerate(ranks):
        assert res["alive_after_destroy"] is False, rank


def test_a_kept_communicator_names_the_destroyed_group(ranks):
    for rank, res in enumerate(ranks):
        assert "the process group was destroyed" in res["later_call"], (rank, res["later_call"])
