"""Turning a benchmark report (the JSON bench.run writes) into tables, verdicts and a plot.

`verdicts` compares a run with the issue's targets; `markdown` renders the section of
docs/performance.md between the bench markers; `plot` draws latency and calls/s against
target threads, one line per configuration and pinning.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from bench.levers import pinning

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

# The C monitor of the issue, on this machine class (us)
C_N2H_SYNC_P50 = 19.0
C_OBH_UNPINNED_P50 = 100.0
C_CALLS_PER_S = 50_000


def signed_configs(report: dict[str, Any]) -> list[str]:
    """fhmon and its variants that sign (the targets are about signing on)."""
    return [name for name, settings in report.get("configs", {}).items()
            if settings.get("signing", "true") == "true"]


def cell_key(r: dict[str, Any]) -> tuple[str, int, int, bool]:
    return (r["op"], r["threads"], r["targets"], r["pinned"])


def find(results: list[dict[str, Any]], config: str, op: str, threads: int = 1,
         targets: int = 1, pinned: bool = False) -> dict[str, Any] | None:
    for r in results:
        if (r["config"], *cell_key(r)) == (config, op, threads, targets, pinned):
            return r
    return None


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target of the issue: what was asked, what was measured, met or not.

    Met or not is for `fhmon` as configured by default; when another configuration that
    signs does clearly better (a lever not on by default), it is named in the measured
    column.
    """
    res = report.get("results", [])
    signed = signed_configs(report) or ["fhmon"]
    out: list[dict[str, Any]] = []

    def row(target: str, asked: str, measured: str, met: bool | None) -> None:
        out.append({"target": target, "asked": asked, "measured": measured, "met": met})

    def best(key: str, op: str, lower: bool, threads: int = 1, pinned: bool = False,
             ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(fhmon's row, the best signing configuration's row if it beats fhmon)."""
        rows = [r for c in signed if (r := find(res, c, op, threads, 1, pinned)) is not None
                and r[key] is not None]
        default = find(res, "fhmon", op, threads, 1, pinned)
        if not rows:
            return default, None
        top = min(rows, key=lambda r: r[key]) if lower else max(rows, key=lambda r: r[key])
        if default is None or top is default or top[key] == default[key]:
            return default, None
        # named only when clearly better (10%): a run's noise is about that size
        better = top[key] < 0.9 * default[key] if lower else top[key] > 1.1 * default[key]
        return default, top if better else None

    def also(other: dict[str, Any] | None, key: str, unit: str, digits: int = 1) -> str:
        if other is None:
            return ""
        return f"; {other['config']}: {fmt(other[key], digits)}{unit}"

    for op, name in (("n2h", "name_to_handle_at"), ("obh", "open_by_handle_at")):
        r, other = best("cpu_us_per_call", op, True, pinned=True)
        if r is not None:
            cpu = r["cpu_us_per_call"]
            row(f"pinned, {name}: fhmon CPU per call", "<= 35 us (C: 14-16)",
                f"{fmt(cpu)} us{also(other, 'cpu_us_per_call', ' us')}",
                cpu is not None and cpu <= 35)
        r, other = best("p50_us", op, True, pinned=True)
        if r is not None:
            row(f"pinned, {name}: p50, 1 thread", "<= 45 us (C: 16-21)",
                f"{fmt(r['p50_us'])} us{also(other, 'p50_us', ' us')}", r["p50_us"] <= 45)
    for op, name, c in (("n2h", "name_to_handle_at", C_N2H_SYNC_P50),
                        ("obh", "open_by_handle_at", C_OBH_UNPINNED_P50)):
        r, other = best("p50_us", op, True)
        if r is not None:
            limit = 1.5 * c
            row(f"unpinned, {name}: p50, 1 thread", f"<= {limit:.1f} us (1.5 x C's {c:.0f})",
                f"{fmt(r['p50_us'])} us ({r['p50_us'] / c:.2f} x C)"
                f"{also(other, 'p50_us', ' us')}", r["p50_us"] <= limit)
    sig = report.get("signing")
    if sig:
        total = sig["sign_us"] + sig["verify_us"]
        row("signing + verifying one handle (in-process)", "<= 2 us",
            f"{sig['sign_us']:.2f} + {sig['verify_us']:.2f} = {total:.2f} us", total <= 2)
        if "native_sign_us" in sig:
            native_total = sig["native_sign_us"] + sig["native_verify_us"]
            row("sign + verify one handle in the native data plane (no Python call)", "<= 1 us",
                f"{sig['native_sign_us']:.2f} + {sig['native_verify_us']:.2f} = "
                f"{native_total:.2f} us", native_total <= 1)
    one = [r for r in res if r["config"] == "fhmon" and r["threads"] == 1
           and r["targets"] == 1]
    if one:
        worst = max(one, key=lambda r: r["p99_us"] / r["p50_us"])
        ratio = worst["p99_us"] / worst["p50_us"]
        row("p99 <= 4 x p50 (fhmon, 1 thread, every op and pinning)", "<= 4.0",
            f"worst {ratio:.1f} ({worst['op']}, "
            f"{'pinned' if worst['pinned'] else 'unpinned'})", ratio <= 4)
    for op in ("mix", "n2h", "obh"):
        r, other = best("calls_per_s", op, False, threads=4)
        if r is not None:
            row(f"4 target threads, {op}: aggregate calls/s", f">= {C_CALLS_PER_S:,}",
                f"{fmt(r['calls_per_s'], 0)}{also(other, 'calls_per_s', '', 0)}",
                r["calls_per_s"] >= C_CALLS_PER_S)
    soak = report.get("soak")
    if soak:
        row(f"fd count flat over {soak['calls']:,} calls", "flat",
            f"{soak['fds_first']} -> {soak['fds_last']} (range after warm-up "
            f"{soak['fds_range']})", soak["fds_flat"])
        row(f"RSS flat over {soak['calls']:,} calls", "flat (<= 1 MiB growth after warm-up)",
            f"{soak['rss_first_kib'] / 1024:.1f} -> {soak['rss_last_kib'] / 1024:.1f} MiB "
            f"({soak['rss_growth_kib']:+d} KiB)", soak["rss_flat"])
    return out


def results_table(report: dict[str, Any]) -> list[str]:
    res = report["results"]
    kernel = {cell_key(r): r for r in res if r["config"] == "kernel"}
    ref = {cell_key(r): r for r in res if r["config"] == "refmon"}
    lines = ["| op | threads | targets | pinning | config | p50 us | p99 us | p99/p50 | calls/s "
             "| fhmon CPU us/call | p50 / kernel | p50 / refmon | others' CPUs |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res:
        k = kernel.get(cell_key(r))
        ratio = fmt(r["p50_us"] / k["p50_us"]) if k else "-"
        m = ref.get(cell_key(r))
        ref_ratio = fmt(r["p50_us"] / m["p50_us"], 2) if m else "-"
        lines.append(f"| {r['op']} | {r['threads']} | {r['targets']} | "
                     f"{'pinned' if r['pinned'] else 'unpinned'} | {r['config']} | "
                     f"{fmt(r['p50_us'])} | {fmt(r['p99_us'])} | "
                     f"{fmt(r['p99_us'] / r['p50_us'])} | {fmt(r['calls_per_s'], 0)} | "
                     f"{fmt(r['cpu_us_per_call'])} | {ratio} | {ref_ratio} | "
                     f"{fmt(r.get('other_cpus'), 2)} |")
    return lines


def print_table(report: dict[str, Any]) -> None:
    res = report["results"]
    kernel = {cell_key(r): r for r in res if r["config"] == "kernel"}
    ref = {cell_key(r): r for r in res if r["config"] == "refmon"}
    print(f"{'op':<9}{'thr':>4}{'tgt':>4} {'pin':<9}{'config':<19}{'p50 us':>9}{'p99 us':>9}"
          f"{'calls/s':>10}{'cpu us':>8}{'p50/kern':>10}{'p50/ref':>9}{'others':>8}")
    for r in res:
        k = kernel.get(cell_key(r))
        ratio = f"{r['p50_us'] / k['p50_us']:.1f}" if k else "-"
        m = ref.get(cell_key(r))
        ref_ratio = f"{r['p50_us'] / m['p50_us']:.2f}" if m else "-"
        print(f"{r['op']:<9}{r['threads']:>4}{r['targets']:>4} "
              f"{'pinned' if r['pinned'] else 'unpinned':<9}{r['config']:<19}"
              f"{r['p50_us']:>9.1f}{r['p99_us']:>9.1f}{r['calls_per_s']:>10.0f}"
              f"{fmt(r['cpu_us_per_call']):>8}{ratio:>10}{ref_ratio:>9}"
              f"{fmt(r.get('other_cpus'), 2):>8}")
    sig = report.get("signing")
    if sig:
        print(f"signing alone: sign {sig['sign_us']:.2f} us/handle, verify "
              f"{sig['verify_us']:.2f} us/handle")
        if "native_sign_us" in sig:
            print(f"signing in the native plane: sign {sig['native_sign_us']:.2f} us/handle, "
                  f"verify {sig['native_verify_us']:.2f} us/handle")


def print_verdicts(report: dict[str, Any]) -> None:
    for v in verdicts(report):
        mark = {True: "met", False: "NOT met", None: "?"}[v["met"]]
        print(f"  [{mark:>7}] {v['target']}: {v['measured']} (target {v['asked']})")


_SHARE_KINDS = {"filesystem": "a filesystem of its own, loop-mounted ext4 (as a block PVC)",
                "mount": "a bind mount of a directory (lookups and directory opens walk '..')",
                "directory": "a plain directory (lookups and directory opens walk '..')",
                "?": "not recorded"}


def markdown(report: dict[str, Any], plot_name: str | None) -> str:
    m = report["machine"]
    lines = [
        f"Generated by `{report['command']}` on {report['date']} "
        f"(mode `{report['mode']}`, {report['repeat']} runs per cell, medians; "
        f"{report['calls_per_cell']:,} calls per cell, at least "
        f"{report['min_per_thread']} per thread).",
        "",
        f"Machine: {m['cpus']} vCPUs ({m['cpu_model']}), kernel {m['kernel']}, "
        f"Python {m['python']} (fhmon), {m['target_python']} (targets); fhmon at "
        f"{m['git']}. Load average at start {_load(report['load_start'])}, at end "
        f"{_load(report['load_end'])}. The share: {_SHARE_KINDS[m.get('share', '?')]}.",
        "",
        "### Targets",
        "",
        "| target | asked | measured | |",
        "|---|---|---|---|",
    ]
    for v in verdicts(report):
        mark = {True: "met", False: "**not met**", None: "?"}[v["met"]]
        lines.append(f"| {v['target']} | {v['asked']} | {v['measured']} | {mark} |")
    if report.get("results"):
        lines += ["", "### Matrix", "", *results_table(report)]
    if plot_name:
        lines += ["", f"![latency and calls/s against target threads]({plot_name})"]
    sig = report.get("signing")
    if sig:
        lines += ["", f"Signing alone (fhmon's KeyRing, in-process): sign "
                  f"{sig['sign_us']:.2f} us, verify {sig['verify_us']:.2f} us per handle."]
        if "native_sign_us" in sig:
            lines[-1] += (f" In the native data plane (no Python call per operation): sign "
                          f"{sig['native_sign_us']:.2f} us, verify "
                          f"{sig['native_verify_us']:.2f} us.")
    if report.get("configs"):
        lines += ["", "Configurations: " + "; ".join(
            f"`{name}` = {', '.join(f'{k} = {v}' for k, v in s.items()) or 'defaults'}"
            for name, s in report["configs"].items()) + "."]
    levers = report.get("levers")
    if levers:
        lines += ["", "### Levers: primitives (us per operation, in Python, as root)", "",
                  "| step | way | us |", "|---|---|---:|"]
        for r in levers["primitives"]:
            lines.append(f"| {r['group']} | {r['name']} | {fmt(r['us'], 2)} |")
        lines += ["", "### Levers: the floor (a do-nothing Python monitor)", "",
                  "| op, reply | wait | SYNC_WAKE_UP | pinning | caller threads | monitors "
                  "| p50 us | p99 us | calls/s | monitor CPU us/call |",
                  "|---|---|---|---|---:|---|---:|---:|---:|---:|"]
        for r in levers["floor"]:
            mons = (f"{r['monitors']} {'processes' if r['processes'] else 'threads'}"
                    if r["monitors"] > 1 else "1")
            sync = ("on" if r["sync_ok"] else "refused") if r["sync"] else "off"
            lines.append(f"| {r['op']}, {r['reply']} | {r['wait']} | {sync} | "
                         f"{pinning(r)} | {r['threads']} | {mons} | "
                         f"{fmt(r['p50_us'])} | {fmt(r['p99_us'])} | "
                         f"{fmt(r['calls_per_s'], 0)} | {fmt(r['cpu_us_per_call'])} |")
    soak = report.get("soak")
    if soak:
        churn = ", new threads every chunk" if soak.get("churn") else ""
        lines += ["", f"### Soak: {soak['calls']:,} calls ({soak['op']}, {soak['targets']} "
                  f"targets x {soak['threads']} threads{churn}, config `{soak['config']}`, "
                  f"{soak['wall_s']:.0f} s, {soak['calls'] / soak['wall_s']:,.0f} calls/s)",
                  "", "| calls | fhmon fds | fhmon RSS MiB |", "|---:|---:|---:|"]
        for s in soak["samples"]:
            lines.append(f"| {s['calls']:,} | {s['fds']} | {s['rss_kib'] / 1024:.1f} |")
        lines += ["", f"fds {'flat' if soak['fds_flat'] else '**not flat**'}, RSS "
                  f"{'flat' if soak['rss_flat'] else '**not flat**'} "
                  f"({soak['rss_growth_kib']:+d} KiB from the first sample after warm-up to "
                  f"the last)."]
    return "\n".join(lines) + "\n"


def _load(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def write_section(path: Path, body: str) -> None:
    """Replace the text between the bench markers (or append a marked section)."""
    text = path.read_text() if path.exists() else ""
    section = f"{BEGIN}\n{body}{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text,
                      count=1, flags=re.DOTALL)
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section + "\n"
    path.write_text(text)


def plot(report: dict[str, Any], path: Path) -> None:
    """Latency (p50 solid, p99 dashed) and calls/s against target threads, per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    names = {"n2h": "name_to_handle_at", "obh": "open_by_handle_at",
             "mix": "mix (1 n2h : 3 obh)", "n2h-path": "name_to_handle_at (path)"}
    ops = [op for op in names if any(r["op"] == op for r in res)]
    many_targets = len({r["targets"] for r in res}) > 1
    rows = 3 if many_targets else 2
    fig, axes = plt.subplots(rows, len(ops), figsize=(5.2 * len(ops), 3.6 * rows),
                             squeeze=False)
    series = sorted({(r["config"], r["pinned"]) for r in res})
    colors = {c: f"C{i}" for i, c in enumerate(sorted({s[0] for s in series}))}
    for col, op in enumerate(ops):
        lat, tput = axes[0][col], axes[1][col]
        for config, pinned in series:
            label = f"{config} {'pinned' if pinned else 'unpinned'}"
            style = {"color": colors[config], "marker": "s" if pinned else "o",
                     "alpha": 0.6 if pinned else 1.0}
            pts = sorted((r["threads"], r) for r in res if r["op"] == op
                         and r["config"] == config and r["pinned"] == pinned
                         and r["targets"] == 1)
            if pts:
                xs = [t for t, _ in pts]
                lat.plot(xs, [r["p50_us"] for _, r in pts], "-", label=label, **style)
                lat.plot(xs, [r["p99_us"] for _, r in pts], "--", **style)
                tput.plot(xs, [r["calls_per_s"] for _, r in pts], "-", label=label, **style)
            if many_targets:
                pts = sorted((r["targets"], r) for r in res if r["op"] == op
                             and r["config"] == config and r["pinned"] == pinned
                             and r["threads"] == 1)
                if pts:
                    axes[2][col].plot([t for t, _ in pts], [r["calls_per_s"] for _, r in pts],
                                      "-", label=label, **style)
        if op in ("n2h", "obh"):
            lat.axhline(45, color="grey", linestyle=":", linewidth=1)
            lat.annotate("target p50, pinned: 45 us", (0.02, 45), xycoords=("axes fraction",
                         "data"), fontsize=7, color="grey", va="bottom")
        tput.axhline(C_CALLS_PER_S, color="grey", linestyle=":", linewidth=1)
        tput.annotate("one C monitor thread: 50k/s", (0.02, C_CALLS_PER_S),
                      xycoords=("axes fraction", "data"), fontsize=7, color="grey", va="bottom")
        lat.set_title(f"{names[op]}: latency (p50 solid, p99 dashed)", fontsize=9)
        lat.set_ylabel("us per call")
        tput.set_title(f"{names[op]}: calls/s, 1 target", fontsize=9)
        tput.set_ylabel("calls/s")
        for ax in (lat, tput):
            ax.set_xlabel("target threads")
        if many_targets:
            axes[2][col].set_title(f"{names[op]}: calls/s, 1 thread per target", fontsize=9)
            axes[2][col].set_xlabel("targets")
            axes[2][col].set_ylabel("calls/s")
        for row in range(rows):
            ax = axes[row][col]
            ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ticks = sorted({r["targets"] if row == 2 else r["threads"] for r in res
                            if r["op"] == op})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.grid(True, which="both", alpha=0.3)
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    labels = sorted(legend)
    handles = [legend[label] for label in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    fig.suptitle(f"fhmon vs kernel, {report['machine']['cpus']} vCPUs, kernel "
                 f"{report['machine']['kernel']} ({report['date']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(labels) / 4), 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
