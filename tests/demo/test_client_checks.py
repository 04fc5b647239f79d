"""What the client checks itself before anything runs or is sent, each one message and exit status 2:
the job file's deadline forms and `target_steps` (read the same by `submit` and `train`), the plan
`spotpipe train` can honour (worded as the control plane words it), `spotpipe sample`'s options,
`spotpipe data prepare`'s --out; and `spotpipe jobs` prints nothing on stdout before an error."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotpipe import commands
from spotpipe.client import ClientError
from spotpipe.jobfile import DEADLINE_FORMS, JobFileError, load_job_file
from spotpipe.train import TrainOptions, run_train

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
JOB = """target_steps = 2
{top}
[config]
global_batch = 8
[config.model]
kind = "mlp"
n_layer = 2
n_embd = 8
[plan]
{plan}
"""


def _file(tmp_path: Path, *, top: str = "", plan: str = "dp = 1\npp = 1\n") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(top=top, plan=plan))
    return path


@pytest.mark.parametrize("deadline", ['"2 hours"', '"tomorrow"', '"6hours"', '"2026-13-01T00:00:00Z"', '""'])
def test_a_deadline_of_another_form_names_the_file_the_field_and_the_forms(tmp_path: Path, deadline: str,
                                                                            submitted: list[dict]) -> None:
    path = _file(tmp_path, top=f"deadline = {deadline}")
    with pytest.raises(JobFileError) as info:
        load_job_file(path, now=NOW)
    assert str(info.value).startswith(f"{path}: deadline ") and DEADLINE_FORMS in str(info.value)
    err = io.StringIO()
    assert commands.submit(path, out=io.StringIO(), err=err) == 2 and not submitted  # never sent
    assert err.getvalue().count("\n") == 1 and "is not a time or a duration" in err.getvalue()


def test_an_iso_deadline_is_sent_as_written_and_one_without_an_offset_is_refused(tmp_path: Path) -> None:
    assert load_job_file(_file(tmp_path, top='deadline = "2026-12-01 18:00:00+01:00"'), now=NOW)["deadline"] == \
        "2026-12-01 18:00:00+01:00"
    with pytest.raises(JobFileError, match="deadline '2026-12-01T18:00:00' has no time zone"):
        load_job_file(_file(tmp_path, top='deadline = "2026-12-01T18:00:00"'), now=NOW)


@pytest.mark.parametrize("steps", ['"4"', "0", "true", "2.5"])
def test_target_steps_of_another_type_is_refused_alike_by_submit_and_train(tmp_path: Path, steps: str,
                                                                           submitted: list[dict]) -> None:
    path = _file(tmp_path)
    path.write_text(path.read_text().replace("target_steps = 2", f"target_steps = {steps}"))
    for run in (lambda err: commands.submit(path, out=io.StringIO(), err=err),
                lambda err: run_train(TrainOptions(file=path, out=tmp_path / "out"), out=io.StringIO(), err=err)):
        err = io.StringIO()
        assert run(err) == 2
        assert err.getvalue() == f"error: {path}: target_steps must be a positive integer (written without quotes), " \
                                 f"got {load_raw(path)['target_steps']!r}\n"
    assert not submitted and not (tmp_path / "out").exists()


def load_raw(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


@pytest.mark.parametrize(("plan", "message"), [
    ({"ppp": 2}, "unknown plan field(s) ppp; expected some of"),
    ({"dp": 2, "pp": 2, "nodes": 2}, "plan.nodes=2 cannot hold dp=2 x pp=2 = 4 workers"),
])
def test_train_refuses_a_plan_in_the_control_planes_words(tmp_path: Path, plan: dict, message: str) -> None:
    """`spotpipe train` refuses a plan as the control plane does: both ask runtime.config's rules."""
    from controlplane.planning.plans import parse_plan_request
    from runtime.config import LayoutError
    with pytest.raises(LayoutError) as server:
        parse_plan_request({**plan, "provider": "local"})
    assert message in server.value.message
    lines = "".join(f"{k} = {v}\n" for k, v in plan.items())
    err = io.StringIO()
    assert run_train(TrainOptions(file=_file(tmp_path, plan=lines), out=tmp_path / "out"), out=io.StringIO(),
                     err=err) == 2
    assert err.getvalue() == f"error: {server.value.field}: {server.value.message}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("options", "named"), [
    (dict(temperature=0), "error: --temperature 0: expected a number above 0"),
    (dict(tokens=-1), "error: --tokens -1: expected 0 or more"),
    (dict(top_k=0), "error: --top-k 0: expected at least 1"),
])
def test_sample_names_the_option_that_is_wrong(tmp_path: Path, options: dict, named: str) -> None:
    from spotpipe.sample import run_sample

    err = io.StringIO()
    assert run_sample(str(tmp_path), out=io.StringIO(), err=err, **options) == 2
    assert err.getvalue().startswith(named) and err.getvalue().count("\n") == 1, err.getvalue()


def test_jobs_prints_nothing_on_stdout_before_an_error(monkeypatch) -> None:
    class Refusing:
        def jobs(self) -> list:
            raise ClientError("401: Invalid token.", status=401)

    monkeypatch.setattr(commands, "_client", Refusing)
    out, err = io.StringIO(), io.StringIO()
    assert commands.jobs(out=out, err=err) == 1
    assert out.getvalue() == "" and err.getvalue() == "error: 401: Invalid token.\n"


def test_data_prepare_into_a_file_is_one_message(tmp_path: Path) -> None:
    from spotpipe.data import run_prepare

    (tmp_path / "corpus.txt").write_text("hello world\n" * 10)
    (tmp_path / "taken").write_text("a file")
    for out in (tmp_path / "taken", tmp_path / "taken" / "below"):
        errors = io.StringIO()
        code = run_prepare(f"text:{tmp_path / 'corpus.txt'}", tokenizer="byte", out=str(out), stream=io.StringIO(),
                           errors=errors)
        assert code == 2 and errors.getvalue().count("\n") == 1, errors.getvalue()
        assert errors.getvalue().startswith("spotpipe data prepare: ") and str(tmp_path / "taken") in errors.getvalue()
    assert (tmp_path / "taken").read_text() == "a file"
