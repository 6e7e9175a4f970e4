"""Regenerate the figures the docs show (``docs/figures/``) from the benchmarks' JSON in ``results/``.

    python -m benchmarks.figures                  # after the benchmarks below have written their JSON
    python -m benchmarks.figures --results R --out docs/figures

Each figure is drawn by its benchmark's own plotting function; a figure whose JSON is missing is skipped, saying so.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks.report import REPO


def _regret(payload: dict, out: Path) -> Path:
    from benchmarks.report import plot_bandit_runs

    data = payload["datasets"]["cadata"]
    title = f"cadata: A={data['A']}, d={data['d']}, T={payload['config']['T']}, settings {payload['settings']}"
    return plot_bandit_runs(data["runs"], out, "regret_cadata", title[:150])


def _core_throughput(payload: dict, out: Path) -> Path:
    from benchmarks.core_throughput import plot

    return Path(plot(payload["rows"], out))


def _botorch_peer(payload: dict, out: Path) -> Path:
    from benchmarks.botorch_peer import plot

    out.mkdir(parents=True, exist_ok=True)
    path = out / "botorch_peer.png"
    plot(payload["results"], path, payload)
    return path


def _inclusion(payload: dict, out: Path) -> Path:
    from benchmarks.inclusion import plot

    return plot(payload["results"], out)


#: figure name -> (the benchmark JSON it is drawn from, the drawing function)
FIGURES = {
    "regret_cadata": ("regret.json", _regret),
    "core_throughput": ("core_throughput.json", _core_throughput),
    "botorch_peer": ("botorch_peer.json", _botorch_peer),
    "inclusion": ("inclusion.json", _inclusion),
}


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(REPO / "results"), help="where the benchmarks wrote their JSON")
    ap.add_argument("--out", default=str(REPO / "docs" / "figures"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (source, draw) in FIGURES.items():
        path = Path(args.results) / source
        if not path.exists():
            print(f"{name}: skipped, expected {path} (run its benchmark first), got none")
            continue
        doc = json.loads(path.read_text())
        tmp = out / ".drawing"
        png = draw(doc, tmp)
        shutil.move(str(png), out / f"{name}.png")
        shutil.rmtree(tmp, ignore_errors=True)
        written.append(out / f"{name}.png")
        print(f"{name}: wrote {out / (name + '.png')}")
    return written


if __name__ == "__main__":
    main()
