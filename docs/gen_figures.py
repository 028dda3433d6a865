"""The performance page's figures, drawn from the benchmark results.

Reads ``benchmarks/results.json`` (``benchmarks/run.py``), ``recipes.json``
(``recipes.py``) and ``torch_results.json`` (``torch_calls.py``) and writes one
SVG per figure. The docs build runs it through ``docs/hooks.py`` (the SVGs are
generated files of the site, never committed); by hand::

    python docs/gen_figures.py OUTDIR

Every figure plots minima (the benchmarks' headline: noise only adds time), as
the tables beside it on ``docs/performance.md`` do. Sizes n that are a few
chosen values are categories (grouped bars), not points on a line, and every
panel labels both axes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "anybind"   # the same SVG for the same numbers
# type that reads at the page's width: an 11-inch figure is shown about 730 px wide at a
# 1280 px window, so 12 pt comes out at about 11 px
matplotlib.rcParams.update({"font.size": 13, "legend.fontsize": 12, "xtick.labelsize": 12,
                            "ytick.labelsize": 12, "axes.titlesize": 13})
import matplotlib.pyplot as plt  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

# one colour per kind of route, the same in every figure
COLOURS = {
    # anybind's variants: blue, teal and navy (navy bars hatched), told apart in print too
    "anybind": "#1f6feb", "anybind out=True": "#17a398", "anybind def_vjp(out=True)": "#0b2a6b",
    "anybind compiled (C)": "#1f6feb", "anybind compiled (Numba)": "#17a398",
    "anybind Python": "#0b2a6b", "anybind op.torch": "#1f6feb",
    "native jnp": "#222222", "native torch": "#222222",
    "pure_callback": "#d1242f", "custom_vjp+pure_callback": "#d1242f",
    "buffer_callback": "#bf8700", "custom_vjp+buffer_callback": "#bf8700",
    "hand-written C++ FFI": "#8250df", "JAXbind": "#1a7f37",
    "autograd.Function": "#bf8700", "custom_op": "#8250df",
}


def _colour(route: str) -> str:
    if route in COLOURS:
        return COLOURS[route]
    for prefix, colour in [("anybind", "#1f6feb"), ("native", "#222222"), ("JAXbind", "#1a7f37"),
                           ("pure_callback", "#d1242f"), ("buffer_callback", "#bf8700"),
                           ("custom_vjp+pure", "#d1242f"), ("custom_vjp+buffer", "#bf8700")]:
        if route.startswith(prefix):
            return colour
    return "#888888"   # references (NumPy alone)


def _load(name: str) -> dict:
    return json.loads((BENCH / name).read_text())


def _n_label(n: str) -> str:
    return {"1": "1", "1000": "10³", "1000000": "10⁶"}.get(n, n)


def _save(fig, out: Path, name: str) -> Path:
    path = out / name
    fig.tight_layout()
    # the bounding box holds every label and the legends placed outside the axes
    fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return path


def _grouped(ax, group: dict, title: str) -> None:
    """One group of bars per size n (a category), one bar per route, log scale."""
    ns = [n for n in group if n != "scan"]
    routes = list(group[ns[0]])
    width = 0.8 / len(routes)
    for k, route in enumerate(routes):
        xs = [i + (k - (len(routes) - 1) / 2) * width for i in range(len(ns))]
        anybind = route.startswith("anybind")
        ax.bar(xs, [group[n][route]["min_us"] for n in ns], width=width, color=_colour(route),
               label=route, edgecolor="#222222" if anybind else "none", linewidth=0.8,
               hatch="//" if route.startswith("custom_vjp")        # its callback's colour
               else ".." if _colour(route) == "#0b2a6b" else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(ns)), [f"n = {_n_label(n)}" for n in ns])
    ax.set_xlabel("array size")
    ax.set_title(title)
    ax.set_ylabel("µs per call (min)")
    ax.grid(True, axis="y", which="both", alpha=0.25)


def _bars(ax, labels, values, colours, xlabel, log=True, fmt="{:.3g}", ylabel="route") -> None:
    y = range(len(labels))
    ax.barh(y, values, color=colours)
    ax.set_yticks(y, labels)
    ax.set_ylabel(ylabel)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    for i, v in enumerate(values):
        ax.text(v, i, " " + fmt.format(v), va="center", fontsize=11)
    _room_right(ax, max(values), log)
    ax.grid(True, axis="x", which="both", alpha=0.25)


def _room_right(ax, largest: float, log: bool) -> None:
    """Room right of the longest bar for its value label, inside the frame."""
    ax.set_xlim(right=largest * 4 if log else largest * 1.2)


def _legend_below(ax, ncols: int = 2) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=ncols, frameon=False)


def overhead(results: dict, out: Path) -> Path:
    """Per-call time of f = x1·x2² under jit and jit(grad), per route, against n."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    _grouped(axes[0], results["calls"], "jit(f)")
    _grouped(axes[1], results["grads"], "jit(grad(Σ f))")
    for ax in axes:
        _legend_below(ax)
    return _save(fig, out, "overhead.svg")


