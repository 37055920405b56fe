"""Which node is at fault from the dead and working paths: the one rule of the check before the start and of the
watch during the run (pure logic; the same situations on the simulated cluster are in test_up_once.py and
test_path_watch.py)."""

from __future__ import annotations

from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.pathcheck import PathReport, _name_suspect, _paths
from clusterrun.launch.watch import at_fault
from clusterrun.planning.plan import JobSpec, LaunchPlan, build_plan

ORDER = ["n0", "n1", "n2", "n3"]


def test_the_node_in_every_dead_path_is_the_one_suspect() -> None:
    lost = [(w, "n0") for w in ORDER[1:]] + [("n0", w) for w in ORDER[1:]]
    assert at_fault(lost, ORDER) == ["n0"]


def test_a_worker_whose_peers_reach_the_master_is_blamed_not_the_master() -> None:
    lost = [("n2", "n0"), ("n0", "n2")]  # a tie on counts alone
    working = [("n1", "n0"), ("n0", "n1"), ("n3", "n0"), ("n0", "n3")]
    assert at_fault(lost, ORDER, working=working) == ["n2"]


def test_two_nodes_that_lost_each_other_cannot_be_told_apart() -> None:
    assert at_fault([("n1", "n0"), ("n0", "n1")], ORDER[:2]) == ["n0", "n1"]


def test_a_node_clusterrun_cannot_hear_either_is_blamed_on_a_tie() -> None:
    assert at_fault([("n1", "n0"), ("n0", "n1")], ORDER[:2], silent={"n1"}) == ["n1"]


def test_nothing_lost_blames_no_one() -> None:
    assert at_fault([], ORDER) == []


def plan_of(n: int) -> LaunchPlan:
    hosts = "\n".join(f"  - {{name: n{i}, host: 10.0.0.{i + 1}, gpus: 1}}" for i in range(n))
    return build_plan(parse_inventory_text(f"nodes:\n{hosts}\n", "inv.yaml"),
                      JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs", local_cwd="/work"))


DEAD = {"tcp": "timed out after 3s", "ping": "failed"}
OK = {"tcp": None, "ping": None}


def judged(plan: LaunchPlan, answers: dict[str, dict[str, object]], back: dict[str, str],
           ring: list[tuple[tuple[str, str], bool]]) -> PathReport:
    """The report of the check given each worker's answer, the master's pings and the workers' pings."""
    report = PathReport(problems={n: "cannot reach n0's master address: timed out; no ping reply either"
                                  for n, a in answers.items() if a["tcp"]})
    pinged = {n.data_address: back[n.name] for n in plan.nodes if n.name in back}
    lost, working = _paths(plan.master, [n for n in plan.nodes if n is not plan.master], answers, pinged)
    for path, ok in ring:
        (working if ok else lost).append(path)
    _name_suspect(plan, lost, working, report)
    return report


def test_a_dead_master_nic_is_named_once_with_the_evidence() -> None:
    plan = plan_of(4)
    report = judged(plan, {"n1": DEAD, "n2": DEAD, "n3": DEAD}, {"n1": "failed", "n2": "failed", "n3": "failed"},
                    [(("n1", "n2"), True), (("n2", "n3"), True), (("n3", "n1"), True)])
    assert list(report.problems) == ["n0"] and report.suspect == "n0"
    assert report.problems["n0"].startswith(
        "its data NIC 10.0.0.1 is the suspect: no worker reaches it (no connection to the master port, no ping "
        "reply); it gets no ping reply from any worker; the workers reach each other; check that NIC")


def test_one_dead_worker_nic_is_that_workers_problem() -> None:
    plan = plan_of(4)
    report = judged(plan, {"n1": OK, "n2": DEAD, "n3": OK}, {"n1": "ok", "n2": "failed", "n3": "ok"},
                    [(("n1", "n2"), False), (("n2", "n3"), False), (("n3", "n1"), True)])
    assert list(report.problems) == ["n2"] and report.suspect == "n2"
    assert report.problems["n2"].endswith("(the other workers reach n0; n1 gets no ping reply from it)")


def test_two_nodes_keep_each_ones_own_words() -> None:
    plan = plan_of(2)
    report = judged(plan, {"n1": DEAD}, {"n1": "failed"}, [])
    assert list(report.problems) == ["n1"] and report.suspect is None


def test_the_master_is_not_blamed_while_some_workers_reach_it() -> None:
    plan = plan_of(4)
    report = judged(plan, {"n1": DEAD, "n2": DEAD, "n3": OK}, {"n1": "failed", "n2": "failed", "n3": "ok"},
                    [(("n1", "n2"), True), (("n2", "n3"), True), (("n3", "n1"), True)])
    assert sorted(report.problems) == ["n1", "n2"] and report.suspect is None
