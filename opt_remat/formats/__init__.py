"""File formats opt-remat reads and writes: plan files (``plan_file``) and published training
graphs (``checkmate_graph``). Torch-free: the runs' solve workers and the solver-only tools read
them without importing torch."""
