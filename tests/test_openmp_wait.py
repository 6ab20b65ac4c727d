"""OpenMP threads that sleep at a barrier instead of spinning (issue 54): torch's OpenMP runtime (GNU libgomp)
spins 300,000 times at every barrier before it sleeps, so beside other work a 2-thread EMOS fit spent its
time slices spinning: the tp24 fit (every 4th point) took 9.6 times its time alone beside 2 CPU-burning
processes, 1.84 times with the threads sleeping (benchmarks/emos_busy.py). Importing postcast sets
OMP_WAIT_POLICY=PASSIVE (spin count 0) unless the user set a policy; the runtime's own display of its settings
(OMP_DISPLAY_ENV, printed when torch loads it) is read here, not the variable."""

import os
import subprocess
import sys

IMPORTS = "import postcast.models.emos_fit"  # postcast before torch, as every postcast entry point does


def _display(extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", **extra}
    proc = subprocess.run([sys.executable, "-c", IMPORTS], env=env, capture_output=True, text=True, check=True)
    return proc.stderr


def test_importing_postcast_makes_openmp_threads_sleep_at_barriers():
    assert "GOMP_SPINCOUNT = '0'" in _display({}), "torch's OpenMP threads still spin at barriers"


def test_a_wait_policy_the_user_set_is_kept():
    shown = _display({"OMP_WAIT_POLICY": "ACTIVE"})
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in shown and "GOMP_SPINCOUNT = '0'" not in shown
