"""A device's compatibility facts come from the files `edged doctor` reads (module, L4T, JetPack), so a target
built for another JetPack or module is skipped with the reason, and one built for this device is taken."""

from __future__ import annotations

from pathlib import Path

from edged.ota._policy import device_facts, incompatibility

# The first line of /etc/nv_tegra_release on JetPack 6.2 (docs/jetson.md §2) and an Orin Nano's model string.
JP62 = ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
        "DATE: Wed Jan  8 01:49:37 UTC 2025\n")
ORIN_NANO = "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\0"


def _jetson(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text(JP62)
    (root / "proc" / "device-tree").mkdir(parents=True)
    (root / "proc" / "device-tree" / "model").write_text(ORIN_NANO)
    return root


def test_a_jetson_tree_gives_its_module_l4t_and_jetpack(tmp_path: Path) -> None:
    facts = device_facts(_jetson(tmp_path))
    assert facts.module == ORIN_NANO.rstrip("\0")
    assert (facts.l4t, facts.jetpack) == ("36.4.3", "6.2")


def test_targets_are_judged_against_the_device_it_runs_on(tmp_path: Path) -> None:
    facts = device_facts(_jetson(tmp_path))
    assert incompatibility({"jetpack": "6.1-6.2", "l4t": ">=36.4", "module": facts.module}, facts) == ""
    assert incompatibility({"jetpack": "5.1"}, facts) == "needs jetpack 5.1, this device has 6.2"
    assert "built for module" in incompatibility({"module": "NVIDIA Jetson AGX Orin"}, facts)


def test_a_machine_that_is_not_a_jetson_has_no_jetson_facts(tmp_path: Path) -> None:
    facts = device_facts(tmp_path)
    assert (facts.module, facts.l4t, facts.jetpack) == ("", "", "")
    assert incompatibility({"jetpack": "6.2"}, facts) == "needs jetpack 6.2, this device has none"
