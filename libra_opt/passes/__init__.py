"""Passes over the IR: instruction dispatch (:mod:`.interpreter`), what a plan costs
(:mod:`.simulator`), decisions to a schedule (:mod:`.lowering`), lower bounds on the memory any
plan needs (:mod:`.bounds`), a proof that a recompute-only plan peaks over a limit without lowering
it (:mod:`.peak_bound`) and what a recompute costs under an executor (:mod:`.costs`)."""
