"""A replay file that cannot give a sample (garbage only, comments only, missing, not UTF-8) is reported, never
spun on: the sampler is degraded naming the file, and the service stops at once."""

from __future__ import annotations

import threading
import time

import pytest
from telemetry_data import recorded_lines

from edged.clock import ManualClock
from edged.config import TelemetryConfig
from edged.supervision import HealthBoard
from edged.telemetry import TelemetryService
from edged.telemetry._replay import ReplaySource

WAIT_S = 20.0


def _wait(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _stops(service: TelemetryService) -> bool:
    """Whether stop() returns within WAIT_S (it hung for good behind a sampler spinning on the file)."""
    stopper = threading.Thread(target=service.stop, daemon=True)
    stopper.start()
    stopper.join(WAIT_S)
    return not stopper.is_alive()


@pytest.mark.parametrize("content, found", [
    ("garbage\nmore garbage\nRAM lots\n", "all 3 of its lines were refused"),
    ("# a header and nothing else\n\n", "no line but blanks and comments"),
])
@pytest.mark.parametrize("loop", [True, False])
def test_a_replay_without_a_usable_line_degrades_the_sampler_naming_the_file(tmp_path, content, found, loop):
    path = tmp_path / "capture.log"
    path.write_text(content)
    board = HealthBoard()
    config = TelemetryConfig(source="replay", replay_file=str(path), replay_loop=loop, replay_speed=1e6)
    service = TelemetryService(config, str(tmp_path / "t.db"), health=board, clock=ManualClock())
    service.start()
    try:
        sampler = board.component("telemetry_sampler")
        _wait(lambda: sampler.health.state == "degraded", "the sampler to report the file")
        assert str(path) in sampler.health.reason and found in sampler.health.reason
        assert "replay_file" in sampler.health.reason  # what to do
        assert not service.wait_samples(1, WAIT_S)  # the source ended: no wait for a sample that never comes
    finally:
        assert _stops(service), "stop() hung: the sampler spins on the file"


def test_a_missing_replay_file_degrades_the_sampler_and_start_returns(tmp_path):
    path = tmp_path / "nowhere.log"
    board = HealthBoard()
    config = TelemetryConfig(source="replay", replay_file=str(path))
    service = TelemetryService(config, str(tmp_path / "t.db"), health=board, clock=ManualClock())
    service.start()  # raised, and stopped the daemon's start
    try:
        sampler = board.component("telemetry_sampler").health
        assert sampler.state == "degraded" and str(path) in sampler.reason
        assert "No such file" in sampler.reason
    finally:
        service.stop()


def test_a_replay_line_with_bytes_that_are_not_utf8_is_refused_alone(tmp_path):
    good = recorded_lines("orin_nano_jp6.log")[:2]
    path = tmp_path / "capture.log"
    path.write_bytes(good[0].encode() + b"\n\xff\xfe garbage \xc3\n" + good[1].encode() + b"\n")
    source = ReplaySource(str(path), speed=1e6)  # raised UnicodeDecodeError for the whole file
    stop = threading.Event()
    samples = [source.next_sample(stop), source.next_sample(stop)]
    assert all(s is not None for s in samples) and source.next_sample(stop) is None
    assert source.bad_lines == 1


def _stamped(times: list[float]) -> str:
    """tegrastats lines stamped to the second (MM-DD-YYYY HH:MM:SS), as --interval prints them."""
    return "".join(f"12-05-2026 06:{int(t) // 60:02d}:{int(t) % 60:02d} RAM 3000/7620MB CPU [5%@1510,7%@1510] "
                   "GR3D_FREQ 3%@[306,306] tj@48.5C VDD_IN 4000mW/4000mW\n" for t in times)


@pytest.mark.parametrize("interval_ms", [500, 250, 1000, 2000])
def test_a_recording_replays_at_the_interval_it_was_taken(tmp_path, interval_ms):
    """Stamps have whole seconds: lines of `tegrastats --interval 500` share theirs in pairs, and each pair
    replayed 1 s apart per line (twice the recording's length, twice its energy)."""
    step = interval_ms / 1000
    times = [600.1 + i * step for i in range(41)]
    path = tmp_path / "capture.log"
    path.write_text(_stamped(times))
    source = ReplaySource(str(path), speed=1e9, interval_s=1.0)
    stop = threading.Event()
    samples = [source.next_sample(stop) for _ in times]
    assert source.next_sample(stop) is None
    span = samples[-1].elapsed - samples[0].elapsed
    assert span == pytest.approx(times[-1] - times[0], abs=1.0)


def test_a_capture_saved_with_a_byte_order_mark_keeps_its_first_line(tmp_path):
    """A capture edited on Windows starts with U+FEFF: glued to 'RAM', the first line was refused as garbage."""
    path = tmp_path / "capture.log"
    path.write_bytes(b"\xef\xbb\xbf" + _stamped([600.0, 601.0]).encode())
    source = ReplaySource(str(path), speed=1e9)
    stop = threading.Event()
    first = source.next_sample(stop)
    assert first is not None and first.timestamp == "12-05-2026 06:10:00" and first.unparsed == ()
    assert source.next_sample(stop) is not None and source.bad_lines == 0
