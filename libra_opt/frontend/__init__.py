"""The front end: what makes a :class:`~libra_opt.ir.problem.RematProblem`.  From a model: the
joint forward + backward graph (:mod:`.capture`, :mod:`.capture_passes`), per-op and device
measurements and the model-to-problem pipeline (:mod:`.profiling`), the allocator margin measured
in a closed loop (:mod:`.calibrate`); from published graphs (:mod:`.importers`); from a seed
(:mod:`.generators`)."""
