"""Training: model zoo, samplers, the training loop and checkpoints (used by the CLI and examples).

Where things are:

* :mod:`.config` -- :class:`~.config.TrainConfig`, every option of a run (with its
  :class:`~dgl_exact.compression_config.CompressionConfig`), validated; ``--conf`` YAML files.
* :mod:`.models` -- the GCN / SAGE / GAT / GCNII models, on dgl_exact's layers or DGL's.
* :mod:`.samplers` -- GraphSAINT and ClusterGCN mini-batches, a pure function of ``(seed, epoch)``; their
  cache files (partitions, pre-sampled counts) in :mod:`.sampler_cache`.
* :mod:`.neighbor` -- neighbour-sampled blocks through DGL's ``NeighborSampler``, on the same interface.
* :mod:`.trainer` -- :class:`~.trainer.Trainer`, the one training loop: :meth:`~.trainer.Trainer.fit`
  runs :meth:`~.trainer.Trainer.run` per seed, which restores, trains, evaluates and saves each epoch.
* :mod:`.workloads` -- what each model needs from its workload (self loops, CSC alone, default sizes) and
  :func:`~.workloads.prepare_graph`, the one way a graph is prepared for a model (trainer, planner, bench).
* :mod:`.recipes` -- EXACT's training recipes a step follows: label inputs, GraphSAINT's weights, the loss,
  AMP; :mod:`.memory_breakdown` -- ``--debug-mem``'s model / data / step peak breakdown; :mod:`.results` --
  what a run returns and its log line.
* :mod:`.checkpoint` -- :class:`~.checkpoint.RunState`, what a checkpoint holds, written atomically and
  read back weights-only.
* :mod:`.resume` -- what a checkpoint records about its run and ``--resume`` checks: one table of fields,
  those that may change, the one-line refusal; where a resumed training continues.
* :mod:`.distributed` -- data-parallel training: the worker environment, the DDP trainer, its
  one-process emulator and the ``--nproc`` launcher.
"""
