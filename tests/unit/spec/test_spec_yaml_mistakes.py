"""Mistakes as users make them in YAML files (a list where a mapping belongs, words where a
number belongs, a host that does not exist) and what they read back: the file, the field
path, the value they wrote and the fix, every problem at once, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from boltforge.spec.errors import SpecError, SpecProblem
from boltforge.spec.fleet import load_fleet
from boltforge.spec.job import load_job
from boltforge.spec.loader import parse_yaml, read_yaml
from boltforge.spec.state import load_state

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LAB = load_fleet(EXAMPLES / "fleets" / "lab.yaml")  # hosts h100-p0-r00-h00 .. r01-h01
HOST = "h100-p0-r00-h00"
JOB = "name: train\nteam: nlp\n"


def error_of(tmp_path: Path, text: str, load: str = "job") -> SpecError:
    path = tmp_path / f"{load}.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        if load == "job":
            load_job(path)
        elif load == "state":
            load_state(path, LAB)
        else:
            load_fleet(path)
    assert caught.value.source == str(path)
    assert "Traceback" not in caught.value.render()
    return caught.value


# --- jobs -----------------------------------------------------------------------------------

JOB_MISTAKES = [
    pytest.param(
        "roles:\n  gpus: 8\n", "job.roles", "must be a list. To fix: write each item on its own",
        id="a role written as a mapping, not a list",
    ),
    pytest.param(
        "gpus: 8\nenv:\n  - WANDB_MODE=offline\n", "job.env", "must be a mapping. To fix:",
        id="env written as a list",
    ),
    pytest.param(
        "gpus: 8\ncheckpoint: 30s\n", "job.checkpoint", "must be a mapping of its own fields",
        id="a checkpoint given as a bare duration",
    ),
    pytest.param(
        "gpus: 8\npreemptible: maybe\n", "job.preemptible", "must be true or false",
        id="a yes/no field in other words",
    ),
    pytest.param(
        "roles:\n  - gpus: 8\n    replicas: two\n", "job.roles[0].replicas",
        "must be a whole number", id="replicas in words",
    ),
    pytest.param(
        "gpus: 8\ncpus: plenty\n", "job.cpus", "must be a number", id="cpus in words",
    ),
    pytest.param(
        "gpus: 8\ndeadline: next friday\n", "job.deadline", "`2026-12-01T18:00:00Z`",
        id="a deadline in words",
    ),
    pytest.param(
        "gpus: 8\noutputs: [../../etc]\n", "job.outputs", "leaves its directory",
        id="an output outside its directory",
    ),
    pytest.param(
        "gpus: 8\ntime_limit: forever\n", "job.time_limit", "", id="a time limit in words",
    ),
    pytest.param(
        "gpus: 8\nroles_: []\n", "job.roles_", "is not a known field. To fix: remove it",
        id="a misspelt field",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("yaml", "field", "fix"), JOB_MISTAKES)
def test_a_job_mistake_names_the_field_and_the_fix(
    tmp_path: Path, yaml: str, field: str, fix: str
) -> None:
    error = error_of(tmp_path, JOB + yaml)
    assert [p.field for p in error.problems] == [field], error.render()
    assert fix in error.problems[0].message


def test_what_was_written_is_shown_after_the_fix_unless_nothing_was(tmp_path: Path) -> None:
    plain = SpecProblem("job.preemptible", "maybe", "must be true or false").render()
    assert plain == "job.preemptible: must be true or false (got 'maybe')"
    error = error_of(tmp_path, "name: train\ngpus: 8\n")
    assert error.render().splitlines()[1] == (
        "  job.team: is required: every job belongs to a team. To fix: add `team: <your team>`"
    )


def test_a_block_value_in_a_validation_error_is_not_echoed(tmp_path: Path) -> None:
    error = error_of(tmp_path, JOB + "gpus: 8\nenv:\n  - A=1\n  - B=2\n")
    assert error.render().endswith("job.env: must be a mapping. To fix: write it as `key: "
                                   "value` lines under the field")  # fmt: skip


def test_every_mistake_in_a_job_is_reported_at_once(tmp_path: Path) -> None:
    error = error_of(tmp_path, "name: Train\ngpus: 8\ncpus: plenty\nretries: 3\n")
    assert sorted(p.field for p in error.problems) == ["job.cpus", "job.name", "job.retries",
                                                       "job.team"]  # fmt: skip
    assert error.render().startswith(f"{error.source}: 4 problem(s)\n")


@pytest.mark.parametrize(
    "text", ["", "# nothing yet\n", "- name: train\n", "just words\n"],
    ids=["an empty file", "only a comment", "a list", "a bare word"],
)  # fmt: skip
def test_a_job_file_that_is_not_a_mapping_says_so(tmp_path: Path, text: str) -> None:
    error = error_of(tmp_path, text)
    (problem,) = error.problems
    assert problem.field == "job"
    assert problem.message.startswith("must be a mapping of fields. To fix:")


# --- YAML and files -------------------------------------------------------------------------


def test_a_syntax_error_names_the_line_and_column() -> None:
    with pytest.raises(SpecError) as caught:
        parse_yaml("name: train\nteam: [nlp\ngpus: 8\n", "job.yaml")
    (problem,) = caught.value.problems
    assert problem.field.startswith("yaml (line 3, column ")
    assert problem.message.endswith("To fix: correct the syntax")


def test_a_tab_indent_is_a_syntax_error_not_a_crash() -> None:
    with pytest.raises(SpecError, match=r"yaml \(line 2, column 1\)"):
        parse_yaml("name: train\n\tteam: nlp\n", "job.yaml")


def test_a_directory_or_a_binary_file_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file: cannot be read"):
        read_yaml(tmp_path)
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="file: cannot be read"):
        read_yaml(binary)


# --- fleet state ----------------------------------------------------------------------------


def test_gpu_indices_beyond_the_host_name_the_range(tmp_path: Path) -> None:
    error = error_of(
        tmp_path, f"running:\n  - {{job: a, nodes: {{{HOST}: [6, 7, 8, 9]}}}}\n", "state"
    )
    (problem,) = error.problems
    assert problem.field == f"state.running[0].nodes.{HOST}"
    assert problem.render() == f"state.running[0].nodes.{HOST}: GPU indices run 0-7 (got [8, 9])"


def test_a_cordon_on_an_unknown_host_names_it(tmp_path: Path) -> None:
    error = error_of(tmp_path, f"cordoned: [{HOST}, h100-p9-r00-h00]\n", "state")
    (problem,) = error.problems
    assert problem.render() == "state.cordoned: is not a host of this fleet (got 'h100-p9-r00-h00')"


def test_cordoned_hosts_take_no_new_work_and_the_rest_are_free(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(f"cordoned: [{HOST}]\n")
    state = load_state(path, LAB)
    assert [h.name for h, c in zip(LAB.hosts, state.cordoned, strict=True) if c] == [HOST]
    assert state.free_gpus == LAB.total_gpus and not state.allocations


def test_an_empty_state_file_is_an_idle_fleet(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text("# nothing running\n")
    state = load_state(path, LAB)
    assert state.free_gpus == LAB.total_gpus and not state.cordoned.any()


STATE_MISTAKES = [
    pytest.param(
        f"running:\n  - {{job: a, nodes: {{{HOST}: [0]}}, priority: 7}}\n",
        "state.running[0].priority", "To fix: change the value", id="a class beyond 3",
    ),
    pytest.param(
        "running:\n  - {job: a, nodes: {}}\n", "state.running[0].nodes", "",
        id="a job holding nothing",
    ),
    pytest.param(
        f"running:\n  - {{nodes: {{{HOST}: [0]}}}}\n", "state.running[0].job",
        "is required. To fix: add it", id="a job without a name",
    ),
    pytest.param(
        f"running:\n  - {{job: a, nodes: {{{HOST}: [0]}}, ends_in: soon}}\n",
        "state.running[0].ends_in", "", id="an end in words",
    ),
    pytest.param(
        f"runing:\n  - {{job: a, nodes: {{{HOST}: [0]}}}}\n", "state.runing",
        "is not a known field", id="a misspelt section",
    ),
    pytest.param(
        f"running:\n  - {{job: a, nodes: {{{HOST}: [0]}}, cpus_per_node: -1}}\n",
        "state.running[0].cpus_per_node", "To fix", id="negative CPUs",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("yaml", "field", "fix"), STATE_MISTAKES)
def test_a_state_mistake_names_the_field_and_the_fix(
    tmp_path: Path, yaml: str, field: str, fix: str
) -> None:
    error = error_of(tmp_path, yaml, "state")
    assert [p.field for p in error.problems] == [field], error.render()
    assert fix in error.problems[0].message


def test_every_bad_job_in_a_state_is_reported_and_good_ones_do_not_hide_them(
    tmp_path: Path,
) -> None:
    error = error_of(
        tmp_path,
        "running:\n"
        f"  - {{job: ok, nodes: {{{HOST}: [0, 1]}}}}\n"
        f"  - {{job: far, nodes: {{nowhere: [0], {HOST}: [12]}}}}\n"
        f"  - {{job: twice, nodes: {{{HOST}: [1]}}}}\n",
        "state",
    )
    assert [p.field for p in error.problems] == [
        "state.running[1].nodes.nowhere",
        f"state.running[1].nodes.{HOST}",
        "state.running[2]",
    ]
    assert error.problems[2].message.endswith("To fix: give each GPU to one job only")


# --- fleets ---------------------------------------------------------------------------------


def test_a_fleet_with_a_pool_written_as_a_mapping_says_to_make_it_a_list(tmp_path: Path) -> None:
    error = error_of(tmp_path, "name: f\npools:\n  name: h100\n  gpus_per_host: 8\n", "fleet")
    assert [p.field for p in error.problems] == ["fleet.pools"]
    assert "must be a list" in error.problems[0].message
