"""How much of an auto server's decode time on SGLang's own decode path (patch 0012) its probes
take, from the step traces of ``FASTVERIFY_STEP_TRACE`` (lab/steptrace), against a plain
server's steps.

    python lab/path_probe_share.py BASE_DIR AUTO_DIR [AUTO_DIR ...] [--bs 1] [--probe-ms 0.2]
                                   [--after 2] [--json OUT]

A probe on the path (`plain_path._probe`) runs inside its step's launch (``run_batch``). The step
tracer marks such a step (its record's probe field); in traces from before that mark, a path step
whose launch exceeds the server's median path launch by more than ``--probe-ms`` is counted as a
probe step instead (``how``: "marked" or "launch"), and the count is printed next to the path steps
so that it can be checked against the server's own stretches line (its probes on the path).
Over the steady path steps at batch size ``--bs`` (a path step followed by another path step of
that size within 0.5 s) it prints the mean period of the steps more than ``--after`` steps past
the last probe (the path away from probes), against the plain server's steady decode steps at that
size, and the time the probe steps and the ``--after`` steps that follow each took over that mean:
what the probes cost on the path, in all and per path step. Absolute times are the traced host's.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_trace import load_server, steps  # noqa: E402

PATH_KIND = "path"


def steady(records, bs: int, kind) -> list:
    """(period ms, launch ms, probed) of each decode step at batch size ``bs`` whose next launch is
    one of the same size, both of kind ``kind`` (None: of any kind, a plain server's), within the
    pause threshold (`step_trace.steps`), in launch order, with None where such a run breaks."""
    out, last = [], None
    for r in steps(records):
        if last is not None and r["index"] != last + 1:
            out.append(None)  # a pause between the two launches
        last = r["index"]
        ok = (r["mode"] == r["next_mode"] == "DECODE" and r["bs"] == r["next_bs"] == bs
              and (kind is None or r["kind"] == r["next_kind"] == kind))
        out.append((1000.0 * r["period"], 1000.0 * r["launch"], r["probe"]) if ok else None)
    return out


def share(base_rows, auto_rows, probe_ms: float, after: int) -> dict:
    base = [r for r in base_rows if r is not None]
    path = [r for r in auto_rows if r is not None]
    if len(base) < 10 or len(path) < 10:
        raise ValueError(f"too few steady steps to compare (base {len(base)}, path {len(path)})")
    marked = any(r[2] for r in path)
    cut = statistics.median(r[1] for r in path) + probe_ms
    since, tagged = None, []  # (period, launch, steps since the last probe step or None)
    for r in auto_rows:
        if r is None:
            since = None  # a stretch's start: no probe seen in it yet
            continue
        probe = r[2] if marked else r[1] > cut
        since = 0 if probe else (None if since is None else since + 1)
        tagged.append((r[0], r[1], since))
    away = [p for p, _, s in tagged if s is None or s > after]
    if len(away) < 10:
        raise ValueError(f"too few path steps away from probes ({len(away)})")
    away_mean = statistics.fmean(away)
    near = [p for p, _, s in tagged if s is not None and s <= after]
    over = sum(p - away_mean for p in near)
    base_mean = statistics.fmean(r[0] for r in base)
    total = statistics.fmean(p for p, _, _ in tagged)
    return {"how": "marked" if marked else "launch", "path_steps": len(tagged),
            "probe_steps": sum(1 for _, _, s in tagged if s == 0),
            "base_mean_ms": base_mean, "path_mean_ms": total, "away_mean_ms": away_mean,
            "probes_over_ms": over, "probes_per_path_step_ms": over / len(tagged),
            "path_over_base_ms": total - base_mean, "away_over_base_ms": away_mean - base_mean}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the plain server's FASTVERIFY_STEP_TRACE folder")
    ap.add_argument("autos", nargs="+", help="auto servers' folders")
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--probe-ms", type=float, default=0.2)
    ap.add_argument("--after", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.bs < 1 or a.after < 0 or not a.probe_ms > 0:
        ap.error("--bs must be >= 1, --after >= 0 and --probe-ms > 0")
    try:
        base = steady(load_server(a.base)[1], a.bs, None)
        out = {}
        for d in a.autos:
            out[d] = share(base, steady(load_server(d)[1], a.bs, PATH_KIND), a.probe_ms, a.after)
    except (OSError, ValueError) as e:
        print(f"path_probe_share.py: {e}", file=sys.stderr)
        return 2
    print(f"# steady decode steps at bs {a.bs}; probe step: marked by the tracer, or (how: launch) "
          f"launch > the path's median + {a.probe_ms} ms; near a probe: it and the {a.after} "
          "steps after it")
    print(f"{'server':<40} {'how':>7} {'path':>7} {'probes':>7} {'base ms':>8} {'path ms':>8} "
          f"{'away ms':>8} {'probes ms/step':>15} {'path - base':>12} {'away - base':>12}")
    for d, r in out.items():
        print(f"{Path(d).name:<40} {r['how']:>7} {r['path_steps']:>7} {r['probe_steps']:>7} "
              f"{r['base_mean_ms']:>8.4f} {r['path_mean_ms']:>8.4f} {r['away_mean_ms']:>8.4f} "
              f"{r['probes_per_path_step_ms']:>15.4f} {r['path_over_base_ms']:>+12.4f} "
              f"{r['away_over_base_ms']:>+12.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "servers": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
