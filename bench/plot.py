#!/usr/bin/env python3
"""Plots of a zerohop-bench run: reads RESULTS_DIR/results.json, writes PNGs next to it.

  throughput_vs_concurrency.png  RPS of the hello chain (100 B) per system and concurrency
  latency_cdf.png                latency CDF of the hello chain at concurrency 32 (or the largest)
  cpu_per_request.png            CPU ms per 1,000 requests by component (hello, c=32)
  chain_length.png               p50 and p99 latency against the number of functions

Usage: plot.py RESULTS_DIR   (needs matplotlib: pip install matplotlib)
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["zerohop-ring", "zerohop-socket", "monolith", "http-chain", "nginx-broker"]


def systems(runs):
    seen = {r["system"] for r in runs}
    return [s for s in ORDER if s in seen] + sorted(seen - set(ORDER))


def hello_points(res):
    return [r for r in res["runs"] if r["experiment"] == "concurrency" and r["body"] == "100B"]


def throughput(res, out):
    runs = hello_points(res)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in systems(runs):
        pts = sorted((r["concurrency"], r["result"]["rps"]) for r in runs if r["system"] == s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent connections (closed loop)")
    ax.set_ylabel("requests per second")
    ax.set_title("Hello chain (upper -> exclaim), 100 B bodies")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput_vs_concurrency.png"), dpi=120)
    plt.close(fig)


def pick_concurrency(runs):
    cs = sorted({r["concurrency"] for r in runs})
    return 32 if 32 in cs else (cs[-1] if cs else None)


def latency_cdf(res, out):
    runs = hello_points(res)
    c = pick_concurrency(runs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in systems(runs):
        r = next((r for r in runs if r["system"] == s and r["concurrency"] == c), None)
        if not r or not r["result"]["cdf"]:
            continue
        pts = r["result"]["cdf"]
        ax.plot([p[1] for p in pts], [p[0] for p in pts], marker=".", label=s)
    ax.set_xscale("log")
    ax.set_xlabel("latency (us)")
    ax.set_ylabel("percentile")
    ax.set_title(f"Latency CDF, hello chain, 100 B, concurrency {c}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency_cdf.png"), dpi=120)
    plt.close(fig)


def group(component):
    if component.startswith("fn:"):
        return "functions"
    if component.startswith("nginx"):
        return "nginx"
    return component


def cpu_per_request(res, out):
    runs = hello_points(res)
    c = pick_concurrency(runs)
    chosen = [r for s in systems(runs) for r in runs if r["system"] == s and r["concurrency"] == c]
    groups = ["gateway", "monolith", "nginx", "functions", "loadgen"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottoms = [0.0] * len(chosen)
    for g in groups:
        vals = []
        for r in chosen:
            vals.append(sum(v for k, v in r["cpu_ms_per_1k"].items() if group(k) == g))
        if not any(vals):
            continue
        ax.bar(
            [r["system"] for r in chosen],
            vals,
            bottom=bottoms,
            label=g + (" (load generator)" if g == "loadgen" else ""),
            hatch="//" if g == "loadgen" else None,
            alpha=0.5 if g == "loadgen" else 1.0,
        )
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("CPU ms per 1,000 requests")
    ax.set_title(f"CPU per request by component, hello chain, concurrency {c}")
    ax.legend()
    plt.setp(ax.get_xticklabels(), rotation=15)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cpu_per_request.png"), dpi=120)
    plt.close(fig)


def chain_length(res, out):
    runs = [r for r in res["runs"] if r["experiment"] == "chain_length"]
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(systems(runs)):
        pts = sorted(
            (r["chain_len"], r["result"]["latency"]["p50_us"], r["result"]["latency"]["p99_us"])
            for r in runs
            if r["system"] == s
        )
        color = f"C{i}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=f"{s} p50")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle="--", color=color, alpha=0.6)
    ax.set_xlabel("functions in the chain (pass-through)")
    ax.set_ylabel("latency (us); dashed: p99")
    ax.set_yscale("log")
    ax.set_title("Chain length vs latency, 100 B bodies")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "chain_length.png"), dpi=120)
    plt.close(fig)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    for plot in (throughput, latency_cdf, cpu_per_request, chain_length):
        plot(res, out)
    print(f"plot.py: wrote the plots into {out}")


if __name__ == "__main__":
    main()
