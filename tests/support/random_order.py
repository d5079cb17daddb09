"""The tests in a random order, reproducibly (issue 25: each test sets up what it needs, so none may lean on an
earlier one's state). Hooks for tests/conftest.py:

    pytest --random-order                 a seed drawn now
    pytest --random-order-seed=N          that order again

The seed is printed in the header and again in the summary. The modules are shuffled, and the tests inside each
module; a module's tests stay together, so its module-scoped fixtures (a booted browser page) are made once. A
module's order depends only on the seed and the module's path: a failure seen in a larger run comes back when that
one file runs with the same seed.
"""

from __future__ import annotations

import random

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("random order")
    group.addoption("--random-order", action="store_true",
                    help="run the modules, and the tests inside each, in a random order (a new seed, printed)")
    group.addoption("--random-order-seed", type=int, default=None, metavar="N",
                    help="run in the random order of seed N (implies --random-order)")


def seed_of(config) -> int | None:
    """The seed of this run, drawn once if --random-order came without one; None: file order."""
    if config.option.random_order_seed is None and config.option.random_order:
        config.option.random_order_seed = random.SystemRandom().randrange(1_000_000)
    return config.option.random_order_seed


def _line(seed: int) -> str:
    return f"random order: seed {seed} (again: --random-order-seed={seed})"


def pytest_report_header(config):
    seed = seed_of(config)
    return [_line(seed)] if seed is not None else []


@pytest.hookimpl(trylast=True)          # after any other plugin's reordering: this order is the one run
def pytest_collection_modifyitems(session, config, items):
    seed = seed_of(config)
    if seed is None:
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(modules)
    random.Random(seed).shuffle(order)
    items[:] = []
    for module in order:
        tests = modules[module]
        random.Random(f"{seed}:{module}").shuffle(tests)
        items.extend(tests)


def pytest_terminal_summary(terminalreporter, config):
    seed = seed_of(config)
    if seed is not None:
        terminalreporter.write_line(_line(seed))
