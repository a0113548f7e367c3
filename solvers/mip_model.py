"""The 0-1 program of ``solvers.mip`` (see its docstring for the model) and its exact reductions.

``build_model`` writes the program for a problem; ``presolve`` shrinks it without losing an optimal
plan (every reduction keeps at least one least-cost, least-memory plan); ``tie`` restricts it to
one decision per group of values (repeated layers, ``solvers.symmetry``); ``reduce_model`` carries
out the merges and fixings behind both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .disjoint_sets import DisjointSets
from .errors import InfeasibleError
from .problem import Plan, Problem, Role


@dataclass
class Model:
    """The presolved 0-1 program; variables are indices 0..num_vars-1."""

    num_vars: int
    s_var: dict[str, int]  # saveable value -> its s variable
    r_var: dict[str, int]  # recomputable value -> its r variable
    free_saved: list[str]  # saved at no memory cost (always part of the plan's saved set)
    lower: list[int]  # per-variable lower bound (1 where the backward reads the only way to get it)
    covers: Sequence[Sequence[int]]  # sum(x) >= 1
    implications: list[tuple[int, list[int]]]  # x_a <= sum(x_b)
    storage_links: list[tuple[int, list[int]]]  # (y_g, its members' s variables): s_v <= y_g
    mem_var: list[int]  # y_g per counted storage (an s variable when g has one saveable member)
    mem_size: list[int]
    cost: dict[int, float]  # r variable -> recompute cost (only positive costs)
    shared: bool  # some storage has two saveable members: the min-cut overcharges it
    num_relevant: int
    # presolve: a saved value whose saving is dominated -> what a plan saves instead
    replaced: dict[str, str] = field(default_factory=dict)
    merged: int = 0  # variables merged into others by presolve or ties
    fixed: int = 0  # variables fixed to 0 by presolve

    @property
    def num_constraints(self) -> int:
        return (len(self.covers) + len(self.implications)
                + sum(len(m) for _, m in self.storage_links) + 1)


@dataclass
class _Reach:
    """Per candidate value, in topological order: what the program's variables depend on."""

    inputs_of: dict[str, tuple[str, ...]] = field(default_factory=dict)  # deduplicated, ordered
    possible: dict[str, bool] = field(default_factory=dict)  # can be available in the backward
    rec_ok: dict[str, bool] = field(default_factory=dict)  # recomputable (allowed, inputs obtainable)
    free: dict[str, bool] = field(default_factory=dict)  # available at no cost and no memory
    free_saved: list[str] = field(default_factory=list)  # saved at no memory cost


def _reach(problem: Problem) -> _Reach:
    r = _Reach()
    for node in problem.candidates:  # topological order
        name = node.name
        ins = r.inputs_of[name] = tuple(dict.fromkeys(node.inputs))
        cs = problem.can_save(name)
        rec = r.rec_ok[name] = problem.can_recompute(name) and all(r.possible[u] for u in ins)
        r.possible[name] = cs or rec
        if cs and not problem.counts_memory(node.storage_id):
            r.free[name] = True
            r.free_saved.append(name)
        else:
            r.free[name] = (rec and problem.recompute_cost_of(name) == 0.0
                            and all(r.free[u] for u in ins))
    return r


