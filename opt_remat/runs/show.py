"""``opt-remat show``: what a plan file saves and recomputes, by op, and what it was made for."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from solvers.budget import column_unit, format_bytes, format_seconds

from ..report import op_label, table
from .offload_view import offload_text


def made_for_lines(made_for: dict[str, Any]) -> list[str]:
    """Who the plans are for: model, dtype, input shapes, capture settings, versions."""
    lines = []
    model = made_for.get("model") or {}
    if model.get("factory"):
        kwargs = ", ".join(f"{k}={v}" for k, v in (model.get("kwargs") or {}).items())
        lines.append(f"model      : {model['factory']}({kwargs})")
    elif model.get("graph"):
        lines.append(f"model      : graph file {model['graph']}")
    if made_for.get("dtype") or made_for.get("inputs"):
        lines.append(f"dtype {made_for.get('dtype', '?')}, inputs {', '.join(made_for.get('inputs') or []) or '-'}")
    cap = made_for.get("capture") or {}
    if cap:
        lines.append(f"captured   : compiler={cap.get('compiler')}, decompositions={cap.get('decompositions')}"
                     + (", fake tensors (no weights)" if cap.get("meta") else ", real tensors"))
    vers = made_for.get("versions") or {}
    if vers:
        lines.append(f"made with  : opt-remat {vers.get('opt_remat', '?')}, torch {vers.get('torch', '?')}")
    if made_for.get("config"):
        lines.append(f"config     : {made_for['config']}")
    if made_for.get("apply"):
        lines.append(f"apply with : {made_for['apply']}")
    return lines


def step_lines(step: dict[str, Any]) -> list[str]:
    """A step of several graphs (a plan file of ``capture.per_layer``): its graphs, peak and split."""
    graphs = ", ".join(f"{g['graph_id']} x{g['repeat']}" + (" (eager's plan)" if g.get("kept") else "")
                       for g in step.get("graphs", []))
    budget = step.get("device_memory") or step.get("peak_budget")
    return [f"step       : {graphs}",
            f"step peak  : {format_bytes(step.get('peak_bytes'))} predicted at {step.get('peak_at')}"
            + (f" (budget {format_bytes(budget)})" if budget else ""),
            f"  by kind  : {kinds_text(step.get('peak_by_kind') or {})}"]


def kinds_text(by_kind: dict[str, int]) -> str:
    """A peak's bytes by kind, largest first, in one unit: ``activations 40.1 GiB, ...``."""
    kinds = sorted(((v, k) for k, v in by_kind.items() if v), reverse=True)
    unit = column_unit(v for v, _ in kinds)
    return ", ".join(f"{k} {format_bytes(v, unit)}" for v, k in kinds)


def show_graph(doc: dict[str, Any], names: bool) -> None:
    nodes: dict[str, dict[str, Any]] = doc.get("nodes") or {}
    gap = doc.get("gap")
    print(f"solver {doc.get('solver')}, status {doc.get('status')}"
          + (f", gap {gap:.2%}" if isinstance(gap, (int, float)) else "")
          + (f", solved in {format_seconds(doc['solve_time_s'])}"
             if isinstance(doc.get("solve_time_s"), (int, float)) else ""))
    print(f"  graph {doc['graph_id']} ({doc.get('graph_nodes', len(doc['values']))} values)")
    budget = doc.get("budget")
    print(f"  saved for backward : {len(doc['saved']):5d} values, {format_bytes(doc.get('saved_bytes'))} predicted"
          + (f" (budget {format_bytes(budget)}"
             + (f" = {doc['budget_spec']}" if doc.get("budget_spec") is not None else "")
             + ")" if budget is not None else ""))
    if doc.get("peak_bytes") is not None:
        print(f"  step peak          : {format_bytes(doc['peak_bytes'])} predicted"
              + (f", of it gradients {format_bytes(doc['peak_gradient_bytes'])}"
                 if doc.get("peak_gradient_bytes") else "")
              + (f" (peak budget {format_bytes(doc['peak_budget'])})" if doc.get("peak_budget") else "")
              + (f" (device {format_bytes(doc['device_memory'])})" if doc.get("device_memory") else ""))
        kinds = kinds_text(doc.get("peak_by_kind") or {})
        if kinds:
            print(f"  peak by kind       : {kinds}")
    print(f"  recomputed         : {len(doc.get('recomputed', [])):5d} values, predicted cost "
          f"{format_seconds(doc.get('recompute_cost'))}")
    if offload_text(doc.get("offload")):
        print(f"  offload            : {offload_text(doc.get('offload'))}")
    if doc.get("message"):
        print(f"  note: {doc['message']}")
    for title, members_all, metric in (("saved", doc["saved"], "bytes"),
                                       ("recomputed", doc.get("recomputed", []), "cost")):
        if not members_all:
            print(f"\n{title}: nothing")
            continue
        if not nodes:
            print(f"\n{title} ({len(members_all)}): " + ", ".join(members_all))
            continue
        groups: dict[str, list[str]] = defaultdict(list)
        for n in members_all:
            info = nodes.get(n, {})
            label = op_label(info.get("op", "?"), info.get("role", ""))
            groups[label].append(n)
        rows: list[dict[str, Any]] = []
        for op, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            if metric == "bytes":  # each storage once; graph inputs are free unless counted
                storages = {nodes.get(m, {}).get("storage", m): nodes.get(m, {}).get("storage_bytes",
                                                                                    nodes.get(m, {}).get("bytes", 0))
                            for m in members}
                total = sum(v or 0 for v in storages.values())
            else:
                total = sum(nodes.get(m, {}).get(metric, 0) or 0 for m in members)
            modules = sorted({nodes.get(m, {}).get("module", "") for m in members} - {""})
            more_modules = f" (+{len(modules) - 4})" if len(modules) > 4 else ""
            more_values = " ..." if len(members) > 6 else ""
            rows.append({"op": op, "count": len(members), metric: total,
                         "modules": (", ".join(modules[:4]) + more_modules) or "-",
                         **({"values": ", ".join(members[:6]) + more_values} if names else {})})
        unit = column_unit(r[metric] for r in rows)  # one unit down the column
        for r in rows:
            r[metric] = format_bytes(r[metric], unit) if metric == "bytes" else format_seconds(r[metric])
        print(f"\n{title} by op:")
        print(table(rows, list(rows[0])))
