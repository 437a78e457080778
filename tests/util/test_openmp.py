"""`llamablock serve` keeps OpenMP's spin between parallel regions (util/openmp.py): set before torch is
imported, so that libgomp reads it when it loads, for serve alone, and never over a value the user
set. What it is for, a step several times faster from the server's scheduler thread, is timed by
`llamablock bench serve`, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llamablock.util.openmp import SETTINGS, keep_spinning

# A command line run in a child process, with an import hook that records the two settings at the moment
# torch is first imported. `--threads 0` is refused by the parser after the command's module (and so
# torch) is imported, so nothing is served.
CHILD = r"""
import json, os, sys
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.update({k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")})
        return None
sys.meta_path.insert(0, Spy())
from llamablock.cli import main
try:
    main([sys.argv[1], "--threads", "0"])
except SystemExit:
    pass
print(json.dumps(seen))
"""


def _at_torchs_import(command: str, user: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    done = subprocess.run([sys.executable, "-c", CHILD, command], capture_output=True, text=True,
                          env={**env, **user}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sets_both_where_the_user_set_neither():
    env: dict[str, str] = {}
    keep_spinning(env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}  # libgomp's own default count


def test_a_users_setting_is_kept_and_nothing_added():
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert keep_spinning(env) is False and env == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("command, user, want", [
    ("serve", {}, SETTINGS),
    ("serve", {"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "0"}),
    ("generate", {}, {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}),  # one thread computes: libgomp's own
])
def test_the_command_line_sets_them_before_torch_is_imported(command, user, want):
    assert _at_torchs_import(command, user) == want
