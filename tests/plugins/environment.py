"""The environment every process of the run inherits (workers, servers, training): how idle threads wait, how many
threads numpy's BLAS runs, and how the heap keeps large allocations. Set by the controller, before any worker starts."""

import os


def pytest_configure(config):
    if "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker: it inherited the controller's settings
    # Two workers, the session server, a training run and a server a test owns compute at once on 2 cores. An
    # OpenMP thread that finds its partner descheduled spins by default (libgomp): two 2-thread torch processes side
    # by side took far longer than twice one alone, which passive waits cut (docs/performance.md). Inherited by
    # workers, servers, training.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # numpy's OpenBLAS runs its own threads, which spin as well (OMP_WAIT_POLICY is libgomp's): the simulated
    # comparisons (3000 bootstraps of a (2000, 252) @ (252, 8) product) took nearly twice as long beside one busy
    # process with a thread per core as with one thread (docs/performance.md). Products that small gain nothing from
    # a second thread even alone. torch keeps its own threads (it does not use OpenBLAS).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # glibc maps each allocation over 32 MB afresh and unmaps it when freed, so a training step's logits and gradients
    # fault in new zeroed pages every time: the GPU training check's CPU form spent a third of its CPU in the kernel.
    # Kept in the heap instead (no size mapped apart, nothing handed back), less than half that, for a somewhat higher
    # peak memory (docs/performance.md). Read by each process as it starts: workers, servers, training.
    os.environ.setdefault(
        "GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"
    )