def compiled(results: dict, out: Path) -> Path:
    """Compiled routes against n, and the per-call cost inside a lax.scan of 1000 steps."""
    ffi = results["ffi"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), gridspec_kw={"width_ratios": [1.1, 1]})
    _grouped(axes[0], ffi, "jit(f), compiled and Python routes")
    _legend_below(axes[0])
    routes = list(ffi["scan"])
    per_step = [ffi["scan"][r]["min_us"] / 1000 for r in routes]
    _bars(axes[1], routes, per_step, [_colour(r) for r in routes], "µs per step (min)")
    axes[1].set_title("inside a lax.scan of 1000 steps, n = 1")
    return _save(fig, out, "compiled.svg")


def vmap(results: dict, out: Path) -> Path:
    """jit(vmap(f)) over 1000×100, per batching route."""
    group = results["vmap"]
    routes = list(group)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    _bars(ax, routes, [group[r]["min_us"] for r in routes], [_colour(r) for r in routes],
          "µs per call (min)")
    ax.set_title("jit(vmap(f)) over 1000×100")
    return _save(fig, out, "vmap.svg")


def contrib(results: dict, out: Path) -> Path:
    """anybind.contrib.ducc0 ÷ JAXbind's jaxducc0, forward and jit(grad)."""
    group = results["contrib"]
    cases = list(group)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.38
    for k, (mode, colour) in enumerate([("forward", "#1f6feb"), ("jit(grad)", "#17a398")]):
        ratios = [group[c][mode]["anybind"]["min_us"] / group[c][mode]["JAXbind"]["min_us"]
                  for c in cases]
        ys = [i + (k - 0.5) * width for i in range(len(cases))]
        ax.barh(ys, ratios, height=width, color=colour, label=mode)
        for y, r in zip(ys, ratios):
            ax.text(r, y, f" {r:.2f}", va="center", fontsize=11)
    ax.axvline(1.0, color="#222222", linewidth=1)
    ax.set_yticks(range(len(cases)), cases)
    ax.set_ylabel("transform and size")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.4)
    ax.set_xlabel("anybind ÷ JAXbind, ratio of minima (< 1: anybind faster)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("anybind.contrib.ducc0 against jaxbind.contrib.jaxducc0")
    return _save(fig, out, "contrib.svg")


def memory(results: dict, out: Path) -> Path:
    """Peak memory over the inputs' and outputs' own size, n = 5·10⁷ float64."""
    group = results["memory"]
    routes = list(group)
    labels = [r.split(": ", 1)[1] if ": " in r else r for r in routes]
    labels = [f"{group[r]['kind']}: {lab}" for r, lab in zip(routes, labels)]
    ratios = [group[r]["ratio"] for r in routes]
    colours = [_colour(lab.split(": ", 1)[1].split(",")[0]) for lab in labels]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    _bars(ax, labels, ratios, colours, "peak RSS ÷ the arrays' own size", log=False,
          fmt="{:.2f}", ylabel="operation: route")
    ax.axvline(1.0, color="#222222", linewidth=1)
    ax.set_title("peak memory, n = 5·10⁷ float64 (381 MiB per array)")
    return _save(fig, out, "memory.svg")


def many_devices(results: dict, out: Path) -> Path:
    """8 simulated CPU devices: per shard, gathered (no shard=), native."""
    group = {k: v for k, v in results["devices"].items() if isinstance(v, dict) and "routes" in v}
    cases = list(group)
    routes = ["per shard", "gathered", "native jnp"]
    colours = {"per shard": "#1f6feb", "gathered": "#d1242f", "native jnp": "#222222"}
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.26
    for k, route in enumerate(routes):
        ms = [group[c]["routes"][route]["min_us"] / 1000 for c in cases]
        ys = [i + (k - 1) * width for i in range(len(cases))]
        ax.barh(ys, ms, height=width, color=colours[route], label=route)
        for y, v in zip(ys, ms):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=11)
    ax.set_xscale("log")
    _room_right(ax, max(group[c]["routes"][r]["min_us"] / 1000 for c in cases for r in routes),
                True)
    ax.set_yticks(range(len(cases)), cases)
    ax.set_ylabel("operation")
    ax.invert_yaxis()
    ax.set_xlabel("ms per call (min)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("8 CPU devices, rows sharded: shard= against the gathered default")
    return _save(fig, out, "many_devices.svg")


def torch_routes(torch_results: dict, out: Path) -> Path:
    """op.torch against native torch, autograd.Function and custom_op."""
    group = torch_results["results"]
    cases = list(group)
    routes = list(group[cases[0]])
    fig, ax = plt.subplots(figsize=(10, 4.6))
    width = 0.8 / len(routes)
    for k, route in enumerate(routes):
        xs = [i + (k - (len(routes) - 1) / 2) * width for i in range(len(cases))]
        vals = [group[c][route]["min_us"] for c in cases]
        ax.bar(xs, vals, width=width, color=_colour(route), label=route)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=11)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), cases)
    ax.set_xlabel("operation")
    ax.set_ylabel("µs per call (min)")
    ax.set_ylim(top=ax.get_ylim()[1] * 2)   # the value labels above the bars stay inside
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=4, frameon=False)
    ax.set_title(f"f = x1·x2² on float64 CPU tensors (torch {torch_results['torch']})")
    return _save(fig, out, "torch.svg")


