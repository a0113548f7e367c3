"""Stage 6: human-readable summaries of plans."""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

from solvers import Plan, Problem
from solvers.budget import column_time_unit, format_bytes, format_seconds
from solvers.progress import Progress

__all__ = ["clean_module", "cost_table", "counts_by_op", "describe_plan", "format_seconds", "op_label", "search_text",
           "short_op", "table"]


def search_text(p: Progress) -> str:
    """``phase P, best B, bound L, gap G`` of a search (the parts it has)."""
    parts = [f"phase {p.phase}"] if getattr(p, "phase", "") else []
    parts += [f"best {format_seconds(p.incumbent)}", f"bound {format_seconds(p.bound)}"]
    if p.gap is not None:
        parts.append(f"gap {p.gap:.1%}")
    return ", ".join(parts)


def short_op(op: str) -> str:
    """An op as tables name it: ``aten.mm.default`` -> ``mm``, ``<built-in function getitem>`` ->
    ``getitem``."""
    m = re.fullmatch(r"<(?:built-in )?function ([\w.]+)(?: at 0x[0-9a-f]+)?>", op)
    if m:
        return m.group(1).rsplit(".", 1)[-1]
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] in ("aten", "prims") else op


def op_label(op: str, role: str) -> str:
    """What a value is, in every table and hover: its short op, or "graph input" for the graph's
    inputs (parameters, data, tangents: FX's placeholders and attributes)."""
    if role == "input" or op in ("placeholder", "get_attr"):
        return "graph input"
    return short_op(op) or "?"


def clean_module(path: str) -> str:
    """dynamo's ``L['self'].layers[0].fc`` -> ``layers.0.fc``."""
    m = re.sub(r"^L\['self'\]\.?", "", path or "")
    m = re.sub(r"\['([^']*)'\]", r".\1", m)
    m = re.sub(r"\[(\d+)\]", r".\1", m)
    return m.lstrip(".")


def counts_by_op(problem: Problem, names: Iterable[str]) -> list[tuple[str, int]]:
    by_name = problem.by_name
    return Counter(op_label(by_name[n].op, by_name[n].role.value) for n in names).most_common()


def describe_plan(problem: Problem, plan: Plan, *, top: int = 8) -> str:
    """What is saved and what is recomputed, by op, with predicted memory and cost."""
    lines = [
        f"solver {plan.solver}: status {plan.status.value}, solved in {format_seconds(plan.solve_time_s)}"
        + (f", gap {plan.gap:.2%}" if plan.gap is not None else ""),
        f"  saved for backward : {len(plan.saved):5d} values, {format_bytes(plan.saved_bytes)} predicted"
        + (f" (budget {format_bytes(plan.budget)})" if plan.budget is not None else ""),
        f"  recomputed         : {len(plan.recomputed):5d} values, "
        f"predicted cost {format_seconds(plan.recompute_cost)}",
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
        row = rows.setdefault(short_op(node.op) or "?", [0, 0.0, 0.0])
        row[0] += 1
        row[1] += est
        row[2] += got
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][2])
    unit = column_time_unit(t for _, (_, est, got) in ordered for t in (est, got))  # both columns in one unit
    return table([{"op": op, "ops": int(n), "roofline": format_seconds(est, unit),
                   "measured": format_seconds(got, unit),
                   "measured / roofline": f"{got / est:.1f}x" if est > 0 else "-"}
                  for op, (n, est, got) in ordered],
                 ["op", "ops", "roofline", "measured", "measured / roofline"])
