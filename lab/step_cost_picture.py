"""Where each server's host time per decode step goes, as stacked bars, from the JSON of
``lab/step_trace.py --json`` (the step tracer's per-server statistics).

A host-bound step's period is the host's work, so two servers' difference on one load is the sum of
the differences of these pieces (means over the steady decode steps, ms):

  schedule        batch selection and decode preparation (``Scheduler.get_next_batch_to_run``)
  forward call    ``TpModelWorker.forward_batch_generation`` (the model's forward and sampling)
  n-gram worker   what ``NGRAMWorker.forward_batch_generation`` adds around the forward call:
                  for an auto server's steps without speculation split into the plain step's
                  input and result kernels, the corpus put, probes, the controller's bookkeeping
                  (``plain_step`` less ``run_plain_decode``), the batch's save and restore and the
                  result's shaping (the rest of ``run_plain_decode``) and the worker's own entry;
                  for other n-gram servers one piece (lookup, verify, acceptance)
  rest            the period's busy time left: result processing, the launch's own work, the loop

  python lab/step_cost_picture.py STEPTRACE.json --png OUT.png [--servers A,auto_never]
      [--kind lean]

``--kind`` takes that kind of step (``lean``: an auto server's steps without speculation and without
a lookup) of every server that has it, all decode steps of the others. The pieces are printed too.
"""

from __future__ import annotations

import argparse
import json
import sys

SCRIPT = "lab/step_cost_picture.py"


def _span(stats: dict, name: str) -> float:
    return float((stats.get("spans_mean_ms") or {}).get(name) or 0.0)


def pieces(stats: dict) -> list:
    """[(label, ms)] of one server's statistics (a ``decode`` or ``by_kind`` entry of step_trace's
    JSON), summing to its mean busy time per step; a piece below zero (two means of different steps)
    is shown as zero."""
    busy = float(stats["busy_mean"])
    schedule, forward = _span(stats, "schedule"), _span(stats, "target_step")
    worker, plain_step = _span(stats, "ngram_step"), _span(stats, "plain_step")
    out = [("schedule", schedule), ("forward call", forward)]
    decode = _span(stats, "plain_decode")
    if decode > 0:  # an auto server's steps without speculation
        probes = _span(stats, "probe_behind") + _span(stats, "lookup_behind")
        kernels = (_span(stats, "plain_inputs"), _span(stats, "plain_outputs"))
        put = _span(stats, "corpus_put")
        out += [("plain step: input kernel", kernels[0]), ("plain step: result kernel", kernels[1]),
                ("corpus put", put), ("probes", probes),
                ("controller bookkeeping", plain_step - decode),
                ("save/restore, result shaping", decode - forward - sum(kernels) - put - probes),
                ("n-gram worker entry", worker - plain_step)]
    elif worker > 0:
        out.append(("n-gram worker (lookup, verify, accept)", worker - forward))
    taken = schedule + (worker if worker > 0 else forward)
    out.append(("rest (result processing, launch, loop)", busy - taken))
    return [(label, max(ms, 0.0)) for label, ms in out]


def table(doc: dict, servers: list, kind: str | None) -> dict:
    """{server: (which steps, [(label, ms)])} for the servers asked (all, in order, when empty)."""
    res = doc.get("results") or {}
    names = servers or list(res)
    missing = [n for n in names if n not in res]
    if missing:
        raise KeyError(f"no server {', '.join(missing)} in the trace (it has: {', '.join(res)})")
    out = {}
    for n in names:
        by_kind = res[n].get("by_kind") or {}
        if kind and kind in by_kind:
            out[n] = (f"{kind} steps", pieces(by_kind[kind]))
        else:
            out[n] = ("decode steps", pieces(res[n]["decode"]))
    return out


def plot(rows: dict, out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = []
    for _, ps in rows.values():
        labels += [lb for lb, _ in ps if lb not in labels]
    labels.sort(key=lambda lb: lb.startswith("rest"))  # the remainder last, as in every bar
    colors = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.7 * len(rows)))
    names = list(rows)
    starts = {}  # (server, label) -> where its piece begins: the pieces before it in its own bar
    for n in names:
        x = 0.0
        for lb, ms in rows[n][1]:
            starts[n, lb] = x
            x += ms
    for li, label in enumerate(labels):
        widths = [dict(rows[n][1]).get(label, 0.0) for n in names]
        lefts = [starts.get((n, label), 0.0) for n in names]
        ax.barh(range(len(names)), widths, left=lefts, color=colors(li % 20), label=label)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{n}\n({rows[n][0]})" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("host time per decode step, ms (mean)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="the JSON of lab/step_trace.py --json")
    ap.add_argument("--png", required=True)
    ap.add_argument("--servers", default="", help="comma-separated, in order (default: all)")
    ap.add_argument("--kind", default=None,
                    help="e.g. lean: that kind of step where a server has it")
    ap.add_argument("--title", default="host time per decode step by piece (step tracer)")
    a = ap.parse_args(argv)
    try:
        with open(a.trace) as f:
            doc = json.load(f)
        rows = table(doc, [s for s in a.servers.split(",") if s], a.kind)
    except (OSError, ValueError, KeyError) as e:
        print(f"step_cost_picture: {a.trace}: {e}", file=sys.stderr)
        return 2
    plot(rows, a.png, a.title)
    for n, (which, ps) in rows.items():
        print(f"{n} ({which}): " + ", ".join(f"{lb} {ms:.3f}" for lb, ms in ps)
              + f"; total {sum(ms for _, ms in ps):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