def build_model(problem: Problem) -> Model:
    """Presolve and build the model; raises InfeasibleError when no plan exists at all."""
    reach = _reach(problem)
    possible, rec_ok, free, inputs_of = reach.possible, reach.rec_ok, reach.free, reach.inputs_of

    reads = sorted(problem.backward_reads, key=problem.index.__getitem__)
    impossible = [r for r in reads if not possible[r]]
    if impossible:
        raise InfeasibleError(
            "no valid plan: the backward reads " + ", ".join(repr(r) for r in impossible[:5])
            + " which can be neither saved nor recomputed (check bans and must-recompute tags)")

    # values that matter: reached from the reads through recomputable, non-free values
    relevant: set[str] = set()
    stack = [r for r in reads if not free[r]]
    while stack:
        v = stack.pop()
        if v in relevant:
            continue
        relevant.add(v)
        if rec_ok[v]:
            stack.extend(u for u in inputs_of[v] if not free[u] and u not in relevant)

    s_var: dict[str, int] = {}
    r_var: dict[str, int] = {}
    cost: dict[int, float] = {}
    by_storage: dict[str, list[int]] = {}
    n = 0
    order = sorted(relevant, key=problem.index.__getitem__)
    for v in order:
        if problem.can_save(v):
            s_var[v] = n
            by_storage.setdefault(problem.by_name[v].storage_id, []).append(n)
            n += 1
        if rec_ok[v]:
            r_var[v] = n
            c = problem.recompute_cost_of(v)
            if c > 0:
                cost[n] = c
            n += 1

    def avail(u: str) -> list[int]:
        out = []
        if u in s_var:
            out.append(s_var[u])
        if u in r_var:
            out.append(r_var[u])
        return out

    lower = [0] * n
    covers: list[list[int]] = []
    for r in reads:
        if free[r]:
            continue
        lits = avail(r)
        if len(lits) == 1:
            lower[lits[0]] = 1
        else:
            covers.append(lits)
    implications: list[tuple[int, list[int]]] = []
    for v in order:
        if v in r_var:
            a = r_var[v]
            for u in inputs_of[v]:
                if not free[u]:
                    implications.append((a, avail(u)))

    mem_var: list[int] = []
    mem_size: list[int] = []
    storage_links: list[tuple[int, list[int]]] = []
    for g, members in by_storage.items():
        size = problem.storage_size[g]
        if len(members) == 1:
            y = members[0]
        else:
            y = n
            lower.append(0)
            n += 1
            storage_links.append((y, members))
        if size > 0:
            mem_var.append(y)
            mem_size.append(size)
    return Model(num_vars=n, s_var=s_var, r_var=r_var, free_saved=reach.free_saved, lower=lower,
                  covers=covers, implications=implications, storage_links=storage_links,
                  mem_var=mem_var, mem_size=mem_size, cost=cost, shared=bool(storage_links),
                  num_relevant=len(relevant))


def hint_from_plan(model: Model, plan: Plan) -> list[int]:
    """Variable values of a plan, for solver warm starts."""
    values = [0] * model.num_vars
    for v in plan.saved:
        if v in model.s_var:
            values[model.s_var[v]] = 1
    for v in plan.recomputed:
        if v in model.r_var:
            values[model.r_var[v]] = 1
    for y, members in model.storage_links:
        values[y] = max(values[s] for s in members)
    return values




