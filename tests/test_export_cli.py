"""`clusterrun export ...` on the command line: the options of `plan`, its own flags, files, errors, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterrun.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TWO_NODE = str(ROOT / "inventories" / "two-node-ethernet.yaml")
TRAIN = str(ROOT / "examples" / "train_ddp.py")
IMAGE = "ghcr.io/acme/train:1.4"
KINDS = ("sbatch", "pytorchjob", "trainjob")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", KINDS)
def test_each_export_has_help_with_examples_and_no_plan_json_flag(capsys: pytest.CaptureFixture[str],
                                                                  kind: str) -> None:
    code, out, _ = cli(capsys, "export", kind, "--help")
    assert code == 0
    assert "Examples:" in out and f"clusterrun export {kind} " in out
    assert "--output" in out and "--nproc-per-node" in out and "--ips" in out
    assert "--json" not in out


def test_export_help_imports_nothing_heavy() -> None:
    probe = ("import sys; from clusterrun.cli.main import main; main(['export', 'sbatch', '--help']); "
             "heavy = [m for m in ('torch', 'paramiko', 'pydantic', 'rich', 'yaml') if m in sys.modules]; "
             "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_sbatch_from_a_one_liner_in_a_real_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "clusterrun", "export", "sbatch", "--time", "30", "--ips", "n1,n2", "--gpus", "0-3",
         "-e", "HF_TOKEN=hidden-value", TRAIN, "--epochs", "3", "--time", "9"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --time=30" in result.stdout and "#SBATCH --gpus-per-node=4" in result.stdout
    assert result.stdout.rstrip().endswith(f"{TRAIN} --epochs 3 --time 9")  # after SCRIPT: the script's
    assert "hidden-value" not in result.stdout
    (tmp_path / "job.sbatch").write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_kubernetes_export_to_a_file_is_not_replaced_without_force(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path, kind: str) -> None:
    target = tmp_path / "job.yaml"
    code, out, err = cli(capsys, "export", kind, "--image", IMAGE, "--name", "llm", "-o", str(target), TWO_NODE,
                         TRAIN)
    assert code == 0 and out == ""
    assert f"wrote {target}" in err and "kubectl apply -f" in err
    first = target.read_text()
    assert yaml.safe_load(first)["metadata"]["name"] == "llm"
    code, _, err = cli(capsys, "export", kind, "--image", "other:1", "-o", str(target), TWO_NODE, TRAIN)
    assert code == 2 and "the file exists" in err and target.read_text() == first
    code, _, _ = cli(capsys, "export", kind, "--image", "other:1", "--force", "-o", str(target), TWO_NODE, TRAIN)
    assert code == 0 and "other:1" in target.read_text()


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_kubernetes_export_without_image_is_a_usage_error(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    code, out, err = cli(capsys, "export", kind, TWO_NODE, TRAIN)
    assert code == 2 and out == ""
    assert "--image is required" in err


def test_plan_warnings_reach_stderr_not_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "export", "trainjob", "--image", IMAGE, "--ips", "a,b", TRAIN)
    assert code == 0
    assert "clusterrun: warning:" in err
    assert yaml.safe_load(out)["kind"] == "TrainJob"  # stdout holds the document alone


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_kubernetes_export_without_gpus_says_it_is_cpu_only_and_how_to_ask_for_gpus(
        capsys: pytest.CaptureFixture[str], kind: str) -> None:
    code, out, err = cli(capsys, "export", kind, "--image", IMAGE, "--ips", "a,b", TRAIN)
    assert code == 0
    said = [line for line in err.splitlines() if "CPU-only" in line]
    assert len(said) == 1 and "--gpus" in said[0] and "gpus:" in said[0]
    assert "nvidia.com/gpu" not in yaml.safe_load(out).__repr__()
    comment = " ".join(line.lstrip("# ") for line in out.splitlines() if line.startswith("#"))
    assert "CPU-only" in comment and "--gpus" in comment
    code, out, err = cli(capsys, "export", kind, "--image", IMAGE, "--ips", "a,b", "--gpus", "0-3", TRAIN)
    assert code == 0 and "CPU-only" not in err and "CPU-only" not in out and "nvidia.com/gpu: 4" in out


def test_bad_sbatch_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "export", "sbatch", "--partition", "a b", TWO_NODE, TRAIN)
    assert code == 2 and "--partition 'a b'" in err


def _documented_exports() -> list[pytest.param]:
    """Every `clusterrun export KIND ...` command line of docs/growing.md and of the commands' own examples."""
    import shlex

    found = []
    for path in (ROOT / "docs" / "growing.md", ROOT / "clusterrun" / "cli" / "export_cmd.py"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            at = line.find("clusterrun export ")
            if at < 0:
                continue
            text = line[at:].split("  #")[0].split("`")[0].split(" > ")[0].rstrip(" \\")
            words = shlex.split(text)
            if len(words) > 3:
                found.append(pytest.param(words, id=f"{path.name}:{number}"))
    return found


@pytest.mark.parametrize("words", _documented_exports())
def test_documented_exports_give_clusterrun_its_options_before_script(words: list[str]) -> None:
    """After SCRIPT everything is the script's: `train.py -o job.yaml` would hand -o to the script."""
    from clusterrun.cli.export_cmd import export
    from clusterrun.cli.job_argv import _options, split

    command = export.commands[words[2]]
    ours, _positionals, script_args, _explicit = split(command, words[3:], ("--ips", "--hostfile", "--slurm"))
    assert ours, "an example shows at least one of clusterrun's options"
    table = _options(command)
    misplaced = [w for w in script_args if w.split("=")[0] in table and w != "--epochs"]
    assert not misplaced, f"{' '.join(words)}: {misplaced} would go to the script"
