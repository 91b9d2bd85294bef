"""The tegrastats parser on real recorded lines from TX1 (L4T 28) to Thor (JP7), values checked by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from telemetry_data import recorded_lines

from edged.errors import TelemetryParseError
from edged.telemetry import Rail, parse_tegrastats

CONTRACT_KEYS = {"timestamp", "ram_used_mb", "ram_total_mb", "swap_used_mb", "swap_total_mb", "cpu",
                 "gpu_load_pct", "gpu_freq_mhz", "emc_load_pct", "emc_freq_mhz", "temps_c", "power_mw",
                 "engines", "unparsed"}


def line_of(fixture: str, index: int) -> dict:
    return parse_tegrastats(recorded_lines(fixture)[index]).to_json()


def test_every_recorded_line_parses_completely_with_the_contract_keys():
    lines = recorded_lines()
    assert len(lines) >= 24
    for line in lines:
        record = parse_tegrastats(line).to_json()
        assert CONTRACT_KEYS <= set(record) <= CONTRACT_KEYS | {"gpu_gpc_freq_mhz"}, line
        assert record["unparsed"] == [], line
        assert record["ram_used_mb"] > 0 and record["ram_total_mb"] >= record["ram_used_mb"]


def test_tx1_old_cpu_form_shares_one_frequency_and_reads_emc_gr3d_without_freq_suffix():
    r = line_of("tx1_l4t28.log", 1)
    assert r["cpu"] == [{"load_pct": 17, "freq_mhz": 1734}, {"load_pct": 11, "freq_mhz": 1734},
                        {"load_pct": 65, "freq_mhz": 1734}, {"load_pct": 0, "freq_mhz": 1734}]
    assert (r["emc_load_pct"], r["emc_freq_mhz"], r["gpu_load_pct"], r["gpu_freq_mhz"]) == (1, 1600, 39, 76)
    assert (r["swap_used_mb"], r["swap_total_mb"]) == (873, 8192)
    assert r["engines"]["APE"] == {"on": True, "load_pct": None, "freq_mhz": 25}


def test_nano_jp4_bare_rails_iram_and_lowercase_sensor():
    r = line_of("nano_jp4.log", 1)
    assert r["power_mw"] == {"POM_5V_IN": {"now": 2247, "avg": 2189}, "POM_5V_GPU": {"now": 78, "avg": 78},
                             "POM_5V_CPU": {"now": 275, "avg": 275}}
    assert r["temps_c"]["iwlwifi"] == 44.0 and r["temps_c"]["thermal"] == 38.0
    assert r["gpu_load_pct"] == 16 and r["gpu_freq_mhz"] == 76
    assert r["ram_used_mb"] == 1655 and r["ram_total_mb"] == 3956


def test_off_cores_are_null_in_printed_order():
    r = line_of("orin_nano_jp6.log", 3)
    assert [c["load_pct"] for c in r["cpu"]] == [1, None, 3, 4, 5, 6]
    assert r["cpu"][1] == {"load_pct": None, "freq_mhz": None}


def test_minus_256_sentinels_are_left_out_of_temperatures():
    r = line_of("agx_orin_jp5.log", 0)
    assert r["temps_c"] == {"CPU": 42.593, "Tboard": 32.0, "SOC2": 39.343, "Tdiode": 33.25, "SOC0": 39.375,
                            "tj": 42.593, "SOC1": 40.468}


def test_agx_orin_jp5_gr3d2_nc_rails_and_timestamp():
    r = line_of("agx_orin_jp5.log", 1)
    assert r["timestamp"] == "10-16-2023 10:59:22"
    assert r["engines"]["GR3D2_FREQ"] == {"on": True, "load_pct": 0, "freq_mhz": 114}
    assert r["engines"]["NVJPG1"]["freq_mhz"] == 729
    assert r["power_mw"]["NC"] == {"now": 0, "avg": 0}
    assert r["power_mw"]["VDDQ_VDD2_1V8AO"] == {"now": 707, "avg": 707}
    assert len(r["cpu"]) == 12 and r["cpu"][5] == {"load_pct": 0, "freq_mhz": 730}


def test_per_gpc_list_kept_and_common_value_reported():
    r = line_of("orin_jp7.log", 0)
    assert r["gpu_gpc_freq_mhz"] == [1300, 1300] and r["gpu_freq_mhz"] == 1300 and r["gpu_load_pct"] == 12
    thor = line_of("thor_jp7.log", 0)
    assert thor["gpu_load_pct"] is None and thor["gpu_gpc_freq_mhz"] == [1000, 1000, 1000]
    unequal = parse_tegrastats("RAM 10/20MB GR3D_FREQ 5%@[300,612]").to_json()
    assert unequal["gpu_freq_mhz"] == 612 and unequal["gpu_gpc_freq_mhz"] == [300, 612]


def test_r39_cur_max_temperatures_and_three_value_rails():
    r = line_of("orin_jp7.log", 0)
    assert r["temps_c"]["cpu"] == 52.968 and r["temps_c"]["gpu"] == 47.625
    assert r["power_mw"]["VIN_SYS_5V0"] == {"now": 5500, "avg": 5500}
    assert r["swap_used_mb"] is None
    assert r["engines"]["NVENC0"] == {"on": False, "load_pct": None, "freq_mhz": None}
    assert r["engines"]["PVA0_FREQ"]["on"] is False


def test_kb_block_sizes_and_kb_ram_convert_to_mb():
    assert line_of("thor_jp7.log", 0)["ram_used_mb"] == 4722
    r = parse_tegrastats("RAM 2097152/4194304kB (lfb 1x512kB)").to_json()
    assert (r["ram_used_mb"], r["ram_total_mb"]) == (2048, 4096)


def test_xavier_engines_off_in_capitals_mts_and_vic_load():
    r = line_of("xavier_jp4.log", 1)
    assert r["engines"]["NVDLA0"]["on"] is False and r["engines"]["MSENC"]["on"] is False
    assert r["engines"]["VIC"] == {"on": True, "load_pct": 0, "freq_mhz": 115}
    assert r["engines"]["MTS"] == {"on": True, "load_pct": None, "freq_mhz": None, "fg_pct": 0, "bg_pct": 0}
    assert r["power_mw"]["VDD_IN"] == {"now": 5336, "avg": 4970}


def test_emc_with_frequency_and_no_load():
    r = line_of("thor_jp7.log", 1)
    assert (r["emc_load_pct"], r["emc_freq_mhz"]) == (None, 2133)


def test_mixed_mw_suffix_in_one_rail_pair():
    r = line_of("orin_nano_jp6.log", 0)
    assert r["power_mw"]["VDD_CPU_GPU_CV"] == {"now": 598, "avg": 598}
    assert r["emc_load_pct"] is None and r["gpu_load_pct"] == 1 and r["gpu_freq_mhz"] is None


def test_unknown_tokens_are_kept_not_fatal():
    r = parse_tegrastats("RAM 250/490MB (lfb 17x1MB) Carveout 12/12MB | DFS(%@MHz): cpu [61%,45%]@835").to_json()
    assert r["cpu"] == [{"load_pct": 61, "freq_mhz": 835}, {"load_pct": 45, "freq_mhz": 835}]
    assert "Carveout" in r["unparsed"] and "DFS(%@MHz):" in r["unparsed"]


@pytest.mark.parametrize("line", ["", "hello world", "CPU [1%@100] GR3D_FREQ 3%", "# comment RAM"])
def test_a_line_without_ram_is_not_tegrastats(line):
    with pytest.raises(TelemetryParseError):
        parse_tegrastats(line)


_TOKENS = [*recorded_lines("agx_orin_jp5.log")[0].split(), "@", "%", "[", "]", "x@C", "1/2/3", "off", "mW"]


@given(st.lists(st.sampled_from(_TOKENS), max_size=40))
def test_any_shuffle_of_real_tokens_parses_without_crashing(tokens):
    record = parse_tegrastats("RAM 1/2MB " + " ".join(tokens)).to_json()
    assert isinstance(record["ram_used_mb"], int)
    assert all(isinstance(t, str) and t for t in record["unparsed"])


def test_a_superscript_digit_in_a_cpu_field_is_an_unknown_value_not_a_value_error():
    """str.isdigit() accepts '²' and int() refuses it: the line raised ValueError, which nothing caught."""
    sample = parse_tegrastats("RAM 3000/7620MB CPU [1²%@729,5%@1²00] tj@50C")
    assert [(c.load_pct, c.freq_mhz) for c in sample.cpu] == [(None, 729), (5, None)]
    assert sample.temps_c == {"tj": 50.0}


# Lines written for edged (numbers ours) in the forms of real captures; docs/jetson.md §8 has the sources.
ORIN_NX_JP6_ENGINES = ("12-05-2026 06:10:00 RAM 6500/7620MB (lfb 5x1MB) SWAP 2000/16384MB (cached 100MB) "
                       "CPU [90%@1984,91%@1984,92%@1984,93%@1984,94%@1984,95%@247] EMC_FREQ 17%@3199 "
                       "GR3D_FREQ 80%@[713] NVENC 2%@115 NVDEC 41%@115 NVJPG off VIC 30%@115 PVA0_FREQ off "
                       "APE 174 cv0@63.5C cpu@65.5C gpu@63.5C tj@65.5C VDD_IN 17000mW/15000mW "
                       "VDD_CPU_GPU_CV 8000mW/7000mW VDD_SOC 3900mW/3500mW")
THOR_SINGLE_RAILS = ("RAM 110000/125772MB (lfb 9x4MB) CPU [0%@1890,4%@1890,2%@972,off] EMC_FREQ 1%@4266 "
                     "GR3D_FREQ @[1575,1575,1575] cpu@43.5C soc012@42.5C soc345@44C VDD_GPU 5500mW "
                     "VDD_CPU_SOC_MSS 7400mW VIN_SYS_5V0 6300mW VIN 28500mW")
TK1 = "RAM 500/1892MB (lfb 12x4MB) SWAP 0/0MB (cached 0MB) cpu [1%,0%,off,off]@204 EMC 5%@792 AVP 0%@80 " \
      "NVDEC 204 MSENC 204 GR3D 0%@72 EDP limit 2320"
DRIVE_BLANK_CORES = "RAM 3000/30000MB (lfb 10x4MB) CPU [7%,3%, , ]@2000 GR3D_FREQ 5%@[900,900]"


def test_engine_loads_and_the_current_average_pair_of_an_orin_nx_on_jetpack_6():
    r = parse_tegrastats(ORIN_NX_JP6_ENGINES).to_json()
    assert r["engines"]["NVENC"] == {"on": True, "load_pct": 2, "freq_mhz": 115}
    assert r["engines"]["NVDEC"]["load_pct"] == 41 and r["engines"]["VIC"]["load_pct"] == 30
    assert r["engines"]["NVJPG"]["on"] is False and r["engines"]["APE"]["freq_mhz"] == 174
    assert r["power_mw"]["VDD_IN"] == {"now": 17000, "avg": 15000}  # mW, current then average
    assert r["cpu"][5] == {"load_pct": 95, "freq_mhz": 247} and r["gpu_gpc_freq_mhz"] == [713]
    assert (r["swap_used_mb"], r["swap_total_mb"], r["unparsed"]) == (2000, 16384, [])


def test_thor_single_value_rails_and_its_vin_input_rail():
    from edged.telemetry._derived import input_power_mw

    sample = parse_tegrastats(THOR_SINGLE_RAILS)
    assert sample.power_mw["VDD_GPU"] == Rail(5500, None) and input_power_mw(sample) == 28500
    assert sample.temps_c == {"cpu": 43.5, "soc012": 42.5, "soc345": 44.0} and sample.unparsed == ()
    assert (sample.gpu_load_pct, sample.gpu_freq_mhz) == (None, 1575) and sample.cpu[3].load_pct is None


def test_tk1_engines_and_the_edp_limit_kept_as_unparsed():
    r = parse_tegrastats(TK1).to_json()
    assert r["engines"]["AVP"] == {"on": True, "load_pct": 0, "freq_mhz": 80}
    assert r["engines"]["MSENC"]["freq_mhz"] == 204 and (r["gpu_load_pct"], r["gpu_freq_mhz"]) == (0, 72)
    assert [c["freq_mhz"] for c in r["cpu"]] == [204, 204, None, None]
    assert r["unparsed"] == ["EDP", "limit", "2320"]  # not read, but not lost


def test_blank_cores_of_the_drive_form_are_cores_without_a_reading():
    r = parse_tegrastats(DRIVE_BLANK_CORES).to_json()
    assert r["cpu"] == [{"load_pct": 7, "freq_mhz": 2000}, {"load_pct": 3, "freq_mhz": 2000},
                        {"load_pct": None, "freq_mhz": None}, {"load_pct": None, "freq_mhz": None}]
