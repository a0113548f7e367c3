"""Time shares and thresholds of the peak solve (``solvers.peak``). Shares are of the solve's
effort: ``time_limit_s`` scaled to the graph. The measurements behind each value are in
docs/peak-tuning.md."""

# a graph of this many values gets the whole time limit, a smaller one its share (at least
# MIN_EFFORT_S), growing a little faster than the graph: small graphs are done long before
FULL_EFFORT_VALUES = 3500
MIN_EFFORT_S = 4.0
EFFORT_POWER = 1.1
# the share of the time limit the start plan (the fast default's) may take before it returns its
# best so far: the relaxation's bound needs the rest (at 70B under load the start took the whole
# limit, and no bound was proven)
START_SHARE = 0.4
# ... but at least this long: on small graphs it is done well before, whatever the limit
START_MIN_S = 4.0
# share of the time limit kept back for finishing: HiGHS runs past its own limit, then the
# result is checked
FINISH_SHARE = 0.02
# the local search stops once nothing better has turned up for this share (at least STALL_MIN_S):
# its gains come early
STALL_SHARE = 0.15
STALL_MIN_S = 3.0
# once a plan fits, the local search runs on graphs up to this many values only: beyond, its
# descents gain nothing and the cut rounds need the time
SEARCH_MAX_VALUES = 2000
# HiGHS's relative gap on the relaxation, as a share of the solve's gap: a tight gap costs a
# minute where this one costs seconds
RELAX_GAP_SHARE = 0.25
# ... in a cut round on a graph of more than SEARCH_MAX_VALUES values, this share of the solve's
# gap still open, at most ROUND_GAP_MAX
ROUND_GAP_SHARE = 0.2
ROUND_GAP_MAX = 0.005
# the first relaxation solve, and its re-solves at lowered budgets (each at most
# LOWERED_SOLVE_SHARE); where the layer mix makes the plans that fit, the cut rounds get the time
RELAX_SHARE = 0.3
SHRINK_SHARE = 0.3
SHRINK_SHARE_MIXING = 0.1
LOWERED_SOLVE_SHARE = 0.15
# a re-solve is not started with less time than this share of the first solve's: it would
# return nothing, and HiGHS's presolve runs past short limits
MIN_RESOLVE_SHARE = 0.5
# the cut rounds (solvers.peak.cuts): kept for them before the local search, the first turn's
# share (shorter while no plan fits: the search needs the time, yet cuts may prove the budget
# infeasible), the turn after a search that found no plan, and steps cut per round
CUT_SHARE = 0.35
CUT_FIRST_SHARE = 0.35
CUT_FIRST_NO_PLAN_SHARE = 0.12
CUT_NO_PLAN_SHARE = 0.25
CUTS_PER_ROUND = 2
# HiGHS's presolve probes the binaries in the cut rounds on graphs up to this many values: it
# raises their bounds, but its cost grows much faster than the program
PROBING_MAX_VALUES = 5000
# while no plan fits, the cut rounds stop after this many rounds in a row that raised the bound
# by less than this share: they can only prove infeasibility, and each round takes longer
CUT_STALL_ROUNDS = 1
CUT_STALL_GAIN = 0.01
# a relaxation's plan over the budget by at most this share is re-solved at the budget less its
# overshoot, and repaired (solvers.peak.repair) for at most REPAIR_SHARE
NEAR_FIT = 0.03
REPAIR_SHARE = 0.03
# ... unless the best plan is within this many times the solve's gap of the bound: then the bound
# is what is missing, and the re-solve's time goes to the next round
NEAR_DONE_GAPS = 3.0
# on big graphs, a cut round's plan that overshoots by at most this share of the budget (and
# costs less than the best) is repaired (solvers.peak.repair.repair_by_rate) for at most
# ROUND_REPAIR_SHARE
ROUND_REPAIR_FIT = 0.10
ROUND_REPAIR_SHARE = 0.35
# ... at most this many simulations spend what the repaired plan leaves unused (the repairs run
# while the round's HiGHS solve does, which leaves this share of the effort for what follows it)
ROUND_SPEND_EVALUATIONS = 1000
ROUND_END_KEEP = 0.03
# grafts (solvers.peak.graft): the cheapest plans that overshoot tried per turn, the turn's share,
# and the share after a cut round (which leaves the round's plan time for its re-solve)
GRAFT_PLANS = 6
GRAFT_SHARE = 0.15
ROUND_GRAFT_SHARE = 0.06
# the layer mix (solvers.peak.layers), with the layers of the relaxation's plans at these
# multiples of the peak budget (each solved in LAYERS_RELAX_SHARE); only while checkpointing every
# layer costs at most LAYERS_MAX_COST_RATIO x the bound (beyond, the savings are not in the layers)
LAYERS_SHARE = 0.2
LAYERS_RELAX_LOOSER = (1.5, 2.0, 2.7, 3.3)
LAYERS_RELAX_SHARE = 0.03
LAYERS_MAX_COST_RATIO = 3.0
