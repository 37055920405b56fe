"""`clusterrun export pytorchjob` and `export trainjob`: documents the Kubeflow CRDs accept, for 1, 2 and 16 nodes
with and without GPUs, that carry the job (node count, processes and GPUs per node, the environment that names no
node's device, the script's arguments as typed) and say in comments what they cannot carry.

The schemas are the CRDs' own (tests/fixtures/k8s, see SOURCE.md there), made strict as the API server is with
kubectl's default field validation: a field the schema does not declare is an error, not silently dropped.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterrun.cli.job_options import build_job
from clusterrun.errors import PlanError, UsageError
from clusterrun.export.kubeflow import DEVICE_VARS, KubeOptions, pytorchjob, trainjob
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.planning.plan import JobSpec, build_plan

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"
TRAIN = str(ROOT / "examples" / "train_ddp.py")
IMAGE = "ghcr.io/acme/train:1.4"
SECRET = "s3cr3t-value-never-written"
ARGS = ("--epochs", "3", "$(HOME)", "$$", "cost: $5", "two words", "it's", "line\nbreak", "")
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def served_schema(crd_file: str) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's served (and stored) version."""
    crd = yaml.load((FIXTURES / crd_file).read_text(encoding="utf-8"), Loader=Loader)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


def strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever it lists its fields and does not keep unknown ones."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


SCHEMAS = {
    "PyTorchJob": strict(served_schema("kubeflow.org_pytorchjobs.yaml")),
    "TrainJob": strict(served_schema("trainer.kubeflow.org_trainjobs.yaml")),
}
# Built once: jsonschema.validate() would check the large schema itself on every call.
VALIDATORS = {kind: jsonschema.Draft7Validator(schema) for kind, schema in SCHEMAS.items()}


def validate(kind: str, doc: dict[str, Any]) -> None:
    VALIDATORS[kind].validate(doc)


@pytest.mark.parametrize("kind", list(SCHEMAS))
def test_the_strict_schemas_are_valid_json_schemas(kind: str) -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMAS[kind])
EXPORTS = {"PyTorchJob": pytorchjob, "TrainJob": trainjob}


def export(kind: str, inv: Any, plan: Any, **options: Any) -> tuple[str, dict[str, Any]]:
    text = EXPORTS[kind](plan, inv, KubeOptions(image=options.pop("image", IMAGE), **options))
    return text, yaml.load(text, Loader=Loader)


