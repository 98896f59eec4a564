"""How `benchmarks.families` scores a case and summarises a half: the best fixed
policy whose answer is one, `Auto` over it and over plain lineax (see
`benchmarks/families.py`'s docstring)."""

from statistics import median

from benchmarks import families_cases as fc, harness
from benchmarks.auto_report import AUTO_FOR, BASELINE, FIXED, score, SCORES


TARGET_MEDIAN, TARGET_WORST = 1.05, 1.5
# Relative difference from `Lazy`'s answer within which a failed solve's answer
# is still one (float32 solves of one system differ by about 1e-5 between
# policies; a wrong answer by 1e-2 and more).
ANSWER_TOLERANCE = 1e-3
# Auto's first call over plain lineax's, above which it counts as slower.
SLOWER_THAN_LINEAX = 1.05
# `Auto(race=False)` for each score (`--unraced`), named after the Auto variant.
UNRACED = {auto: f"{auto} unraced" for auto in AUTO_FOR.values()}


def answer_ok(result: dict) -> bool:
    """Whether a variant's answer is one: it reported success, or it is within
    `ANSWER_TOLERANCE` of `Lazy`'s."""
    if result.get("all_successful", True):
        return True
    return result.get("rel_err_vs_lazy", 0.0) <= ANSWER_TOLERANCE


def case_score(results: dict, runs: int) -> dict:
    """At one score: the best fixed policy (plain lineax among the candidates)
    whose answer is one (`answer_ok`; every one where none is), and Auto (told
    that number of runs) over it, and over plain lineax."""
    totals = {v: score(t, runs) for v, t in results.items()}
    fixed = [v for v in FIXED + (BASELINE,) if v in totals]
    candidates = [v for v in fixed if answer_ok(results[v])] or fixed
    best = min(candidates, key=totals.get)
    auto, unraced = AUTO_FOR[runs], UNRACED[AUTO_FOR[runs]]
    out = dict(
        totals=totals,
        best=best,
        not_answers=[v for v in fixed if v not in candidates],
        auto_choice=results[auto]["choice"]["strategy"],
        auto_over_best=totals[auto] / totals[best],
        auto_answer_ok=answer_ok(results[auto]),
        auto_over_lineax=totals[auto] / totals[BASELINE],
        lineax_answer_ok=answer_ok(results[BASELINE]),
    )
    if unraced in totals:
        out["unraced_choice"] = results[unraced]["choice"]["strategy"]
        out["unraced_over_best"] = totals[unraced] / totals[best]
    return out


def summary(rows: list[dict]) -> dict:
    """Per half and score: the median and worst of Auto over the best."""
    fit, held = fc.split(fc.cases())
    halves = dict(fit={c.label for c in fit}, held_out={c.label for c in held})
    out: dict = {}
    for half, labels in halves.items():
        mine = [r for r in rows if r["label"] in labels]
        if not mine:
            continue
        out[half] = {}
        for runs in map(str, SCORES):
            ratios = [r["scores"][runs]["auto_over_best"] for r in mine]
            scores = [r["scores"][runs] for r in mine]
            out[half][runs] = dict(
                cases=len(ratios),
                median=median(ratios),
                worst=max(ratios),
                met=median(ratios) <= TARGET_MEDIAN and max(ratios) <= TARGET_WORST,
                auto_answers_not_ok=[
                    r["label"] for r, s in zip(mine, scores) if not s["auto_answer_ok"]
                ],
                slower_than_lineax=[
                    r["label"]
                    for r, s in zip(mine, scores)
                    if s["lineax_answer_ok"]
                    and s["auto_over_lineax"] > SLOWER_THAN_LINEAX
                ],
            )
            decision = decision_seconds(mine, AUTO_FOR[int(runs)])
            if decision:
                out[half][runs].update(decision)
            unraced = [r["scores"][runs].get("unraced_over_best") for r in mine]
            if None not in unraced:
                out[half][runs]["unraced_median"] = median(unraced)
                out[half][runs]["unraced_worst"] = max(unraced)
    return out


def decision_seconds(rows: list[dict], variant: str) -> dict:
    """What `variant`'s decisions cost over `rows` (cases measured with
    `lxd.jit`'s stage seconds): the median and largest seconds of its analysis
    and rewrite (`decide` + `rewrite`), and their median share of its first call
    (trace to run); empty where no case has the stages."""
    found = [
        (stages["decide"] + stages["rewrite"], r["results"][variant]["total_s"])
        for r in rows
        if (stages := r["results"][variant].get("stages")) is not None
    ]
    if not found:
        return {}
    return dict(
        decision_median_s=median(s for s, _ in found),
        decision_worst_s=max(s for s, _ in found),
        decision_share_median=median(s / total for s, total in found),
    )


def format_rows(rows: list[dict], totals: dict) -> str:
    lines = [f"{'case':<44} {'runs':>4} {'best':<12} {'Auto chose':<24} Auto/best"]
    for row in rows:
        for runs in map(str, SCORES):
            s = row["scores"][runs]
            lines.append(
                f"{row['label']:<44} {runs:>4} {s['best']:<12} "
                f"{s['auto_choice'][:24]:<24} {s['auto_over_best']:.2f}"
            )
    for half, by_runs in totals.items():
        for runs, s in by_runs.items():
            lines.append(
                f"{half:<9} runs={runs:<4} cases {s['cases']:>2}: median "
                f"{s['median']:.3f}, worst {s['worst']:.3f} "
                f"(target {TARGET_MEDIAN}, {TARGET_WORST}: {harness.met(s['met'])})"
            )
            if "unraced_median" in s:
                lines.append(
                    f"{'':<9} Auto(race=False): median {s['unraced_median']:.3f}, "
                    f"worst {s['unraced_worst']:.3f}"
                )
            if "decision_median_s" in s:
                lines.append(
                    f"{'':<9} Auto's analysis and rewrite: median "
                    f"{s['decision_median_s']:.4f} s, largest "
                    f"{s['decision_worst_s']:.4f} s; median share of its first "
                    f"call {s['decision_share_median']:.1%}"
                )
            for key, what in (
                (
                    "slower_than_lineax",
                    f"over plain lineax's by > {SLOWER_THAN_LINEAX}",
                ),
                ("auto_answers_not_ok", "Auto's answer not one"),
            ):
                found = s.get(key, [])
                lines.append(
                    f"{'':<9} {what}: {len(found)}"
                    + "".join(f"\n{'':<11}{label}" for label in found)
                )
    return "\n".join(lines)
