"""Benchmarks: activation memory, speed, kernel throughput and accuracy grids (``dgl-exact bench``), and the
planner's experiments: predicted against measured memory (:mod:`.plan_validation`, ``bench plan``) and budgeted
plans against uniform settings (:mod:`.plan_accuracy`, ``bench budget``)."""
