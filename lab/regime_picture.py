"""Where each mode crosses plain: tok/s ratio to plain against the per-call all-reduce cost of the
verify pass, predicted from the pass-cost model at the accept lengths an emulated evaluation
measured, with that evaluation's measured points on it.

    python lab/regime_picture.py SUMMARY.json PREDICTION.json --png OUT.png [--json OUT.json]
                                 [--also OTHER_SUMMARY.json ...]

SUMMARY.json: an evaluation under the pass-cost emulator (lab/gpu/evaluate.sh, one profile);
PREDICTION.json: lab/predict_vs_measured.py's answer for it (each c=1 cell's accept lengths, share
of verifying steps and the measured minus predicted ms per step). The sweep scales that profile's
all-reduce curve by a factor s (compute and the number of all-reduces held), so a pass of n tokens
costs compute(n) + allreduces * s * ar(n); the x axis is s * ar(8), the cost of one all-reduce of
the 8-token verify pass. Per mode, one stream:

    plain     1 token per (pass(1) + r_plain) ms
    tree D    A tokens per (pass(D) + r_tree) ms
    chain+w   A tokens per (v * pass(D) + (1 - v) * pass(1) + r) ms, v its share of verifying steps
              (priced at the widest width, as advise does)
    auto      the better of plain and chain + widths at their measured figures (auto chooses
              among the same options; steady acceptance)

r: the evaluation's measured minus predicted ms per step of that server (the served model's own
pass and the host's per-step work, which the profile leaves out), held over the sweep; each mode
is drawn with r (what this emulated setup does) and without it (the profile alone, advise's
model). The
profiles shipped with fastverify are marked at their own 8-token all-reduce cost (their curves
differ in shape from the swept one: a marker places them, it does not measure them). Everything
is a model but the measured points (emulated communication on one GPU, never a PCIe
measurement).

``--also``: more emulated evaluations (any profiles, one or more per file); each group's c=1
ratios are drawn at its own profile's 8-token all-reduce cost (its ``--emulate-pass-cost NAME``),
measured points beside the swept model, so that where each mode crosses plain can be read off
measurements as well (profiles differ in the shape of their curves and, where they say so, in
their compute: a point is that profile's measurement, the curve one profile's model).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from fastverify import passcost  # noqa: E402

SET = "all"  # the c=1 cell of all prompts


def _rows(pred: dict) -> tuple:
    """(profile, server -> its row of the c=1 'all' cell) of predict_vs_measured's JSON."""
    for g in pred["groups"]:
        rows = {r["server"]: r for r in g["rows"] if r["set"] == SET and r["c"] == 1}
        if rows:
            return g["profile"], rows
    raise SystemExit(f"regime_picture: no '{SET}' c=1 cell in the prediction")


def model(profile, rows: dict, scale: float, residual: bool = True) -> dict:
    """Predicted tok/s per mode at all-reduce scale ``scale`` (module docstring); without
    ``residual`` the profile's pass costs alone (advise's model)."""
    def pass_ms(n):
        return profile.compute_pass_ms(n) + profile.allreduces_per_pass * scale \
            * profile.ar_us(n) / 1000.0

    def resid(name):
        v = rows.get(name, {}).get("step_ms_left_out")
        return float(v) if v is not None and residual else 0.0

    out = {"plain": 1000.0 / (pass_ms(1) + resid("A"))}
    if "tree" in rows:
        d = int(rows["tree"]["shape"].replace("tree", ""))
        out["tree"] = rows["tree"]["accept_length"] * 1000.0 / (pass_ms(d) + resid("tree"))
    if "chain_w" in rows:
        r = rows["chain_w"]
        d = int(r["shape"].split("+")[0].replace("chain", "")) + 1  # chainK+widths: K + 1 tokens
        v = r["verified_share"]
        step = v * pass_ms(d) + (1 - v) * pass_ms(1) + resid("chain_w")
        out["chain_w"] = r["accept_length"] * 1000.0 / step
        out["auto"] = max(out["plain"], out["chain_w"])
    return out


def _measured(cells) -> dict:
    """server -> its c=1 'all' decode ratio, interval and accept length."""
    out = {}
    for c in cells:
        if c["set"] != SET or c["c"] != 1:
            continue
        for sname, s in c["servers"].items():
            dec = s.get("decode") or {}
            if dec.get("ratio") is not None:
                out[sname] = {"ratio": dec["ratio"], "ci": dec.get("ci95"),
                              "accept_length": s.get("accept_length")}
    return out


def group_profile(group: dict):
    """The emulated profile of an evaluation group (``--emulate-pass-cost NAME`` among its
    flags), else None."""
    m = re.search(r"--emulate-pass-cost[ =](\S+)", group.get("group_flags") or "")
    return m.group(1) if m else None


def measured_by_profile(summaries) -> dict:
    """profile -> {'x_us': its 8-token all-reduce cost, 'servers': _measured(...)} over every
    emulated group of ``summaries``; a profile measured twice keeps the later file's."""
    out = {}
    for summary in summaries:
        for g in summary["groups"]:
            name = group_profile(g)
            if name is None:
                continue
            out[name] = {"x_us": passcost.load_profile(name).ar_us(8),
                         "servers": _measured(g["cells"])}
    return out