# ---- reductions --------------------------------------------------------------------------------
def reduce_model(model: Model, merges: Iterable[Sequence[int]], zeros: Iterable[int] = ()) -> Model:
    """The program with each group in ``merges`` made one variable and ``zeros`` fixed to 0.

    Constraints are rewritten on the surviving variables; those that became trivial are dropped
    and the fixings they force (an implication with nothing left on its right side, a storage
    variable fixed to 0) are propagated. Raises InfeasibleError if a variable that must be 1 is
    fixed to 0 (only ties, which restrict the problem, can do that)."""
    sets = DisjointSets(model.num_vars)
    find = sets.find
    for group in merges:
        group = list(group)
        for i in group[1:]:
            sets.union(group[0], i)
    zero_roots = {find(i) for i in zeros}
    while True:
        index: dict[int, int] = {}
        for i in range(model.num_vars):
            root = find(i)
            if root not in zero_roots and root not in index:
                index[root] = len(index)
        f = _mapper(index, find)
        forced: set[int] = set()
        lower = [0] * len(index)
        for i, lb in enumerate(model.lower):
            fi = f(i)
            if lb:
                if fi is None:
                    raise InfeasibleError("the reduced program fixes to 0 a value the backward needs")
                lower[fi] = 1
        covers: set[tuple[int, ...]] = set()
        for lits in model.covers:
            mapped = _mapped(f, lits)
            if not mapped:
                raise InfeasibleError("the reduced program leaves a backward read unobtainable")
            if len(mapped) == 1:
                lower[mapped.pop()] = 1
            else:
                covers.add(tuple(sorted(mapped)))
        implications: set[tuple[int, tuple[int, ...]]] = set()
        for a, bs in model.implications:
            fa = f(a)
            if fa is None:
                continue
            mapped = _mapped(f, bs)
            if fa in mapped:
                continue
            if not mapped:
                forced.add(find(a))
                continue
            implications.add((fa, tuple(sorted(mapped))))
        links: dict[int, set[int]] = {}
        for y, members in model.storage_links:
            fy = f(y)
            if fy is None:
                forced.update(find(m) for m in members if f(m) is not None)
                continue
            links.setdefault(fy, set()).update(_mapped(f, members) - {fy})
        if forced:
            zero_roots |= forced
            continue
        break
    mem: dict[int, int] = {}
    for y, size in zip(model.mem_var, model.mem_size):
        fy = f(y)
        if fy is not None:
            mem[fy] = mem.get(fy, 0) + size
    cost: dict[int, float] = {}
    for i, c in model.cost.items():
        fi = f(i)
        if fi is not None:
            cost[fi] = cost.get(fi, 0.0) + c
    return replace(
        model, num_vars=len(index), s_var=_mapped_vars(f, model.s_var), r_var=_mapped_vars(f, model.r_var),
        lower=lower, covers=sorted(covers), implications=sorted((a, list(b)) for a, b in implications),
        storage_links=sorted((y, sorted(m)) for y, m in links.items() if m),
        mem_var=list(mem), mem_size=list(mem.values()), cost=cost,
        merged=model.merged + sum(1 for i in range(model.num_vars) if find(i) != i
                                  and find(i) not in zero_roots),
        fixed=model.fixed + sum(1 for i in range(model.num_vars) if find(i) in zero_roots))


