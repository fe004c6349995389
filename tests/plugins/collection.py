"""The collected tests' order (the longest files first) and tier. A test that starts vLLM or trains is `slow` by the
fixtures it uses (`SLOW_FIXTURES`); one that takes long on its own (a simulation, several nights, a process importing
a heavy stack) is marked where it is defined, `@pytest.mark.slow` with its time and why. `make check` leaves the slow
tier out (under 2 minutes on 2 cores); `make test` runs every test."""

import pytest

# With `--dist loadfile` a worker takes a whole file, in this order (the Makefile passes --no-loadscope-reorder): the
# longest first, so that none starts last; the 135M fine-tune (no vLLM) second, beside the file whose first test starts
# the session server, which a file of servers beside it would wait for.
LONGEST_FIRST = (  # by the time each file took in a fresh clone's run (the commit that last ordered them says)
    "test_serve.py",
    "test_training_smol.py",
    "test_night_servers.py",
    "test_training.py",
    "test_gpu_train_check.py",
    "test_bench.py",
    "test_grpo.py",
    "test_gate_level.py",
    "test_serve_untied.py",
    "test_inspect.py",
    "test_readme.py",
    "test_synth.py",
    "test_track.py",
    "test_stats.py",
    "test_api.py",
    "test_compare.py",
    "test_nightly.py",
    "test_types.py",  # one mypy process on one core: unordered, it came last while the other worker idled
    "test_cli_mistakes.py",
    "test_prepare_tiny.py",
)


# A test that uses one of these starts vLLM or trains (or builds a model to): `slow`, left out of `make check`.
SLOW_FIXTURES = {"tiny_server", "tiny_profile", "smol_model_dir", "random_model_dir"}


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
