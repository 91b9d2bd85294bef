"""A history plot: power, temperature, GPU load and inference rate on one time axis (matplotlib, lazily)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path

from edged.errors import TelemetryError
from edged.telemetry._query import Point, TelemetryReader

_PANELS = (
    ("power_in_mw", "power_mw:%", "Power (mW)"),
    (None, "temp_c:%", "Temperature (°C)"),
    ("gpu_load_pct", None, "GPU load (%)"),
    (None, "model:%", "Inferences/s"),
)


def _by_series(points: list[Point]) -> dict[str, tuple[list[datetime], list[float]]]:
    out: dict[str, tuple[list[datetime], list[float]]] = defaultdict(lambda: ([], []))
    for p in points:
        xs, ys = out[p.series]
        xs.append(datetime.fromtimestamp(p.t))
        ys.append(p.mean)
    return out


def plot_history(reader: TelemetryReader, since_s: float, out_path: str) -> int:
    """Draw the four panels into ``out_path``; return how many points were drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise TelemetryError("plotting needs matplotlib: pip install 'edged[plot]'") from e
    fig, axes = plt.subplots(len(_PANELS), 1, sharex=True, figsize=(11, 9))
    drawn = 0
    table = "raw" if since_s <= 3 * 3600 else reader.rollup_for(since_s)  # longer: 1-minute or 1-hour means
    for ax, (main, pattern, title) in zip(axes, _PANELS, strict=True):
        series: dict[str, tuple[list[datetime], list[float]]] = {}
        if main is not None:
            series.update(_by_series(reader.points(since_s, main, table)))
        if pattern is not None:
            series.update(_by_series(reader.points(since_s, pattern, table)))
        for name, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, linewidth=0.9, label=name.split(":", 1)[-1])
            drawn += len(xs)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(loc="upper left", fontsize="x-small", ncol=4)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    axes[-1].set_xlabel("time")
    window = f"{since_s / 3600:g} h" if since_s >= 3600 else f"{since_s / 60:g} min"
    fig.suptitle(f"edged telemetry, last {window}")
    fig.autofmt_xdate()
    fig.tight_layout()
    try:
        # The format its extension names (.svg, .pdf), else PNG written to the file named, not NAME.png beside it
        suffix = Path(out_path).suffix.lstrip(".").lower()
        fig.savefig(out_path, dpi=100, format=suffix if suffix in fig.canvas.get_supported_filetypes() else "png")
    except OSError as e:
        raise TelemetryError(output_error(out_path, e)) from e
    finally:
        plt.close(fig)
    return drawn


def output_error(path: str, error: OSError) -> str:
    """What ``-o PATH`` could not do, and what to do instead."""
    return (f"-o {path}: cannot write there ({error.strerror or error}); name a file in a folder that exists "
            "and that you may write")
