"""Running a script in a fresh Python process with 8 host devices: the device
count must be set before JAX starts, and the suite's own process has started it."""

import os
import subprocess
import sys


def run_on_eight_devices(script: str, timeout: float = 600) -> str:
    """Runs `script` in a subprocess with 8 host devices (on top of the suite's
    XLA flags, conftest) and the default platforms; asserts that it exited
    cleanly and printed "OK".

    **Arguments:**

    - `script`: Python source.
    - `timeout`: seconds.

    **Returns:**

    What it printed.
    """
    flags = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    env = dict(os.environ, XLA_FLAGS=flags.strip())
    env.pop("JAX_PLATFORMS", None)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    return done.stdout
