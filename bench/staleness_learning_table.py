#!/usr/bin/env python3
"""The table of bench/staleness_learning.sh: reads OUT/runs/TRAINER-kK-sSEED/ (each run's
report.json, wall_seconds, rc and run.log) and OUT/sim/*/seedS/report.json, prints a markdown
table per trainer and the simulator's prediction per k, and writes OUT/results.tsv (one row per
run), OUT/results.json (runs, per-k summaries, simulations) and the table as OUT/table.markdown.

Per run, from its report.json:
  acc_before, acc_after   eval_accuracy_before / _after (greedy, on eval_problems held-out problems;
                          the table also gives the gain, after - before, per k)
  final_reward_10         mean of per_step[].reward over the last 10 RL steps
  final_reward_5          the report's final_reward (the last 5 steps' batches)
  wait_s                  trainer_wait.total_seconds
  rl_s                    the RL phase's wall time: per_step[-1].seconds (seconds since the RL
                          phase started, at the end of the last step)
  idle_frac               wait_s / rl_s
  dropped_stale           sum of regions[].groups_dropped_stale (the report's
                          trajectories_dropped_stale is given too, as dropped_stale_orch)
  mean_lag                mean of per_step[].mean_lag weighted by per_step[].groups
  max_lag                 the largest per_step[].max_lag
  wall_s                  the whole `weft run` (start-up, warm-up, RL phase, evaluation, report)

Usage: staleness_learning_table.py OUT [--ks "0 1 2 4 8"] [--seeds "1 2 3"] [--trainers "..."]
"""
import argparse
import glob
import json
import math
import os
import statistics


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def log_tail(path, lines=12):
    try:
        with open(path, errors="replace") as f:
            text = f.read().replace("\r", "\n")
    except OSError:
        return ""
    rows = [r for r in text.split("\n") if r.strip()]
    return "\n".join(rows[-lines:])


def run_figures(d):
    rep = load(os.path.join(d, "run", "report.json"))
    rc = read_text(os.path.join(d, "rc"))
    wall = read_text(os.path.join(d, "wall_seconds"))
    row = {"rc": int(rc) if rc not in (None, "") else None,
           "wall_s": float(wall) if wall else None}
    if rep is None:
        row.update(completed=False, failure="no report.json",
                   log_tail=log_tail(os.path.join(d, "run.log")))
        return row
    steps = rep.get("per_step") or []
    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    groups = sum(s.get("groups") or 0 for s in steps)
    lag = (sum((s.get("mean_lag") or 0) * (s.get("groups") or 0) for s in steps) / groups
           if groups else None)
    rl_s = steps[-1].get("seconds") if steps else None
    wait = (rep.get("trainer_wait") or {}).get("total_seconds")
    regions = rep.get("regions") or []
    row.update(
        completed=bool(rep.get("completed")),
        failure=rep.get("failure"),
        steps=rep.get("steps"),
        acc_before=rep.get("eval_accuracy_before"),
        acc_after=rep.get("eval_accuracy_after"),
        initial_reward=rep.get("initial_reward"),
        final_reward_5=rep.get("final_reward"),
        final_reward_10=statistics.fmean(rewards[-10:]) if rewards else None,
        wait_s=wait,
        wait_source=(rep.get("trainer_wait") or {}).get("source"),
        rl_s=rl_s,
        idle_frac=(wait / rl_s) if (wait is not None and rl_s) else None,
        dropped_stale=sum(r.get("groups_dropped_stale") or 0 for r in regions),
        dropped_stale_orch=rep.get("trajectories_dropped_stale"),
        delivered_stale=rep.get("trajectories_delivered_stale"),
        groups=groups,
        mean_lag=lag,
        max_lag=max((s.get("max_lag") or 0 for s in steps), default=None),
        staleness_violations=rep.get("staleness_violations"),
    )
    if not row["completed"] or (row["rc"] not in (0, None)):
        row["log_tail"] = log_tail(os.path.join(d, "run.log"))
    return row


