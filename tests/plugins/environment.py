"""The environment every process of the run inherits (workers, servers, training): how idle threads wait, how many
threads numpy's BLAS runs, and how the heap keeps large allocations. Set by the controller, before any worker starts."""

import os


def pytest_configure(config):
    if "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker: it inherited the controller's settings
    # Two workers, the session server, a training run and a server a test owns compute at once on 2 cores. An
    # OpenMP thread that finds its partner descheduled spins by default (libgomp): two 2-thread torch processes
    # took 12.3 s where one alone took 3.3 s; with passive waits 7.7 s. Inherited by workers, servers, training.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # numpy's OpenBLAS runs its own threads, which spin as well (OMP_WAIT_POLICY is libgomp's): the simulated
    # comparisons (3000 bootstraps of a (2000, 252) @ (252, 8) product) took 23.6 s and 28.8 CPU-s beside one busy
    # process with a thread per core, 13.0 s and 12.4 CPU-s with one thread. Products that small gain nothing from a
    # second thread even alone. torch keeps its own threads (it does not use OpenBLAS).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # glibc maps each allocation over 32 MB afresh and unmaps it when freed, so a training step's logits and gradients
    # fault in new zeroed pages every time: the GPU training check's CPU form spent 11 s of its 36 s of CPU in the
    # kernel, 4.4M page faults. Kept in the heap instead (no size mapped apart, nothing handed back): 4.6 s, 1.5M
    # faults, 6.0 GB of peak memory against 5.3. Read by each process as it starts: workers, servers, training.
    os.environ.setdefault(
        "GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"
    )
