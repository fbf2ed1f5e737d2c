#!/usr/bin/env python3
"""Compares two bench-results.json files: `make bench-compare A B`.

Prints every target with its value in each run and whether it is met, then
every raw figure that changed by more than 5 %. Exits 1 when a target met in A
is missed in B (a regression), 0 otherwise. Standard library only.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"bench-compare: {path}: {e}")


def fmt(value):
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"


def change(a, b):
    if a is None or b is None or a == 0:
        return ""
    return f"{(b - a) / abs(a) * 100:+.1f}%"


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: make bench-compare A B  (two bench-results*.json files)")
    a, b = load(argv[1]), load(argv[2])
    print(f"A: {argv[1]} ({a.get('date')}, {a.get('machine')})")
    print(f"B: {argv[2]} ({b.get('date')}, {b.get('machine')})\n")
    targets_a = {t["name"]: t for t in a.get("targets", [])}
    targets_b = {t["name"]: t for t in b.get("targets", [])}
    names = list(targets_a) + [n for n in targets_b if n not in targets_a]
    width = max((len(n) for n in names), default=6)
    print(f"{'target':<{width}}  {'bound':>10}  {'A':>10}  {'B':>10}  {'change':>8}  status")
    regressions = 0
    for name in names:
        ta, tb = targets_a.get(name), targets_b.get(name)
        bound = (ta or tb)["target"]
        va = ta["value"] if ta else None
        vb = tb["value"] if tb else None
        met_a = ta["met"] if ta else None
        met_b = tb["met"] if tb else None
        if met_a and met_b is False:
            status = "REGRESSED"
            regressions += 1
        elif met_a is False and met_b:
            status = "fixed"
        elif met_b is None:
            status = "only in A"
        elif met_a is None:
            status = "only in B" + ("" if met_b else ", missed")
        else:
            status = "met" if met_b else "missed"
        print(f"{name:<{width}}  {bound:>10}  {fmt(va):>10}  {fmt(vb):>10}  {change(va, vb):>8}  {status}")
    print("\nfigures that moved by more than 5%:")
    moved = 0
    for scenario, figures in b.get("figures", {}).items():
        for name, vb in figures.items():
            va = a.get("figures", {}).get(scenario, {}).get(name)
            if va is None or vb is None or va == 0 or abs(vb - va) / abs(va) <= 0.05:
                continue
            moved += 1
            print(f"  {scenario}.{name}: {fmt(va)} -> {fmt(vb)} ({change(va, vb)})")
    if not moved:
        print("  none")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