def build(summary: dict, pred: dict, also=()) -> dict:
    name, rows = _rows(pred)
    profile = passcost.load_profile(name)
    base = profile.ar_us(8)
    xs = [base * 10 ** (e / 40.0) for e in range(-100, 41)]  # 1/316 .. 10x the profile's cost
    curves, cross = {}, {}
    for tag, residual in (("", True), ("_profile_only", False)):
        for x in xs:
            m = model(profile, rows, x / base, residual)
            for k, v in m.items():
                curves.setdefault(k + tag, []).append(v / m["plain"])
    for k, ys in curves.items():
        if k.startswith("plain"):
            continue
        # strictly above: auto is plain's rate wherever no chain beats it
        above = [x for x, y in zip(xs, ys) if y > 1.0 + 1e-9]
        cross[k] = max(above) if above else None
    marks = {}
    for p in passcost.builtin_names():
        marks[p] = passcost.load_profile(p).ar_us(8)
    measured = {}
    for g in summary["groups"]:
        measured.update(_measured(g["cells"]))
    others = {k: v for k, v in measured_by_profile(also).items() if k != name}
    return {"profile": name, "x_profile_us": base, "xs_us": xs, "curves": curves,
            "crosses_plain_below_us": cross, "profiles_at_8_tokens_us": marks,
            "measured_at_profile": measured, "measured_other_profiles": others,
            "cell": f"{SET} c=1"}


def _point(ax, x: float, m: dict, **style) -> None:
    """One measured ratio at x with its 95 % interval (none: a bare point)."""
    lo, hi = (m["ci"] or [m["ratio"], m["ratio"]])
    ax.errorbar([x], [m["ratio"]], yerr=[[m["ratio"] - lo], [hi - m["ratio"]]], ms=7, capsize=3,
                **style)


def plot(doc: dict, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = {"tree": "tab:red", "chain_w": "tab:blue", "auto": "tab:green"}
    labels = {"tree": "stock tree 8", "chain_w": "chain + widths", "auto": "auto"}
    ax.axhline(1.0, color="k", ls="--", lw=1, label="plain")
    for k, ys in doc["curves"].items():
        if k.startswith("plain"):
            continue
        base = k.replace("_profile_only", "")
        only = k != base
        ax.plot(doc["xs_us"], ys, color=colors.get(base), lw=0.9 if only else 1.8,
                ls="--" if only else "-",
                label=f"{labels.get(base, base)}: "
                      + ("profile alone" if only else "profile + this run's host residual"))
        x = doc["crosses_plain_below_us"].get(k)
        if x:
            ax.axvline(x, color=colors.get(base), ls=":", lw=1)
    srv = {"tree": "tree", "chain_w": "chain_w", "auto": "auto_w"}
    for k, name in srv.items():
        m = doc["measured_at_profile"].get(name)
        if not m:
            continue
        _point(ax, doc["x_profile_us"], m, fmt="o", color=colors[k],
               label=f"{labels[k]} measured (emulated {doc['profile']})")
    for j, (prof, m_all) in enumerate(sorted(doc.get("measured_other_profiles", {}).items())):
        for k, name in srv.items():
            m = m_all["servers"].get(name)
            if not m:
                continue
            _point(ax, m_all["x_us"], m, fmt="s", mfc="none", color=colors[k],
                   label=f"{labels[k]} measured (other emulated profiles)" if j == 0 else None)
    ymax = max(1.6, max(max(v) for k, v in doc["curves"].items()) * 1.05)
    for p, x in doc["profiles_at_8_tokens_us"].items():
        ax.axvline(x, color="0.6", lw=0.8)
        ax.text(x, ymax * 0.98, p, rotation=90, va="top", ha="right", fontsize=7, color="0.35")
    ax.set_xscale("log")
    ax.set_ylim(0, ymax)
    ax.set_xlabel("one all-reduce of the 8-token verify pass (us, log); compute held at the "
                  "profile's")
    ax.set_ylabel("decode tok/s / plain (one stream)")
    ax.set_title(f"SmolLM2 acceptance (c=1, all prompts) under {doc['profile']}'s pass costs, "
                 "swept; dotted: where a mode crosses plain", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary")
    ap.add_argument("prediction")
    ap.add_argument("--png", required=True)
    ap.add_argument("--json")
    ap.add_argument("--also", action="append", default=[], metavar="SUMMARY.json",
                    help="another emulated evaluation whose c=1 ratios are drawn at its "
                         "profile's cost (repeatable)")
    a = ap.parse_args(argv)
    try:
        with open(a.summary) as f:
            summary = json.load(f)
        with open(a.prediction) as f:
            pred = json.load(f)
        also = []
        for path in a.also:
            with open(path) as f:
                also.append(json.load(f))
        doc = build(summary, pred, also)
    except (OSError, ValueError, KeyError) as e:
        print(f"regime_picture: {e}", file=sys.stderr)
        return 2
    doc["repro"] = "python lab/regime_picture.py " + " ".join(argv or sys.argv[1:])
    plot(doc, a.png)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    lo, hi = doc["xs_us"][0], doc["xs_us"][-1]
    print(f"# sweep {lo:.2f}-{hi:.0f} us per all-reduce of the 8-token pass "
          f"({doc['profile']}: {doc['x_profile_us']:.1f})")
    for k, x in doc["crosses_plain_below_us"].items():
        print(f"{k}: above plain below {x:.1f} us" if x else f"{k}: never above plain")
    for k, m in doc["measured_at_profile"].items():
        print(f"measured {k}: {m['ratio']:.3f} x plain at {doc['x_profile_us']:.1f} us")
    for prof, m_all in sorted(doc["measured_other_profiles"].items(), key=lambda kv: kv[1]["x_us"]):
        for k, m in m_all["servers"].items():
            print(f"measured {k}: {m['ratio']:.3f} x plain at {m_all['x_us']:.1f} us ({prof})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
