"""What a torch.distributed transport failure says: the step of the call first, then the cause
(a rank that never arrives is a timeout, after the comm's timeout; a peer that closed the
connection is not reported as a timeout), and the default timeout is the C++ one."""

import pytest

from detlogp import _comm, _detlogp


def test_default_timeout_is_the_cpp_constant():
    assert _comm.DEFAULT_COLLECTIVE_TIMEOUT == _detlogp.DEFAULT_COLLECTIVE_TIMEOUT == 120.0


@pytest.mark.parametrize("text, cause", [
    ("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2000ms for recv operation",
     "all_gather timed out after 2 s on rank 0 of 2: another rank did not arrive"),
    ("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:57571",
     "all_gather failed on rank 0 of 2: a peer closed the connection"),
    ("NCCL error: unhandled system error", "all_gather failed on rank 0 of 2: the transport "
                                          "reported an error"),
])
def test_failure_names_the_cause_first(text, cause):
    cb = _comm._Callbacks(None, 0, 2, "torch.distributed:gloo", 2.0)
    message = cb._failure("all_gather", RuntimeError(text))
    assert message.startswith("torch.distributed:gloo " + cause), message
    assert text in message  # the transport's own words stay, after the cause


def test_a_failure_while_starting_the_collective_is_worded_the_same():
    cb = _comm._Callbacks(None, 1, 2, "torch.distributed:gloo", 2.0)

    def start():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer")

    with pytest.raises(RuntimeError, match="^torch.distributed:gloo barrier failed on rank 1 of "
                                           "2: a peer closed the connection"):
        cb._reported("barrier", start)


def _rank0_error(tmp_path, peer, timeout, limit_s):
    """(seconds, error) of what rank 0's forward raised over a TorchDistributedComm with
    ``timeout`` when rank 1 left it alone (``peer``: "exits" or "sleeps", lone_rank_worker.py)."""
    pytest.importorskip("torch")
    import lone_rank_worker
    from spawn import run_workers

    run_workers(lone_rank_worker.main, tmp_path, 2, limit_s, peer, timeout, pass_world=False,
                results=False)
    message = (tmp_path / "rank0.txt").read_text()
    print(message)
    assert message.startswith("RuntimeError after "), message
    seconds, error = message[len("RuntimeError after "):].split(" s: ", 1)
    return float(seconds), error


def test_rank_that_never_calls_forward_times_out_its_peer(tmp_path):
    seconds, error = _rank0_error(tmp_path, "sleeps", 2, 90)
    assert ("cross-rank preflight all-gather of the forward: torch.distributed:gloo all_gather "
            "timed out after 2 s on rank 0 of 2") in error
    assert 1.5 <= seconds < 60


def test_a_peer_that_died_is_reported_as_such_with_the_step(tmp_path):
    _, error = _rank0_error(tmp_path, "exits", 300, 120)
    assert error.startswith(
        "cross-rank preflight all-gather of the forward: torch.distributed:gloo "
        "all_gather failed on rank 0 of 2: a peer closed the connection"), error
    assert "timed out" not in error
