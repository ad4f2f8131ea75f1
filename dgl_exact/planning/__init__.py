"""Plan before you train: predict a training step's memory per compression setting, and choose a compression
per kept activation that fits a memory budget.

* :func:`plan` (``dgl-exact plan``): static memory, activation memory, step peak and total per setting for a
  dataset (or its node, edge and feature counts), a model and a device, predicted from the model's real
  operations run on two small random graphs of the same shape and extrapolated (:mod:`.predict`).
* :func:`budget_plan` (``dgl-exact train --memory-budget``): per kept activation, the compression that
  minimises the gradient variance it adds under the budget (:mod:`.budget`, its steps in :mod:`.slots`,
  :mod:`.sensitivity`, :mod:`.allocation`, :mod:`.peak`, :mod:`.budgeted`).
* :mod:`.settings`: the compression presets (per-tensor options, the standard settings) that the planner,
  the benchmarks and the command line share.
"""
from .predict import PlanRecord, PlanSpec, SampleRun, plan, parse_bytes, device_bytes, spec_for_dataset

__all__ = ["PlanRecord", "PlanSpec", "SampleRun", "plan", "parse_bytes", "device_bytes", "spec_for_dataset"]
