"""The tiny finished run the data-loss tests start from (tests/tiny_run.py makes it): `made`, trained
once per test module, and `run`, a copy of it for each test to damage or refuse to overwrite."""

import pytest
from tiny_run import copy_run, make_run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("made") / "run")


@pytest.fixture
def run(made, tmp_path):
    return copy_run(made, tmp_path / "run")
