"""Bad input refused first: every case of ``tools/bad_inputs.py`` (a parameter set's keys and values, YAML and
``BASE``, the commands' options, empty and over-long prompts, Slurm options) ends with exit status 2 and one line
naming the problem, with an empty model cache left empty: nothing converted, built or written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from thesis_lib import cli
from thesis_lib.book import params, sizing

_spec = importlib.util.spec_from_file_location("bad_inputs", Path(__file__).resolve().parents[1] / "tools" / "bad_inputs.py")
bad_inputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bad_inputs)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return bad_inputs.files(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("case", list(bad_inputs.CASES))
def test_a_bad_input_is_refused_in_one_line_before_anything_is_written(case, inputs, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("THESIS_LIB_CACHE", str(cache))
    assert cli.main(bad_inputs.argv(case, inputs)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and bad_inputs.CASES[case][1] in err[0], err
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))[:5]



@pytest.mark.parametrize("set_name", [s for s in params.parameter_sets() if s != "gpu-thesis"])  # its hub models
def test_every_shipped_parameter_set_passes_the_first_check(set_name):  # are not reachable here
    sizing.check_set(params.load_parameters(set_name))
