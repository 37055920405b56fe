"""The HTML pages from whatever a directory holds: an older run directory, a half-written status.json, a run
that never wrote its record, a doctor round cut short; the page says what is missing, never fails. And the
pages' limits: offline, secrets masked, small at 128 nodes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import chromium, dom, text_of
from report_scenarios import big_doctor_round, big_run

from clusterrun.cli.main import main
from clusterrun.doctor.model import Scope
from clusterrun.doctor.registry import Check, Options
from clusterrun.doctor.run import run_doctor
from clusterrun.inventory.models import Inventory
from clusterrun.report import write_doctor_page, write_run_page
from clusterrun.report.html import CSP

REMOTE = re.compile(r"""(?:\b(?:src|href|action|poster|data|srcset)\s*=\s*["']?\s*https?:|url\(\s*["']?\s*https?:"""
                    r"""|@import)""", re.I)


def page_text(page: Path) -> str:
    html = page.read_text(encoding="utf-8")
    assert "Traceback" not in html and "could not be drawn" not in html
    return " ".join(text_of(html).split())


def test_run_page_of_a_half_written_status_says_the_states_are_unknown(tmp_path: Path) -> None:
    run = big_run(tmp_path / "20261125-101500-a1b2", 2, 2)
    status = run / "status.json"
    status.write_text(status.read_text()[:300])  # cut off mid-write
    text = page_text(write_run_page(run))
    assert "status.json cannot be read" in text
    assert "gpu000" in text and "gpu001" in text  # the plan still shows every node


def test_run_page_without_record_or_plan_says_what_is_missing(tmp_path: Path) -> None:
    run = tmp_path / "20261125-101500-a1b2"
    run.mkdir()
    text = page_text(write_run_page(run))
    assert "status.json is not there" in text and "plan.json is not there" in text


def test_run_page_of_an_older_run_directory(tmp_path: Path) -> None:
    run = big_run(tmp_path / "20261125-101500-a1b2", 2, 1)
    # An older clusterrun: problems as a list, no per-node record, no logs section, unknown keys, no ranks in the
    # plan's nodes, env unmasked.
    (run / "status.json").write_text(json.dumps({"run_id": run.name, "state": "failed", "exit_code": 1,
                                                 "started": 1.8e9, "problems": ["gpu001 unreachable"],
                                                 "some_new_key": {"x": 1}}))
    plan = json.loads((run / "plan.json").read_text())
    for node in plan["nodes"]:
        del node["ranks"]
    (run / "plan.json").write_text(json.dumps(plan))
    text = page_text(write_run_page(run))
    assert "the record holds no node's end" in text
    assert "gpu001 unreachable" in text
    assert "hf_secret" not in text and "HF_TOKEN" in text and "*** (9 characters)" in text


def test_run_page_shows_the_nodes_launch_phases_when_the_record_has_them(tmp_path: Path) -> None:
    run = big_run(tmp_path / "20261125-101500-a1b2", 2, 1)
    status = json.loads((run / "status.json").read_text())
    t0 = status["started"]
    status["timeline"] = {"gpu000": {"connect": [t0, t0 + 0.4], "agent": {"start": t0 + 0.4, "end": t0 + 1.2}},
                          "gpu001": {"connect": [t0, None], "bogus": "x"}}
    (run / "status.json").write_text(json.dumps(status))
    text = page_text(write_run_page(run))
    assert "Launch phases" in text
    assert "gpu000 connect 0.00s 0.4s" in text and "gpu000 agent 0.40s 0.8s" in text and "gpu001 connect" in text


def test_doctor_page_of_a_round_cut_before_its_report(tmp_path: Path) -> None:
    round_dir = big_doctor_round(tmp_path / "doctor-20261125-101500", 3)
    (round_dir / "report.json").unlink()
    text = page_text(write_doctor_page(round_dir))
    assert "report.json is not there" in text
    assert "gpu000" in text and "gpu002" in text  # the nodes' probe output is still shown (their topology)
    assert "no measured pair" in text


def test_doctor_page_of_a_half_written_report(tmp_path: Path) -> None:
    round_dir = big_doctor_round(tmp_path / "doctor-20261125-101500", 3)
    report = round_dir / "report.json"
    report.write_text(report.read_text()[:1000])
    text = page_text(write_doctor_page(round_dir))
    assert "report.json cannot be read" in text


def _interrupt(_ctx: object) -> list:
    raise KeyboardInterrupt


def test_doctor_cut_short_saves_what_it_found_and_the_page_says_what_did_not_run(tmp_path: Path) -> None:
    inv = Inventory.model_validate({"defaults": {"transport": "local"},
                                    "nodes": [{"name": "here", "host": "127.0.0.1"}]})
    from clusterrun.doctor.registry import all_checks

    checks = [all_checks()["node.ssh"], Check("x.stop", "stopped by the user", Scope.node, _interrupt, active=True),
              all_checks()["net.ping"]]
    with pytest.raises(KeyboardInterrupt):
        run_doctor(inv, checks, Options(), tmp_path / "doctor-x")
    report = json.loads((tmp_path / "doctor-x" / "report.json").read_text())
    assert report["cut_short"] == "interrupted (Ctrl-C)"
    ran = {c["name"]: c.get("ran", True) for c in report["checks"]}
    assert ran == {"node.ssh": True, "x.stop": False, "net.ping": False}
    text = page_text(write_doctor_page(tmp_path / "doctor-x"))
    assert "the round was cut short (interrupted (Ctrl-C))" in text
    assert "clusterrun doctor: cut short" in text
    assert text.count("\u2013 not run") == 4  # two checks, each in the node's column and the cluster's


def test_pages_of_128_nodes_stay_small_and_fetch_nothing(tmp_path: Path) -> None:
    doctor = write_doctor_page(big_doctor_round(tmp_path / "doctor-x", 128))
    run = write_run_page(big_run(tmp_path / "run-x", 128, 8))
    for page in (doctor, run):
        html = page.read_text(encoding="utf-8")
        assert page.stat().st_size < 3_000_000
        assert not REMOTE.findall(html)
        assert CSP in html
    text = page_text(doctor)
    assert "gpu003 (ens1): median" in doctor.read_text()  # hover of a row, where cells have none
    assert "\u25bc slow gpu003 : in 254 pair(s)" in text  # the slow NIC, told once for all its pairs
    assert "2 different matrices" in text  # one node wired differently
    assert "hf_secret" not in run.read_text()


def test_report_command_writes_a_run_page_and_a_doctor_page(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    big_run(runs / "20261125-101500-a1b2", 2, 2)
    big_doctor_round(runs / "doctor-20261125-101600", 2)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "a1b2"]) == 0
    assert capsys.readouterr().out.strip() == "runs/20261125-101500-a1b2/report.html"
    assert main(["report", "doctor-20261125-101600", "-o", str(tmp_path / "d.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "d.html")
    assert main(["report", "nothing-like-it"]) == 2
    assert "no run 'nothing-like-it'" in capsys.readouterr().err


@pytest.mark.skipif(chromium() is None, reason="no chromium here")
def test_a_page_that_says_what_is_missing_shows_in_a_browser(tmp_path: Path) -> None:
    run = tmp_path / "20261125-101500-a1b2"
    run.mkdir()
    (run / "status.json").write_text('{"run_id": "20261125-101500-a1b2", "sta')
    text = " ".join(text_of(dom(write_run_page(run))).split())
    assert "missing: status.json cannot be read" in text


@pytest.mark.parametrize("status", [
    {"state": "failed", "nodes": {"gpu000": {"ranks": {"0": "x", "y": {}}, "started": "soon"}}},
    {"state": "running", "events": [{"time": "x", "kind": 3}, "not an event", {"node": "gpu000"}]},
    {"state": "failed", "attempts": [{"attempt": "x", "nodes": "gpu000", "started": None}, 5],
     "first_failure": {"node": None, "rank": "1"}},
    {"state": "succeeded", "logs": {"received": {"a/b/c": 1, "gpu000/0/stdout": {"bytes": "many"}}}},
    {"state": "failed", "timeline": [{"node": "gpu000", "phase": "connect", "start": "x"}, 7], "started": 1.8e9},
], ids=["ranks", "events", "attempts", "logs", "timeline"])
def test_run_page_of_a_damaged_record_is_drawn(tmp_path: Path, status: dict) -> None:
    run = big_run(tmp_path / "20261125-101500-a1b2", 2, 1)
    (run / "status.json").write_text(json.dumps({"run_id": run.name, **status}))
    html = write_run_page(run).read_text(encoding="utf-8")
    assert "clusterrun run 20261125-101500-a1b2" in html
    assert "Traceback" not in html and "could not be drawn" not in html


@pytest.mark.parametrize("report", [
    {"checks": [1, {"name": "x", "findings": "many"}, {"name": "y", "findings": [3, {"verdict": "fail"}]}]},
    {"nodes": "gpu000", "measures": [{"src": "a"}, {"src": "a", "dst": "b", "value": "fast", "ok": "yes"}, 4]},
    {"verdict": 3, "counts": [1], "started": "x", "duration_s": None, "recommended": 5},
], ids=["checks", "measures", "header"])
def test_doctor_page_of_a_damaged_report_is_drawn(tmp_path: Path, report: dict) -> None:
    round_dir = big_doctor_round(tmp_path / "doctor-x", 2)
    (round_dir / "report.json").write_text(json.dumps(report))
    html = write_doctor_page(round_dir).read_text(encoding="utf-8")
    assert "clusterrun doctor" in html
    assert "could not be drawn" not in html
