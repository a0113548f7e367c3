"""Stage 6: human-readable summaries of plans."""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

from solvers import Plan, Problem
from solvers.budget import format_bytes


def format_seconds(s: float | None) -> str:
    """Seconds as text in the unit that suits them (s, ms, us, ns); None or NaN is "-"."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _op_label(op: str) -> str:
    # "aten.mm.default" -> "mm"
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] in ("aten", "prims") else op


def counts_by_op(problem: Problem, names: Iterable[str]) -> list[tuple[str, int]]:
    return Counter(_op_label(problem.by_name[n].op) for n in names).most_common()


def describe_plan(problem: Problem, plan: Plan, *, top: int = 8) -> str:
    """What is saved and what is recomputed, by op, with predicted memory and cost."""
    lines = [
        f"solver {plan.solver}: status {plan.status.value}, solved in {plan.solve_time_s:.3f} s"
        + (f", gap {plan.gap:.2%}" if plan.gap is not None else ""),
        f"  saved for backward : {len(plan.saved):5d} values, {format_bytes(plan.saved_bytes)} predicted"
        + (f" (budget {format_bytes(plan.budget)})" if plan.budget is not None else ""),
        f"  recomputed         : {len(plan.recomputed):5d} values, predicted cost {format_seconds(plan.recompute_cost)}",
    ]
    for title, names in (("saved", plan.saved), ("recomputed", plan.recomputed)):
        ops = counts_by_op(problem, names)[:top]
        if ops:
            lines.append(f"  {title:10s} by op: " + ", ".join(f"{op} x{n}" for op, n in ops))
    reasons = Counter(getattr(problem, "ban_reasons", {}).values()).most_common(top)
    if reasons:  # why values the plan may not recompute are saved (random ops, impure custom ops)
        lines.append("  never recomputed   : " + ", ".join(f"{why} x{n}" for why, n in reasons))
    if plan.message:
        lines.append(f"  note: {plan.message}")
    return "\n".join(lines)


def table(rows: Sequence[dict], columns: Sequence[str], *, width: int | None = None, keep: int = 0) -> str:
    """A plain aligned text table. With ``width``, a table wider than that is cut into blocks of
    columns that fit, one under the other, each repeating the first ``keep`` columns (the row keys)."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]

    def block(idx: Sequence[int]) -> str:
        out = ["  ".join(columns[i].ljust(widths[i]) for i in idx).rstrip(),
               "  ".join("-" * widths[i] for i in idx)]
        out += ["  ".join(row[i].ljust(widths[i]) for i in idx).rstrip() for row in cells]
        return "\n".join(out)

    everything = list(range(len(columns)))
    if width is None or sum(widths) + 2 * (len(widths) - 1) <= width:
        return block(everything)
    blocks: list[list[int]] = []
    head = everything[:keep]
    used = sum(widths[i] + 2 for i in head)
    for i in everything[keep:]:
        if not blocks or (used + widths[i] > width and len(blocks[-1]) > len(head)):
            blocks.append(list(head))
            used = sum(widths[j] + 2 for j in head)
        blocks[-1].append(i)
        used += widths[i] + 2
    return "\n\n".join(block(b) for b in blocks)


def cost_table(roofline: Problem, profiled: Problem) -> str:
    """Recompute costs per op kind, estimated (roofline) and measured (``costs="profile"``): where
    the two disagree most is where plans change."""
    rows: dict[str, list[float]] = {}
    for node in profiled.candidates:
        est = roofline.recompute_cost_of(node.name)
        got = profiled.recompute_cost_of(node.name)
        if est == 0 and got == 0:
            continue
        row = rows.setdefault(node.op or "?", [0, 0.0, 0.0])
        row[0] += 1
        row[1] += est
        row[2] += got
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][2])
    return table([{"op": op, "ops": int(n), "roofline us": f"{est * 1e6:.3f}", "measured us": f"{got * 1e6:.3f}",
                   "measured / roofline": f"{got / est:.1f}x" if est > 0 else "-"}
                  for op, (n, est, got) in ordered],
                 ["op", "ops", "roofline us", "measured us", "measured / roofline"])
