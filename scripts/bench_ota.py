"""OTA model update benchmark: a ~50 MB ONNX bundle through nginx into a real `edged serve`.

Measures, in one run, side by side: the update time of the bundle (`edged ota check` round trip: TUF refresh,
download, verification, private staging with test vectors, switch), the p99 of inference before and during the
switch from a client hammering the daemon, the daemon's peak RSS while staging (VmHWM, reset before the check),
and the bytes fetched again after a download cut at 50 % (nginx access log).

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_ota.py [--hidden 170000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edged.ota._fetcher import ResumableFetcher  # noqa: E402
from edged.ota.fleet import FleetRepository  # noqa: E402
from tests.integration.edged_daemon import proc_status_kib, start_daemon  # noqa: E402
from tests.ota.conftest import MODEL, Nginx, model_folder, vectors_for  # noqa: E402


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def hammer(client: object, stop: threading.Event, out: list[tuple[float, float, str]], errors: list[str]) -> None:
    x = np.ones((1, 64), np.float32)
    while not stop.is_set():
        began = time.perf_counter()
        try:
            version = client.infer(MODEL, {"input": x}).model_version  # type: ignore[attr-defined]
        except Exception as e:  # counted: the benchmark reports failed requests
            errors.append(str(e))
            continue
        out.append((began, time.perf_counter() - began, version))


def cut_and_resume(fleet: FleetRepository, nginx: Nginx, name: str, work: Path) -> dict[str, int]:
    info = fleet.targets()[name]
    url = f"{nginx.url}/targets/models/{MODEL}/{info['sha256']}.2.tar"
    fetcher = ResumableFetcher(work / "partial", f"{nginx.url}/targets/")
    got = 0
    for chunk in fetcher.fetch(url):  # cut at half: the generator is abandoned, the partial stays
        got += len(chunk)
        if got >= info["length"] // 2:
            break
    first = fetcher.progress.fetched_bytes
    for _ in fetcher.fetch(url):
        pass
    return {"length": int(info["length"]), "before_cut": first, "after_cut": fetcher.progress.fetched_bytes - first}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=170_000, help="hidden width: 170000 makes a 50 MB ONNX")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        FleetRepository.init(tmp / "fleet")
        fleet = FleetRepository(tmp / "fleet")
        nginx = Nginx(fleet.path, tmp / "nginx")
        models = tmp / "models"
        model_folder(models, 1, seed=1, hidden=args.hidden)
        source = model_folder(tmp / "src", 2, seed=2, hidden=args.hidden)
        name = fleet.add_model(source, 2, vectors_for(2, hidden=args.hidden))
        config = (f'[telemetry]\nsource = "off"\n[models]\nrepository = "{models}"\n[ota]\nenabled = true\n'
                  f'repository_url = "{nginx.url}"\nroot_file = "{fleet.metadata_dir}/1.root.json"\n'
                  'check_interval_s = 86400\njitter_s = 86400\nwatch_s = 0\nmin_requests = 0\n')
        daemon = start_daemon(tmp / "daemon", config=config)
        try:
            samples: list[tuple[float, float, str]] = []
            errors: list[str] = []
            stop = threading.Event()
            worker = threading.Thread(target=hammer, args=(daemon.client(), stop, samples, errors))
            worker.start()
            time.sleep(5)  # the "before" window
            rss_before = proc_status_kib(daemon.pid, "VmRSS")
            Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            switch_began = time.perf_counter()
            status = daemon.client(timeout_s=600).ota("check")
            switch_ended = time.perf_counter()
            peak = proc_status_kib(daemon.pid, "VmHWM")
            time.sleep(2)
            stop.set()
            worker.join()
        finally:
            daemon.stop()
        cut = cut_and_resume(fleet, nginx, name, tmp)
        nginx.stop()
    before = [lat for began, lat, _ in samples if began < switch_began]
    during = [lat for began, lat, _ in samples if switch_began <= began <= switch_ended]
    result = {
        "bundle_bytes": cut["length"], "state": status["state"], "update_s": round(switch_ended - switch_began, 2),
        "p99_before_ms": round(p99(before) * 1e3, 2), "p99_during_ms": round(p99(during) * 1e3, 2),
        "p99_ratio": round(p99(during) / p99(before), 2), "requests_before": len(before),
        "requests_during": len(during), "failed_requests": len(errors),
        "versions_seen": sorted({v for _, _, v in samples}),
        "rss_before_mib": round(rss_before / 1024, 1), "peak_rss_staging_mib": round(peak / 1024, 1),
        "refetched_after_50pct_cut_bytes": cut["after_cut"], "fetched_before_cut_bytes": cut["before_cut"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
