"""Under `pytest -n N` (the Makefile's `-n 2`), each worker gets its share of the cores: N workers of torch's default
(one thread per core) would run N x cores threads, and torch's OpenMP threads spin at every barrier waiting for
threads the OS has descheduled. On 2 busy cores the SmolLM2 `hqkv eval kld` of tests/test_models.py took 40 s with
2 threads and 9 s with 1 (same results; issue 29). OMP_NUM_THREADS also reaches the CLI processes the tests start;
a value the caller set is kept."""
import os

_workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _workers and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // int(_workers)))
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
