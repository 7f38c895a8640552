"""PNG plots of a benchmark run (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter, ScalarFormatter

from bench.capacity import CapacityRun
from bench.compare import SideRun

COLORS = {"vllm": "tab:blue", "chatpipe": "tab:orange", "vllm-same-args": "tab:green"}


def throughput(sides: list[SideRun], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for side in sides:
        xs = [lv.stats.concurrency for lv in side.levels]
        ys = [lv.stats.tokens_per_s for lv in side.levels]
        ax.plot(xs, ys, marker="o", label=side.name, color=COLORS.get(side.name))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("delivered tokens/s")
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency(sides: list[SideRun], path: Path) -> None:
    """CDFs of time to first token and per-token ITL, one column per concurrency."""
    levels = sorted({lv.stats.concurrency for side in sides for lv in side.levels})
    fig, axes = plt.subplots(2, len(levels), figsize=(3.4 * len(levels), 6), squeeze=False)
    for col, concurrency in enumerate(levels):
        for row, (metric, label) in enumerate(
            (("ttft", "time to first token (ms)"), ("itl", "inter-token latency (ms)"))
        ):
            ax = axes[row][col]
            for side in sides:
                level = side.level(concurrency)
                if level is None or not level.samples[metric]:
                    continue
                values = np.sort(np.asarray(level.samples[metric]) * 1000)
                ax.plot(
                    values,
                    np.linspace(0, 1, len(values)),
                    label=side.name,
                    color=COLORS.get(side.name),
                )
            _log_x(ax)
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"concurrency {concurrency}")
            if col == 0:
                ax.set_ylabel("fraction of samples")
                ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capacity(run: CapacityRun, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    streams = [lv.streams for lv in run.levels]
    left.plot(streams, [lv.tokens_per_s for lv in run.levels], marker="o", label="tokens/s")
    left.plot(streams, [lv.events_per_s for lv in run.levels], marker="s", label="SSE events/s")
    left.plot(
        streams,
        [s * run.plan.tokens_per_s for s in streams],
        ls="--",
        color="grey",
        label="offered tokens/s",
    )
    left.set_xlabel("concurrent SSE streams (one gateway)")
    left.set_title(f"sim engine, {run.plan.tokens_per_s:g} tokens/s per stream")
    left.grid(alpha=0.3)
    left.legend()
    names = sorted({name for lv in run.levels for name in lv.cpu.by_process})
    bottom = np.zeros(len(run.levels))
    xs = np.arange(len(run.levels))
    for name in [*names, "client"]:
        values = np.array(
            [
                lv.cpu_per_1k_tokens(
                    lv.cpu.client if name == "client" else lv.cpu.by_process.get(name, 0.0)
                )
                for lv in run.levels
            ]
        )
        right.bar(xs, values, bottom=bottom, label=name)
        bottom += values
    right.set_xticks(xs, [str(s) for s in streams])
    right.set_xlabel("concurrent SSE streams")
    right.set_ylabel("CPU seconds per 1,000 delivered tokens")
    right.set_title("CPU per stage")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log_x(ax: plt.Axes) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