def recipes(recipes_results: dict, out: Path) -> Path:
    """Peak memory of the recipes against plain JAX reverse mode."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    nbody = recipes_results["nbody"]
    ns = sorted({int(k.rsplit("@", 1)[1]) for k in nbody})
    for route, colour in [("anybind symmetric=True", "#1f6feb"), ("JAX reverse mode", "#d1242f")]:
        mib = [nbody[f"{route} @ {n}"]["peak_rss_bytes"] / 2**20 for n in ns]
        axes[0].plot(ns, mib, marker="o", color=colour, label=route)
    axes[0].set_xscale("log", base=2)
    axes[0].set_ylim(bottom=0)
    axes[0].set_xticks(ns, [f"{n:,}" for n in ns])
    axes[0].set_xlabel("N particles")
    axes[0].set_ylabel("peak RSS over base, MiB")
    axes[0].set_title("direct-summation forces, jit(grad) of Σ|F|²")
    loop = recipes_results["loop"]
    steps = sorted({int(k.rsplit("@", 1)[1]) for k in loop})
    for route, colour in [("ab.reversible_loop", "#1f6feb"), ("lax.fori_loop", "#d1242f"),
                          ("lax.scan", "#bf8700")]:
        mib = [loop[f"{route} @ {s}"]["peak_rss_bytes"] / 2**20 for s in steps]
        style = {"lax.scan": ("x", ":"), "lax.fori_loop": ("o", "--")}.get(route, ("o", "-"))
        axes[1].plot(steps, mib, marker=style[0], linestyle=style[1], color=colour, label=route)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("steps")
    axes[1].set_ylabel("peak RSS over base, MiB")
    axes[1].set_title("jit(grad) through a loop, 256×256 float64 state")
    for ax in axes:
        ax.legend()
        ax.grid(True, which="both", alpha=0.25)
    return _save(fig, out, "recipes.svg")


def generate(out: Path) -> list[Path]:
    """Write every figure into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = _load("results.json")
    return [overhead(results, out), compiled(results, out), vmap(results, out),
            contrib(results, out), memory(results, out), many_devices(results, out),
            torch_routes(_load("torch_results.json"), out), recipes(_load("recipes.json"), out)]


if __name__ == "__main__":
    for written in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "figures")):
        print(written)