def one_liner(nodes: int, gpus: str | None, args: tuple[str, ...] = ARGS, env: tuple[str, ...] = ()) -> tuple[Any, Any]:
    ips = ",".join(f"10.0.0.{i}" for i in range(1, nodes + 1))
    return build_job(None, TRAIN, args, module=False, nproc_per_node=None, master_port=None, env=env,
                     runs_dir=Path("runs"), sources={"ips": ips, "gpus": gpus})


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command, argument or env value: ``$$`` is ``$``, ``$(NAME)`` a defined variable."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2)
            if text[i + 1] == "(" and end > 0 and text[i + 2:end] in env:
                out.append(env[text[i + 2:end]])
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def containers(kind: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each replica's container (PyTorchJob) or the trainer (TrainJob)."""
    if kind == "TrainJob":
        return [doc["spec"]["trainer"]]
    return [r["template"]["spec"]["containers"][0] for r in doc["spec"]["pytorchReplicaSpecs"].values()]


# -- the CRDs accept them ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(EXPORTS))
@pytest.mark.parametrize("nodes", [1, 2, 16])
@pytest.mark.parametrize("gpus", [None, "0-7"], ids=["cpu", "gpu"])
def test_document_validates_against_the_crd_schema(kind: str, nodes: int, gpus: str | None) -> None:
    inv, plan = one_liner(nodes, gpus)
    _, doc = export(kind, inv, plan)
    validate(kind, doc)
    if kind == "PyTorchJob":
        replicas = doc["spec"]["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] == 1
        assert replicas.get("Worker", {}).get("replicas", 0) == nodes - 1
        assert "Worker" in replicas or nodes == 1
        assert doc["spec"]["nprocPerNode"] == str(8 if gpus else 1)
    else:
        assert doc["spec"]["trainer"]["numNodes"] == nodes
        assert doc["spec"]["trainer"]["numProcPerNode"] == (8 if gpus else 1)
    for container in containers(kind, doc):
        limits = (container.get("resources") or container.get("resourcesPerNode") or {}).get("limits", {})
        assert limits == ({"nvidia.com/gpu": 8} if gpus else {})


def _misspell(doc: dict[str, Any]) -> None:
    doc["spec"]["trainer"]["numProcsPerNode"] = doc["spec"]["trainer"].pop("numProcPerNode")


def _mistype(doc: dict[str, Any]) -> None:
    doc["spec"]["nprocPerNode"] = 8  # a string in kubeflow.org/v1


def _misplace(doc: dict[str, Any]) -> None:
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resource"] = {}


@pytest.mark.parametrize(("kind", "spoil"), [("TrainJob", _misspell), ("PyTorchJob", _mistype),
                                             ("PyTorchJob", _misplace)], ids=["misspelled", "mistyped", "unknown"])
def test_the_schemas_refuse_a_document_with_a_wrong_field(kind: str, spoil: Any) -> None:
    """The validation above has teeth: a field the CRD does not have, or of the wrong type, fails it."""
    inv, plan = one_liner(2, "0-7")
    _, doc = export(kind, inv, plan)
    validate(kind, doc)
    spoil(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(kind, doc)


@pytest.mark.parametrize("kind", list(EXPORTS))
@pytest.mark.parametrize("inventory", sorted((ROOT / "inventories").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_inventories_export_valid_documents(kind: str, inventory: Path) -> None:
    inv, plan = build_job(inventory, TRAIN, ARGS, module=False, nproc_per_node=None, master_port=None, env=(),
                          runs_dir=Path("runs"))
    text, doc = export(kind, inv, plan, namespace="ml-team")
    validate(kind, doc)
    assert doc["metadata"]["namespace"] == "ml-team"
    assert text.startswith(f"# {kind} {doc['metadata']['name']}: ")


def test_trainjob_names_and_process_counts_meet_the_crds_own_rules() -> None:
    """The CRD's CEL rules (which a JSON Schema cannot express), read from the fixture and applied."""
    schema = served_schema("trainer.kubeflow.org_trainjobs.yaml")
    rules = {r["rule"] for r in schema["x-kubernetes-validations"]}
    (name_rule,) = [r for r in rules if "matches" in r]
    pattern = re.search(r"matches\('(.+)'\)", name_rule).group(1)  # type: ignore[union-attr]
    for nodes, gpus in ((1, None), (16, "0-7")):
        inv, plan = one_liner(nodes, gpus)
        _, doc = export("TrainJob", inv, plan)
        name = doc["metadata"]["name"]
        assert re.fullmatch(pattern, name) and len(name) <= 63
        assert doc["spec"]["trainer"]["numProcPerNode"] >= 1


# -- what they carry -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(EXPORTS))
def test_script_arguments_arrive_as_typed_after_kubernetes_expands_them(kind: str) -> None:
    inv, plan = one_liner(2, "0-7", env=("PRICE=$(HOME) costs $5",))
    _, doc = export(kind, inv, plan)
    defined = {"HOME": "/root", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "29500"}
    for container in containers(kind, doc):
        assert [k8s_expand(a, defined) for a in container["args"]] == [TRAIN, *ARGS]
        env = {e["name"]: k8s_expand(e["value"], defined) for e in container["env"]}
        assert env["PRICE"] == "$(HOME) costs $5"
    if kind == "PyTorchJob":
        command = [k8s_expand(c, defined) for c in containers(kind, doc)[0]["command"]]
        assert command == ["torchrun", "--master-addr=job-master-0", "--master-port=29500"]


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_device_names_and_per_node_values_are_left_out_and_listed(kind: str) -> None:
    inv, plan = build_job(ROOT / "inventories" / "two-node-ethernet.yaml", TRAIN, (), module=False,
                          nproc_per_node=None, master_port=None, env=(), runs_dir=Path("runs"))
    text, doc = export(kind, inv, plan)
    validate(kind, doc)
    for container in containers(kind, doc):
        names = {e["name"] for e in container["env"]}
        assert names == {"NCCL_DEBUG"}  # the inventory's own env; what clusterrun derived from the hosts stays out
        assert not names & DEVICE_VARS
    joined = comments(text)
    assert "NCCL_SOCKET_IFNAME (gpu-a: =ens2f0, gpu-b: =enp65s0f0), GLOO_SOCKET_IFNAME (gpu-a: ens2f0, " \
           "gpu-b: enp65s0f0), NCCL_IB_DISABLE=1: derived by clusterrun from the SSH inventory's hosts" in joined
    assert "CUDA_VISIBLE_DEVICES" in joined and "--hang-timeout" in joined and "data paths" in joined


def comments(text: str) -> str:
    """The document's comment header as one line (wrapped lines joined)."""
    return " ".join(line.lstrip("# -") for line in text.splitlines() if line.startswith("#"))


#: What clusterrun's rules derive from the hosts' NICs and HCAs, by inventory: true on those hosts, not in pods.
HOST_SETTINGS = {
    "two-node-ethernet.yaml": {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE"},
    "four-node-infiniband.yaml": {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"},
}


@pytest.mark.parametrize("kind", list(EXPORTS))
@pytest.mark.parametrize("inventory", list(HOST_SETTINGS))
def test_settings_derived_from_the_hosts_stay_out_of_the_pods_and_the_comment_says_how_to_set_them(
        kind: str, inventory: str) -> None:
    inv, plan = build_job(ROOT / "inventories" / inventory, TRAIN, (), module=False, nproc_per_node=None,
                          master_port=None, env=(), runs_dir=Path("runs"))
    derived = HOST_SETTINGS[inventory]
    # `up` sets them on every node: the hosts have these NICs and HCAs
    assert all(derived <= set(node.env_dict()) for node in plan.nodes)
    text, doc = export(kind, inv, plan)
    validate(kind, doc)
    for container in containers(kind, doc):
        names = {e["name"] for e in container.get("env", [])}
        assert not names & {"NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME"}
    joined = comments(text)
    first = plan.nodes[0].env_dict()
    for name in derived:  # named with the hosts' value, why it is left out, and how to find the pods' own
        value = first[name]
        assert f"{name}={value}" in joined or f"{name} ({plan.nodes[0].name}: {value}," in joined
        assert f"{name} for the pods: " in joined
    assert "derived by clusterrun from the SSH inventory's hosts (their NICs and HCAs), and the pods' network " \
           "and HCAs are others" in joined
    assert ("NCCL_IB_DISABLE=1 from hosts without RDMA would make NCCL use TCP on an InfiniBand cluster" in joined) \
        is ("NCCL_IB_DISABLE" in derived)
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1" in joined or "NCCL_IB_HCA" not in derived


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_the_users_own_nccl_settings_still_go_into_the_pods(kind: str) -> None:
    # --env overrides the rule's NCCL_IB_DISABLE=1: the user's value is meant for wherever the job runs
    inv, plan = build_job(ROOT / "inventories" / "two-node-ethernet.yaml", TRAIN, (), module=False,
                          nproc_per_node=None, master_port=None, runs_dir=Path("runs"),
                          env=("NCCL_IB_DISABLE=0", "NCCL_NET_GDR_LEVEL=PHB"))
    text, doc = export(kind, inv, plan)
    validate(kind, doc)
    for container in containers(kind, doc):
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB"}
    joined = comments(text)
    assert "NCCL_IB_DISABLE=1" not in joined and "NCCL_IB_DISABLE for the pods" not in joined
    assert "NCCL_SOCKET_IFNAME (gpu-a: =ens2f0" in joined  # the rules' other settings are still left out


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_secrets_are_named_in_a_comment_and_never_written(kind: str) -> None:
    inv, plan = one_liner(2, None, env=(f"HF_TOKEN={SECRET}", f"WANDB_API_KEY={SECRET}"))
    text, doc = export(kind, inv, plan)
    assert SECRET not in text
    assert "secretKeyRef" not in yaml.safe_dump(doc)  # no reference to a Secret that does not exist yet
    for container in containers(kind, doc):
        assert not {e["name"] for e in container.get("env", [])} & {"HF_TOKEN", "WANDB_API_KEY"}
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        assert re.search(rf"^# - {name} holds a secret and is not written: create a Secret", text, re.MULTILINE)


def test_spare_nodes_and_run_settings_are_listed_as_not_carried_over() -> None:
    inv = parse_inventory_text("""version: 1
run: {hang_timeout: 600, max_restarts: 2}
network: {data: 10.0.0.0/24}
nodes:
  - {name: a, host: a, gpus: 4, nics: [{name: eth1, ip: 10.0.0.1/24}]}
  - {name: b, host: b, gpus: 4, nics: [{name: eth1, ip: 10.0.0.2/24}]}
  - {name: c, host: c, gpus: 4, spare: true, nics: [{name: eth1, ip: 10.0.0.3/24}]}
""", "spares.yaml")
    plan = build_plan(inv, JobSpec(script="train.py", run_id="20261124-101500-a1b2"))
    text, doc = export("PyTorchJob", inv, plan)
    assert doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1  # the spare runs nothing
    comments = " ".join(line.lstrip("# -") for line in text.splitlines() if line.startswith("#"))
    assert "spare nodes (c)" in comments
    assert "run.hang_timeout: 600" in comments and "run.max_restarts: 2" in comments


def test_nodes_that_run_different_process_counts_cannot_share_a_pod_template() -> None:
    inv = parse_inventory_text("""version: 1
nodes:
  - {name: a, host: a, gpus: 8}
  - {name: b, host: b, gpus: 4}
""", "mixed.yaml")
    plan = build_plan(inv, JobSpec(script="train.py", run_id="r1"))
    with pytest.raises(PlanError, match=r"different numbers of processes \(a=8, b=4\).*--nproc-per-node"):
        pytorchjob(plan, inv, KubeOptions(image=IMAGE))


# -- names and options ----------------------------------------------------------------------------------------------

def test_default_name_comes_from_the_script_and_the_run_id() -> None:
    inv, plan = one_liner(2, None)
    _, doc = export("TrainJob", inv, plan)
    assert doc["metadata"]["name"] == f"train-ddp-{plan.run_id}"


@pytest.mark.parametrize(("options", "message"), [
    ({"image": None}, "--image is required"),
    ({"image": ""}, "--image is required"),
    ({"image": "a b"}, "--image 'a b'"),
    ({"name": "Train_LLM"}, "lower-case letters"),
    ({"name": "9lives"}, "starting with a letter"),
    ({"name": "x" * 60}, "the '-worker-0' the operator appends"),
    ({"namespace": "-ml"}, "--namespace"),
])
def test_invalid_options_are_usage_errors_naming_the_flag(options: dict[str, Any], message: str) -> None:
    inv, plan = one_liner(2, None)
    with pytest.raises(UsageError, match=re.escape(message)):
        export("PyTorchJob", inv, plan, **options)


def test_documents_are_plain_yaml_without_aliases() -> None:
    # Two replicas built from one object would be dumped as &id001/*id001, which many tools refuse to edit.
    inv, plan = one_liner(16, "0-7")
    text, doc = export("PyTorchJob", inv, plan)
    assert "&id" not in text and "*id" not in text
    master, worker = (copy.deepcopy(r["template"]) for r in doc["spec"]["pytorchReplicaSpecs"].values())
    assert master == worker


@pytest.mark.parametrize(("script", "module", "start"), [
    ("examples/train_ddp.py", False, "train-ddp-"),
    ("9lives.py", False, "job-9lives-"),
    ("mypkg.train_v2", True, "mypkg-train-v2-"),
    ("/x/" + "very_long_name_" * 8 + ".py", False, "very-long-name-"),
    ("___.py", False, "job-"),
])
def test_derived_names_are_valid_for_any_script(script: str, module: bool, start: str) -> None:
    inv = parse_inventory_text("version: 1\nnodes:\n  - {name: a, host: a}\n", "one.yaml")
    plan = build_plan(inv, JobSpec(script=script, run_id="20261124-101500-a1b2", module=module))
    for kind in EXPORTS:
        _, doc = export(kind, inv, plan)
        name = doc["metadata"]["name"]
        assert name.startswith(start) and name.endswith("-20261124-101500-a1b2")
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_a_script_path_with_a_line_break_cannot_escape_the_comments(kind: str) -> None:
    inv = parse_inventory_text("version: 1\nnodes:\n  - {name: a, host: a}\n", "one.yaml")
    script = "odd\nkind: Secret\n.py"
    plan = build_plan(inv, JobSpec(script=script, run_id="r1"))
    text, doc = export(kind, inv, plan)
    header = text[:text.index("apiVersion:")].splitlines()
    assert header and all(line.startswith("#") for line in header)
    assert doc["kind"] == kind
    assert containers(kind, doc)[0]["args"][0] == script