def sim_figures(d):
    reps = [r for r in (load(p) for p in sorted(glob.glob(os.path.join(d, "seed*", "report.json"))))
            if r]
    if not reps:
        return None
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return statistics.fmean(xs) if xs else None
    return {
        "seeds": len(reps),
        "steps": mean([r["trainer"]["steps"] for r in reps]),
        "idle_frac": mean([r["trainer"]["idle_fraction"] for r in reps]),
        "mean_lag": mean([r["staleness"]["mean"] for r in reps]),
        "dropped_stale": mean([r["trajectories"]["dropped_stale"] for r in reps]),
    }


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def mean_sd(xs, digits=3):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt(xs[0], digits)
    return f"{statistics.fmean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ks", default="0 1 2 4 8")
    ap.add_argument("--seeds", default="1 2 3")
    ap.add_argument("--trainers", default="builtin torch")
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split()]
    seeds = [int(s) for s in a.seeds.split()]
    trainers = a.trainers.split()

    runs = []
    for t in trainers:
        for k in ks:
            for s in seeds:
                d = os.path.join(a.out, "runs", f"{t}-k{k}-s{s}")
                if not os.path.isdir(d):
                    continue
                row = {"trainer": t, "k": k, "seed": s}
                row.update(run_figures(d))
                runs.append(row)

    sims = {}
    for d in sorted(glob.glob(os.path.join(a.out, "sim", "*-k*"))):
        name = os.path.basename(d)
        variant, k = name.rsplit("-k", 1)
        f = sim_figures(d)
        if f is not None and int(k) in ks:
            sims.setdefault(variant, {})[int(k)] = f

    md = []
    summaries = []
    for t in trainers:
        trs = [r for r in runs if r["trainer"] == t]
        if not trs:
            continue
        cal = sims.get(f"calibrated-{t}", {})
        md.append(f"### {t} trainer\n")
        md.append("Mean ± sample standard deviation over the completed seeds. Final reward: mean "
                  "of per_step reward over the last 10 RL steps. Idle: trainer_wait.total_seconds "
                  "/ RL-phase wall time (per_step[-1].seconds). Stale drops: sum of "
                  "regions[].groups_dropped_stale. Mean lag: per_step mean_lag weighted by groups. "
                  "sim: `weft sim` calibrated on this trainer's reference run (mean over seeds).\n")
        seed_cols = " | ".join(f"acc s{s}" for s in seeds)
        md.append(f"| k | runs ok | acc before | {seed_cols} | acc after (mean) | gain (after - before) | final reward (last 10) "
                  "| idle s | idle frac | stale drops | mean lag | wall s | sim idle frac | sim mean lag | sim stale drops |")
        md.append("|" + "---|" * (13 + len(seeds)))
        for k in ks:
            kr = [r for r in trs if r["k"] == k]
            ok = [r for r in kr if r.get("completed") and r.get("rc") == 0]
            by_seed = {r["seed"]: r for r in kr}
            per_seed = " | ".join(
                fmt(by_seed[s].get("acc_after")) if s in by_seed and by_seed[s].get("completed")
                else ("FAIL" if s in by_seed else "-") for s in seeds)
            c = cal.get(k) or {}
            summary = {
                "trainer": t, "k": k, "runs": len(kr), "completed": len(ok),
                "acc_before": [r.get("acc_before") for r in ok],
                "acc_after": [r.get("acc_after") for r in ok],
                "acc_gain": [r["acc_after"] - r["acc_before"] for r in ok
                             if r.get("acc_after") is not None and r.get("acc_before") is not None],
                "final_reward_10": [r.get("final_reward_10") for r in ok],
                "idle_frac": [r.get("idle_frac") for r in ok],
                "wait_s": [r.get("wait_s") for r in ok],
                "dropped_stale": [r.get("dropped_stale") for r in ok],
                "mean_lag": [r.get("mean_lag") for r in ok],
                "wall_s": [r.get("wall_s") for r in kr],
                "sim_calibrated": c or None,
                "sim_plain": sims.get("plain", {}).get(k),
            }
            summaries.append(summary)
            md.append(f"| {k} | {len(ok)}/{len(kr)} | {mean_sd(summary['acc_before'])} | {per_seed} | "
                      f"{mean_sd(summary['acc_after'])} | {mean_sd(summary['acc_gain'])} | "
                      f"{mean_sd(summary['final_reward_10'])} | "
                      f"{mean_sd(summary['wait_s'], 1)} | {mean_sd(summary['idle_frac'])} | "
                      f"{mean_sd(summary['dropped_stale'], 1)} | {mean_sd(summary['mean_lag'], 2)} | "
                      f"{mean_sd(summary['wall_s'], 0)} | {fmt(c.get('idle_frac'))} | "
                      f"{fmt(c.get('mean_lag'), 2)} | {fmt(c.get('dropped_stale'), 1)} |")
        md.append("")

    for variant in sorted(sims):
        md.append(f"### weft sim, {variant} (mean over seeds)\n")
        md.append("| k | seeds | steps done | idle frac | mean lag | stale drops |")
        md.append("|---|---|---|---|---|---|")
        for k in ks:
            f = sims[variant].get(k)
            if f:
                md.append(f"| {k} | {f['seeds']} | {fmt(f['steps'], 1)} | {fmt(f['idle_frac'])} | "
                          f"{fmt(f['mean_lag'], 2)} | {fmt(f['dropped_stale'], 1)} |")
        md.append("")

    md.append("### Per run\n")
    cols = ["trainer", "k", "seed", "completed", "rc", "steps", "acc_before", "acc_after",
            "final_reward_10", "final_reward_5", "wait_s", "rl_s", "idle_frac", "dropped_stale",
            "dropped_stale_orch", "mean_lag", "max_lag", "wall_s"]
    md.append("| " + " | ".join(cols) + " |")
    md.append("|" + "---|" * len(cols))
    for r in runs:
        md.append("| " + " | ".join(fmt(r.get(c)) if not isinstance(r.get(c), (str, bool))
                                    else str(r.get(c)) for c in cols) + " |")
    failures = [r for r in runs if not r.get("completed") or r.get("rc") not in (0,)]
    if failures:
        md.append("\n### Failures\n")
        for r in failures:
            md.append(f"- {r['trainer']} k={r['k']} seed {r['seed']}: rc {r.get('rc')}, "
                      f"failure: {r.get('failure')}\n```\n{r.get('log_tail', '')}\n```")
    text = "\n".join(md) + "\n"
    print(text)

    with open(os.path.join(a.out, "table.markdown"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": runs, "summaries": summaries, "sims": sims}, f, indent=1)
    with open(os.path.join(a.out, "results.tsv"), "w") as f:
        f.write("\t".join(cols + ["failure"]) + "\n")
        for r in runs:
            f.write("\t".join("" if r.get(c) is None else str(r.get(c)) for c in cols + ["failure"])
                    + "\n")


if __name__ == "__main__":
    main()
