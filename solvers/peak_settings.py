"""Time shares and thresholds of the peak solve (``solvers.peak``), each with the measurement
that set it. Shares are of the solve's effort (``time_limit_s`` scaled to the graph)."""

# a graph of this many values gets the whole time limit, a smaller one its share (at least
# MIN_EFFORT_S): every phase below is a share of that
FULL_EFFORT_VALUES = 3500
MIN_EFFORT_S = 4.0
# the share grows a little faster than the graph: 4-layer GPT (590 values) within 10 s of a 60 s
# limit (8.5 s; linear gave it 10.1 s), the 7B shape's 3,331 values 56.8 s
EFFORT_POWER = 1.1
# share of the time limit kept back for finishing (HiGHS's overrun, the final checks; measured,
# 64-layer small LLaMA on a slower machine: a cut round's solve ran 0.4 s past its limit, the
# plan's check 0.3 s more)
FINISH_SHARE = 0.02
# share of the time limit kept for the local search after the stage model
SEARCH_SHARE = 0.5
# the local search stops once nothing better has turned up for this share of the time limit (at
# least STALL_MIN_S): measured on the 7B shape at 0.45x, its gains came in its first 7 s, none in
# the next 30 s
STALL_SHARE = 0.15
STALL_MIN_S = 3.0
# once a plan fits, the local search runs on graphs up to this many values only: beyond, its
# descents gained nothing in their 3-9 s (measured: 7B shape at 0.3/0.45/0.6/0.8x the min-cut
# peak, and the 32-layer small LLaMA at 0.6x, where the cut rounds need the time)
SEARCH_MAX_VALUES = 2000
# relative gap (cost - proven bound) / cost at which a peak solve stops
DEFAULT_GAP = 0.01
# shares of the time limit for the first relaxation solve and for re-solving it at lowered budgets
RELAX_SHARE = 0.3
# a re-solve is not started with less time than this share of the first solve's
MIN_RESOLVE_SHARE = 0.5
SHRINK_SHARE = 0.3
SHRINK_SHARE_MIXING = 0.1  # ... where the layer mix (below) makes the plans that fit
# share of the time limit for the cutting-plane rounds (solvers.peak_cuts), and steps cut per round
CUT_SHARE = 0.35
CUTS_PER_ROUND = 2
# HiGHS's presolve probes the binaries in a cut round's first solve on graphs up to this many
# values: its cost grows much faster than the program (measured, first cut round: 7B shape, 3,331
# values, 6 s of presolve that raise the bound, gaps 3.5/3.9/1.8/2.8% at 0.3-0.8x where 4.3/4.7/
# 2.3/6.3% without; 64-layer small LLaMA, 6,497 values, 25 s of presolve at 0.8x and no answer in
# its 28 s, where without probing it is solved in 14 s: gap 3.5% -> 1.1%)
PROBING_MAX_VALUES = 5000
# share of the time limit for the cut rounds before the local search (the rest come after it)
CUT_FIRST_SHARE = 0.35
CUT_FIRST_NO_PLAN_SHARE = 0.12
CUT_NO_PLAN_SHARE = 0.25  # ... and again when the search's share found no plan
# while no plan fits, the cut rounds stop after this many rounds in a row that raised the bound
# by less than this share
CUT_STALL_ROUNDS = 1
CUT_STALL_GAIN = 0.01
# a cut plan over the budget by at most this share is re-solved at the budget less its overshoot
NEAR_FIT = 0.03
# ... and offered to a repair (solvers.peak_repair), for at most this share of the time limit
REPAIR_SHARE = 0.03
# ... unless the best plan is within this many times the solve's gap of the bound: then the bound
# is what is missing, and the re-solve's time goes to the next round (measured, 32-layer small
# LLaMA at 0.6x: a plan 1.2% above the bound after the second round, whose re-solve took 13.5 s
# and left a third round no time; given it, that round did not raise the bound there)
NEAR_DONE_GAPS = 3.0
# grafts (solvers.peak_graft): the cheapest plans that overshoot tried per round, and the share
# of the time limit they may take
GRAFT_PLANS = 6
GRAFT_SHARE = 0.15
# ... after a cut round (measured, 32-layer small LLaMA at 0.6x: 8 s of grafts after the first
# round left the second round's plan no time to be re-solved below the budget)
ROUND_GRAFT_SHARE = 0.06
# the layer-by-layer mix of the plans seen (solvers.peak_layers): share of the time limit
# (measured, 7B shape at 0.45x: its 66 option simulations took 8.5 of 0.15x's 9 s alone, and
# in the benchmark's run the mix stopped at 184.5 ms short of its 178.9 ms plan)
LAYERS_SHARE = 0.2
# ... with the layers of the relaxation's plans at these multiples of the peak budget too
# (measured, 7B shape at 0.45x: 181.6 -> 178.9 ms)
LAYERS_RELAX_LOOSER = (1.5, 2.0, 2.7, 3.3)
LAYERS_RELAX_SHARE = 0.03  # each
LAYERS_MAX_COST_RATIO = 3.0  # ... only while checkpointing every layer costs at most this x the bound
# HiGHS's relative gap on the relaxation, as a share of the solve's gap
RELAX_GAP_SHARE = 0.25
# the stage model (below) joins the search on graphs up to this many values: beyond, CP-SAT rarely
# helps (measured: 4-layer LLaMA, 9 s for a plan 5x costlier than the relaxation's; nothing at 32 layers)
STAGE_MODEL_MAX_VALUES = 150
