"""TP ranks as threads of this process: each rank a detlogp ``CallbackComm`` whose all-gather
meets the other ranks' at a barrier. The ranks run the real distributed code path (preflight,
all-gather of node partials, merge) without spawning processes, so a property test can try
many TP degrees and shard tables in seconds."""

import threading

import detlogp

TIMEOUT_S = 60.0


class ThreadWorld:
    def __init__(self, size):
        self.size = size
        self._barrier = threading.Barrier(size, timeout=TIMEOUT_S)
        self._slots = [b""] * size

    def comm(self, rank):
        def all_gather(send):
            self._slots[rank] = bytes(send)
            self._barrier.wait()  # every rank's bytes are in
            out = b"".join(self._slots)
            self._barrier.wait()  # every rank has read them before any writes again
            return out

        return detlogp._detlogp.CallbackComm(rank, self.size, "threads", all_gather,
                                             self._barrier.wait)

    def run(self, fn):
        """[fn(rank, comm) for every rank], each on its own thread; the first exception raised
        on any rank (the cause; its peers' failures follow from it) is raised here once every
        thread has finished."""
        results, errors, lock = [None] * self.size, [], threading.Lock()

        def body(rank):
            try:
                results[rank] = fn(rank, self.comm(rank))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                with lock:
                    errors.append(e)
                self._barrier.abort()  # peers waiting in a collective fail instead of hanging

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S * 2)
        assert not any(t.is_alive() for t in threads), "a thread rank hung"
        if errors:
            raise errors[0]
        return results
