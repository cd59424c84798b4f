"""Compatibility facts, driven by NVML readings recorded on (or shaped like) real hosts."""

import json

import pytest
from conftest import FIXTURES

from verl_deploy import compat

READINGS = FIXTURES / "nvml"


def host(name):
    """(driver, compute capabilities) of a recorded reading."""
    reading = json.loads((READINGS / f"{name}.json").read_text())
    return reading["driver_version"], [f"{d['compute_capability'][0]}.{d['compute_capability'][1]}" for d in reading["devices"]]


def verdicts(name):
    return {v.variant.name: v for v in compat.check_variants(*host(name))}


def test_catalog_loads_as_typed_variants():
    catalog = compat.load_catalog()
    assert list(catalog)[0] == "cpu"
    cpu, cu128 = catalog["cpu"], catalog["cu128"]
    assert cpu.is_cpu and cpu.min_driver is None and cpu.compute_capabilities == ()
    assert cu128.cuda == "12.8" and "10.0" in cu128.compute_capabilities and not cu128.is_cpu
    assert all(isinstance(v, compat.Variant) for v in catalog.values())


@pytest.mark.parametrize(
    "driver, cuda",
    [
        ("470.256.02", "11.4"),
        ("520.61.05", "11.8"),
        ("525.60.13", "12.0"),
        ("535.183.01", "12.2"),
        ("550.90.07", "12.4"),
        ("570.133.07", "12.8"),
        ("580.159.04", "13.0"),
        ("595.45.04", "13.2"),
        ("440.33.01", None),
    ],
)
def test_max_cuda_for_a_driver(driver, cuda):
    assert compat.max_cuda(driver) == cuda


def test_nvml_cuda_integer_reads_as_major_minor():
    assert compat.cuda_from_nvml(13000) == "13.0"
    assert compat.cuda_from_nvml(12080) == "12.8"
    assert compat.cuda_from_nvml(11040) == "11.4"


def test_minor_version_compatibility_decides_which_cuda_a_driver_runs():
    assert compat.driver_runs_cuda("535.183.01", "12.8")  # 12.x family floor is 525.60.13
    assert not compat.driver_runs_cuda("520.61.05", "12.0")
    assert not compat.driver_runs_cuda("570.133.07", "13.0")
    assert compat.driver_runs_cuda("580.159.04", "13.0")


def test_h200_on_580_runs_every_variant_and_picks_cuda_13():
    assert all(v.runs for v in verdicts("h200").values())
    assert compat.choose_variant(*host("h200")).name == "cu130"


def test_volta_on_470_is_below_the_driver_floor():
    driver, _ = host("v100-470")
    assert not compat.meets_floor(driver)
    found = verdicts("v100-470")
    assert found["cpu"].runs
    assert "older than 525.60.13" in found["cu128"].reason and found["cu128"].needs_driver == "525.60.13"
    # CUDA 13 wheels dropped Volta: no driver upgrade fixes that.
    assert "compute capability 7.0 is not built into cu130" in found["cu130"].reason
    assert found["cu130"].needs_driver is None
    assert compat.choose_variant(*host("v100-470")).name == "cpu"


def test_ampere_on_535_runs_cuda_12_variants_but_not_13():
    found = verdicts("a100-535")
    assert found["cu128"].runs  # a 12.2 driver runs CUDA 12.8 code through minor-version compatibility
    assert not found["cu130"].runs and "older than 580.65.06" in found["cu130"].reason
    assert compat.choose_variant(*host("a100-535")).name == "cu128"


def test_ada_runs_wheels_built_for_an_older_minor_of_its_major():
    found = verdicts("l4-550")
    assert found["cu128"].runs  # 8.9 runs the 8.6 kernels
    assert compat.capability_supported("8.9", ("8.0", "8.6"))
    assert not compat.capability_supported("9.0", ("8.0", "8.6"))  # never across majors


def test_consumer_blackwell_on_570_needs_cuda_12_8():
    found = verdicts("rtx5090-570")
    assert found["cu128"].runs
    assert not found["cu130"].runs
    assert compat.choose_variant(*host("rtx5090-570")).name == "cu128"


def test_blackwell_on_a_driver_that_predates_it_runs_no_cuda_variant():
    found = verdicts("b200-550")
    assert "predates Blackwell" in found["cu128"].reason and found["cu128"].needs_driver == "570.86.10"
    assert found["cu130"].needs_driver == "580.65.06"
    assert compat.choose_variant(*host("b200-550")).name == "cpu"


def test_no_gpu_means_the_cpu_variant():
    assert compat.choose_variant(None, []).name == "cpu"
    found = {v.variant.name: v for v in compat.check_variants(None, [])}
    assert found["cpu"].runs and found["cu128"].reason == "no NVIDIA GPU on this host"


def test_a_variant_built_with_blackwell_kernels_but_old_cuda_is_refused(tmp_path):
    catalog = tmp_path / "variants.yaml"
    catalog.write_text(
        "variants:\n"
        "  cpu: {torch: '2.13.0', cuda: null, min_driver: null, compute_capabilities: []}\n"
        "  odd: {torch: '2.6.0', cuda: '12.4', min_driver: '525.60.13', compute_capabilities: ['9.0', '10.0']}\n"
    )
    odd = compat.load_catalog(catalog)["odd"]
    verdict = compat.check_variant(odd, "580.159.04", ["10.0"])
    assert not verdict.runs and "needs CUDA >= 12.8" in verdict.reason
