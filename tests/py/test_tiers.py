"""The test tiers: which tests `tests/run.sh fast` leaves out (the e2e ones) and which it runs, and the slow
proofs that only `tests/run.sh slow` runs.

The e2e marker is given in conftest.py (from the fixtures a test uses, or by the test module itself); here
pytest collects a few modules in a child process, as tests/run.sh would, and the known tests must land on
the right side. A fixture that starts real things is named in conftest.E2E_FIXTURES by its name alone, so
each such name must be defined exactly once, where the table says.
"""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import E2E_FIXTURES, REPO

TESTS = REPO / "tests" / "py"

# Real jobs, clusters, Ray, a browser: each reached another way (module mark, fixture, fixture of a
# fixture, a mark on the test).
E2E = [
    "tests/py/test_run_local.py::test_failed_training_reports_failed_and_the_reason",  # pytestmark
    "tests/py/test_slurm.py::test_one_node_job_runs_every_stage_and_succeeds",  # slurm_env -> local_cluster
    "tests/py/test_requeue.py::test_time_limit_saves_a_checkpoint_and_the_requeued_attempt_resumes_from_it",
    "tests/py/test_profile.py::test_table_output",  # profiled_job
    "tests/py/test_profile.py::test_categories_add_up_and_the_program_has_matmuls_and_collectives",  # summary
    "tests/py/test_ray_launch.py::test_success_is_zero_and_says_so",  # cluster: a real Ray head
    "tests/py/test_dashboard.py::test_sort_and_filter_in_the_browser",  # @pytest.mark.e2e: Chromium
    "tests/py/test_hang_watchdog.py::test_run_local_training_frozen_mid_run_ends_as_hang_with_stacks",
]
# Units in the same modules: they stay in the fast tier.
FAST = [
    "tests/py/test_requeue.py::test_a_hang_blames_nobody",
    "tests/py/test_profile.py::test_categorize_falls_back_to_the_xprof_category",
    "tests/py/test_ray_launch.py::test_usage_errors_are_2",
    "tests/py/test_dashboard.py::test_bad_input_one_line_nothing_written",
    "tests/py/test_hang_watchdog.py::test_settings_defaults_and_overrides",
]
# The slow proofs (@pytest.mark.slow): only `tests/run.sh slow` runs them.
SLOW = [
    "tests/py/test_hang_cause.py::test_with_default_settings_a_frozen_rank_1_is_found_by_the_watchdog_not_killed_by_jax",
    "tests/py/test_requeue.py::test_ray_hang_of_a_two_node_job_on_three_nodes_is_requeued_without_the_frozen_node_and_resumes",
]
MODULES = sorted({node.split("::")[0] for node in E2E + FAST + SLOW})


def collected(*marker_args):
    """Node ids pytest collects from MODULES with MARKER_ARGS (e.g. "-m", "e2e"); parametrized ids merged."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--strict-markers", "-p", "no:cacheprovider",
         *marker_args, *MODULES],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode in (0, 5), result.stdout[-3000:] + result.stderr[-3000:]  # 5: none selected
    return {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}


def test_real_job_tests_are_e2e_and_units_are_not():
    e2e = collected("-m", "e2e")
    assert set(E2E) <= e2e, sorted(set(E2E) - e2e)
    assert not set(FAST) & e2e, sorted(set(FAST) & e2e)


def test_the_fast_selection_keeps_the_units_and_leaves_out_the_real_jobs():
    fast = collected("-m", "not e2e")
    assert set(FAST) <= fast, sorted(set(FAST) - fast)
    assert not set(E2E) & fast, sorted(set(E2E) & fast)


def fixture_definitions():
    """{fixture name: [modules defining it]} over tests/py, read from the source (a fixture's `name=` wins)."""
    found = {}
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                target = call.func if call else deco
                if isinstance(target, ast.Attribute) and target.attr == "fixture":
                    names = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                    found.setdefault(names[0] if names else node.name, []).append(path.stem)
    return found


def test_each_e2e_fixture_name_is_defined_once_where_the_table_says():
    defs = fixture_definitions()
    assert defs["tool_path"] == ["conftest"], "the reader must see conftest's own fixtures"
    for name, module in E2E_FIXTURES.items():
        assert defs.get(name) == [module], (
            f"fixture {name!r} is defined in {defs.get(name)}, conftest.E2E_FIXTURES says {module!r}: "
            "rename the new one, or fix the table"
        )


def run_sh(*args):
    return subprocess.run(
        [str(REPO / "tests" / "run.sh"), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_run_sh_help_names_the_fast_and_slow_tiers():
    result = run_sh("--help")
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.splitlines()[0]
        == "Usage: tests/run.sh [fast|slow] [bats|py ...] [--selection] [-- extra pytest args]"
    )
    assert "tests/run.sh fast " in result.stdout and "not e2e" in result.stdout
    assert "tests/run.sh slow " in result.stdout and "-m slow" in result.stdout


def selection(*tier):
    """What `tests/run.sh TIER --selection` says it would run: ({pytest -m expression}, bats filter, suites)."""
    result = run_sh(*tier, "--selection")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in result.stdout.splitlines())
    marker = re.fullmatch(r'-m "(.*)"', lines["pytest"]).group(1)
    return marker, lines["bats"], lines["suites"]


def test_the_slow_proofs_run_only_in_the_slow_tier():
    """Each tier's own marker expression, as tests/run.sh gives it to pytest: the slow proofs are in the slow
    tier alone, which holds nothing else of these modules; the full run keeps the other e2e tests."""
    full, fast, slow = selection()[0], selection("fast")[0], selection("slow")
    assert slow == ("slow", "--filter-tags slow", "py"), slow  # no bats test is slow: py alone
    assert selection("slow", "bats")[2] == "bats"
    in_full, in_fast, in_slow = collected("-m", full), collected("-m", fast), collected("-m", slow[0])
    assert in_slow == set(SLOW), sorted(in_slow ^ set(SLOW))
    assert not set(SLOW) & (in_full | in_fast), sorted(set(SLOW) & (in_full | in_fast))
    assert set(E2E) <= in_full and set(FAST) <= in_full and set(FAST) <= in_fast
    assert set(SLOW) <= collected("-m", "e2e")  # a slow proof starts real things too


def test_run_sh_refuses_two_tiers_in_one_line():
    result = run_sh("fast", "slow", "--selection")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "tests/run.sh: name one tier, not both 'fast' and 'slow'\n"


def bats_count(*args):
    bats = REPO / ".venv" / "bin" / "bats"
    exe = str(bats) if bats.exists() else shutil.which("bats")
    if exe is None:
        pytest.skip("no bats (utils/setup_env.sh puts it in .venv)")
    env = dict(os.environ, PATH=f"{bats.parent}:{os.environ.get('PATH', '')}")
    result = subprocess.run([exe, "--count", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def test_bats_e2e_tags_split_the_suite():
    # setup_env.bats: the --tools test builds a real venv (e2e); its other tests are fast.
    every = bats_count("tests/bats/setup_env.bats")
    e2e = bats_count("--filter-tags", "e2e", "tests/bats/setup_env.bats")
    fast = bats_count("--filter-tags", "!e2e", "tests/bats/setup_env.bats")
    assert e2e == 1 and fast >= 1
    assert e2e + fast == every