def presolve(problem: Problem, model: Model, *, for_peak: bool = False) -> Model:
    """Exact reductions by dominance (each keeps some least-cost, least-memory plan):

    * a view saved instead of its base: a value sharing its base's storage, free to recompute
      from it (cost 0, its only other inputs free) is never saved: saving the base instead
      holds the same storage, and the view is recomputed for nothing. For the step's peak
      (``for_peak``) only where the view is read directly by the backward no earlier than the
      base is read, directly or through its other consumers: a saved view's storage is freed at
      the view's last use, a saved base's at the base's, which adds to the view's uses (the view
      is recomputed from the base where it is needed) only those other reads (measured: a random
      problem whose base, read after its view, peaked at 400 bytes saving the view, 480 saving
      the base). Also counting reads through the view itself, tried: 32-layer small LLaMA at
      0.6x left a 12.5% gap (1.2% without), dropping the reduction for every view 21%;
    * a value the backward does not read, which only one recomputable value w consumes, is
      not saved when w can be saved and w's storage is no larger: saving w instead uses no more
      memory and spares w's recomputation;
    * a chain: a value that cannot (or need not) be saved, is not read by the backward and feeds
      one recomputable value w is recomputed exactly when w is, so r_v and r_w become one variable.

    Checks run on the current state, one reduction at a time, so applying them in sequence is sound.
    """
    by_name = problem.by_name
    reads = problem.backward_reads
    r_users = {v: [w for w in problem.users[v] if w in model.r_var] for v in model.r_var.keys() | model.s_var.keys()}
    size = problem.storage_size
    members: dict[str, set[str]] = {}
    for v in model.s_var:
        members.setdefault(by_name[v].storage_id, set()).add(v)
    zeroed: set[str] = set()  # values whose s variable is fixed to 0
    replaced: dict[str, str] = {}

    def saveable(v: str) -> bool:
        return v in model.s_var and v not in zeroed

    # for_peak: each forward-side value's last direct read by the backward (positions in graph
    # order; the required values at the end), and the last of its own and its descendants'
    last_read: dict[str, int] = {}
    latest: dict[str, int] = {}
    if for_peak:
        for i, n in enumerate(problem.nodes):
            if n.role is Role.BACKWARD:
                for u in n.inputs:
                    if by_name[u].role is not Role.BACKWARD:
                        last_read[u] = i
        for r in problem.required:
            if by_name[r].role is not Role.BACKWARD:
                last_read[r] = len(problem.nodes)
        for n in reversed(problem.nodes):
            if n.role is not Role.BACKWARD:
                latest[n.name] = max([last_read.get(n.name, -1)]
                                     + [latest[w] for w in problem.users[n.name] if w in latest])

    def other_uses(base: str, view: str) -> int:
        # the latest the base is read, or read through a value other than the view
        return max([last_read.get(base, -1)]
                   + [latest[u] for u in problem.users[base] if u != view and u in latest])

    def non_free_inputs(v: str) -> list[str]:
        return [u for u in dict.fromkeys(by_name[v].inputs) if u in model.s_var or u in model.r_var]

    for v in sorted(model.s_var, key=problem.index.__getitem__):
        ins = non_free_inputs(v)
        g = by_name[v].storage_id
        if (v in model.r_var and problem.recompute_cost_of(v) == 0.0 and len(ins) == 1
                and by_name[ins[0]].storage_id == g and saveable(ins[0])
                and (not for_peak or last_read.get(v, -1) >= other_uses(ins[0], v))):
            zeroed.add(v)
            replaced[v] = ins[0]
            members[g].discard(v)
    # in graph order, so that a chain v -> w -> x collapses onto x
    for v in sorted(model.s_var, key=problem.index.__getitem__):
        if v in zeroed or v in reads or len(r_users[v]) != 1:
            continue
        w = r_users[v][0]
        g, gw = by_name[v].storage_id, by_name[w].storage_id
        if saveable(w) and members[g] == {v} and g != gw and size[gw] <= size[g]:
            zeroed.add(v)
            replaced[v] = w
            members[g].discard(v)
    merges = []
    for v in model.r_var:
        if v not in reads and not saveable(v) and len(r_users[v]) == 1:
            merges.append((model.r_var[v], model.r_var[r_users[v][0]]))
    reduced = reduce_model(model, merges, [model.s_var[v] for v in zeroed])
    return replace(reduced, replaced={**model.replaced, **replaced})


def normalize_saved(model: Model, saved: Iterable[str]) -> set[str]:
    """A saved set with presolve's dominated savings replaced (no costlier, no more memory)."""
    out = set(saved)
    stack = [v for v in out if v in model.replaced]
    while stack:
        v = stack.pop()
        if v in out and v in model.replaced:
            out.discard(v)
            w = model.replaced[v]
            if w not in out:
                out.add(w)
                stack.append(w)
    return out


def _mapper(index: dict[int, int], find: Callable[[int], int]) -> Callable[[int], int | None]:
    """A variable's new index: its group's (None: fixed to 0)."""
    return lambda i: index.get(find(i))


def _mapped(f: Callable[[int], int | None], items: Iterable[int]) -> set[int]:
    return {j for j in map(f, items) if j is not None}


def _mapped_vars(f: Callable[[int], int | None], variables: dict[str, int]) -> dict[str, int]:
    return {v: j for v, j in ((v, f(i)) for v, i in variables.items()) if j is not None}


def tie(model: Model, groups: Iterable[Sequence[str]]) -> Model:
    """The program restricted to one decision per group of values: members' s variables are one
    variable, and so are their r variables (members without the variable are left alone)."""
    merges = []
    for group in groups:
        for var in (model.s_var, model.r_var):
            idx = [var[v] for v in group if v in var]
            if len(idx) > 1:
                merges.append(idx)
    return reduce_model(model, merges)
