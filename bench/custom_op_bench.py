"""Per-call time of detlogp.torch.vocab_parallel_logprobs in eager mode, for comparing two builds
(docs/benchmarks.md, "The custom ops"): run it once per build, alternating, with PYTHONPATH set
to that build's python directory. Prints one line: the import time of detlogp.torch and the
median time of small calls (where the per-call overhead shows) and of one large call."""

import argparse
import time

import torch


def _median_us(fn, reps):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("label")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    import detlogp.torch as dt

    imported = time.perf_counter() - t0

    def case(tokens, vocab, grad, reps):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, vocab, generator=g).requires_grad_(grad)
        ids = torch.randint(0, vocab, (tokens,), generator=g)

        def one():
            logp = dt.vocab_parallel_logprobs(x, ids)
            if grad:
                logp.sum().backward()
                x.grad = None

        return _median_us(one, reps)

    print(f"{args.label}: import {imported:.2f} s | 8 x 1024 fp32: forward "
          f"{case(8, 1024, False, 300):.0f} us, forward + backward {case(8, 1024, True, 300):.0f}"
          f" us | 512 x 32768 fp32 forward + backward {case(512, 32768, True, 20) / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
