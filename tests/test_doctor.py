"""`verl-deploy doctor` run in-process against recorded NVML readings: findings, exit codes, the JSON schema."""

import json
import subprocess
import sys
import threading

import pytest
from conftest import FIXTURES, REPO
from typer.testing import CliRunner

from verl_deploy.cli import app
from verl_deploy import host_facts
from verl_deploy.doctor.core import Context, Finding, exit_code, run_checks

READINGS = FIXTURES / "nvml"
FINDING_KEYS = {"area", "name", "status", "message", "remedy"}


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch, tmp_path):
    """No kubeconfig unless a test writes one; HOME points at an empty folder."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("VERL_DEPLOY_NVML_READING", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def doctor(*args, env=None):
    """Run doctor --json; return (exit code, document)."""
    result = CliRunner().invoke(app, ["doctor", "--json", *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def replay(name, *args):
    return doctor("--nvml-reading", str(READINGS / f"{name}.json"), *args)


def nvidia(document):
    return {f["name"]: f for f in document["findings"] if f["area"] == "nvidia"}


def assert_consistent(code, document):
    """The exit code, `ok` and the summary all follow from the findings."""
    fails = [f for f in document["findings"] if f["status"] == "fail"]
    assert code == (1 if fails else 0)
    assert document["ok"] is (not fails)
    assert document["summary"] == {s: sum(f["status"] == s for f in document["findings"]) for s in ("ok", "warn", "fail", "skip")}


def test_json_follows_the_documented_schema():
    code, document = replay("h200")
    assert set(document) == {"schema_version", "verl_deploy_version", "ok", "summary", "recommended_variant", "findings"}
    assert document["schema_version"] == 1
    assert [f["area"] for f in document["findings"]] == sorted(
        (f["area"] for f in document["findings"]), key=["host", "nvidia", "pytorch", "docker", "kubernetes"].index
    )
    for finding in document["findings"]:
        assert set(finding) == FINDING_KEYS
        assert finding["status"] in ("ok", "warn", "fail", "skip")
        assert finding["message"] and "\n" not in finding["message"]
        assert finding["status"] == "ok" or finding["remedy"], finding
    assert_consistent(code, document)


def test_h200_on_580_is_ready_for_cuda_13():
    code, document = replay("h200")
    found = nvidia(document)
    assert found["driver"]["status"] == "ok" and found["driver"]["message"] == "driver 580.159.04, CUDA up to 13.0"
    assert found["gpu 0"]["status"] == "ok"
    assert "NVIDIA H200, 140.4 GiB" in found["gpu 0"]["message"] and "CC 9.0, MIG off, ECC on" in found["gpu 0"]["message"]
    assert all(found[f"variant {v}"]["status"] == "ok" for v in ("cpu", "cu128", "cu130"))
    assert document["recommended_variant"] == "cu130"
    assert not [f for f in found.values() if f["status"] == "fail"]
    assert_consistent(code, document)


def test_driver_470_fails_the_floor_and_says_what_to_install():
    code, document = replay("v100-470")
    found = nvidia(document)
    assert found["driver"]["status"] == "fail" and "CUDA up to 11.4" in found["driver"]["message"]
    assert ">= 525.60.13" in found["driver"]["remedy"]
    assert found["best variant"]["status"] == "fail"
    assert found["best variant"]["remedy"] == "upgrade the NVIDIA driver to >= 525.60.13"
    assert code == 1 and document["recommended_variant"] == "cpu"


def test_driver_535_runs_cuda_12_variants_and_explains_cuda_13():
    code, document = replay("a100-535")
    found = nvidia(document)
    assert found["driver"]["message"] == "driver 535.183.01, CUDA up to 12.2"
    assert len([name for name in found if name.startswith("gpu ")]) == 8
    assert found["variant cu130"]["status"] == "skip" and "older than 580.65.06" in found["variant cu130"]["message"]
    assert document["recommended_variant"] == "cu128"
    assert_consistent(code, document)


def test_driver_550_with_ada_gpus_picks_cuda_12_8():
    code, document = replay("l4-550")
    found = nvidia(document)
    assert found["driver"]["message"] == "driver 550.127.05, CUDA up to 12.4"
    assert "CC 8.9" in found["gpu 0"]["message"] and "MIG n/a" in found["gpu 0"]["message"]
    assert document["recommended_variant"] == "cu128"
    assert_consistent(code, document)


def test_driver_570_with_consumer_blackwell_picks_cuda_12_8():
    code, document = replay("rtx5090-570")
    found = nvidia(document)
    assert found["driver"]["message"] == "driver 570.133.07, CUDA up to 12.8"
    assert "predates Blackwell" not in found["variant cu128"]["message"]
    assert "ECC n/a" in found["gpu 0"]["message"]
    assert document["recommended_variant"] == "cu128"
    assert_consistent(code, document)


def test_blackwell_on_550_fails_with_the_driver_that_fixes_it():
    code, document = replay("b200-550")
    found = nvidia(document)
    assert found["driver"]["status"] == "ok"  # above the floor, yet too old for this GPU
    assert "predates Blackwell" in found["variant cu128"]["message"]
    assert found["best variant"]["status"] == "fail"
    assert found["best variant"]["remedy"] == "upgrade the NVIDIA driver to >= 570.86.10"
    assert code == 1


def test_mig_and_ecc_off_and_busy_gpus_are_warnings():
    _, mig = replay("a100-mig-535")
    assert nvidia(mig)["gpu 0"]["status"] == "warn" and "MIG splits this GPU" in nvidia(mig)["gpu 0"]["message"]
    assert "-mig 0" in nvidia(mig)["gpu 0"]["remedy"]
    _, ecc = replay("h100-ecc-off-550")
    assert nvidia(ecc)["gpu 0"]["status"] == "warn" and "ECC is off" in nvidia(ecc)["gpu 0"]["message"]
    assert "1 processes" in nvidia(ecc)["gpu 0"]["message"]


def test_gpu_host_with_cpu_torch_is_told_which_build_to_install():
    _, document = replay("rtx5090-570")
    torch = next(f for f in document["findings"] if f["area"] == "pytorch")
    if "CPU-only build" in torch["message"]:  # the dev venv holds the CPU wheel
        assert torch["status"] == "warn" and torch["remedy"] == "install the CUDA 12.8 build from PyPI: pip install torch==2.10.0"


def test_no_gpu_is_not_an_error_and_says_how_to_get_gpu_mode():
    code, document = replay("no-driver")
    driver = nvidia(document)["driver"]
    assert driver["status"] == "skip" and "CPU mode works" in driver["message"]
    assert "NVIDIA driver (>= 525.60.13)" in driver["remedy"]
    assert document["recommended_variant"] == "cpu"
    assert_consistent(code, document)


def test_nvml_that_loads_but_fails_is_a_clear_fail():
    code, document = replay("init-failure")
    driver = nvidia(document)["driver"]
    assert driver["status"] == "fail"
    assert driver["message"] == "NVML is installed but fails: Driver/library version mismatch"
    assert "reboot" in driver["remedy"]
    assert code == 1


def test_this_hosts_live_reading_is_a_reading():
    reading = host_facts.read_nvml()  # no driver here: recorded as an error, never raised
    assert "error" in reading or reading["device_count"] == len(reading["devices"])


def test_reading_can_be_replayed_through_the_environment():
    _, document = doctor(env={"VERL_DEPLOY_NVML_READING": str(READINGS / "rtx5090-570.json")})
    assert document["recommended_variant"] == "cu128"


def test_a_file_that_is_not_a_reading_is_a_usage_error(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text("[1, 2]")
    result = CliRunner().invoke(app, ["doctor", "--nvml-reading", str(bogus)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "is not an NVML reading" in result.output and "Traceback" not in result.output


def test_unknown_flag_is_a_usage_error():
    result = CliRunner().invoke(app, ["doctor", "--bogus"])
    assert result.exit_code == 2
    assert "No such option" in result.output and "Traceback" not in result.output


def test_table_groups_findings_by_area_with_remedies():
    result = CliRunner().invoke(app, ["doctor", "--nvml-reading", str(READINGS / "v100-470.json")], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "verl-deploy doctor" in result.output
    assert "→ upgrade the NVIDIA driver to >= 525.60.13" in result.output
    assert "not ready: fix the fail lines" in result.output


def test_doctor_never_imports_torch():
    code = (
        "import sys; from typer.testing import CliRunner; from verl_deploy.cli import app;"
        "CliRunner().invoke(app, ['doctor', '--json']); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_a_check_that_crashes_or_hangs_becomes_a_fail_finding():
    def crashes(ctx):
        raise RuntimeError("boom")

    def hangs(ctx):
        threading.Event().wait()

    def fine(ctx):
        return [Finding("host", "fine", "ok", "fine")]

    findings = run_checks({"host": fine, "docker": crashes, "kubernetes": hangs}, Context(nvml={}), timeout_s=0.2)
    assert [(f.area, f.status) for f in findings] == [("host", "ok"), ("docker", "fail"), ("kubernetes", "fail")]
    assert "boom" in findings[1].message and "no answer within 0.2 s" in findings[2].message
    assert exit_code(findings) == 1 and exit_code(findings[:1]) == 0
