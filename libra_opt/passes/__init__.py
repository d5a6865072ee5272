"""Passes over the IR: instruction dispatch (:mod:`.interpreter`), what a plan costs
(:mod:`.simulator`), decisions to a schedule (:mod:`.lowering`), lower bounds on the memory any
plan needs (:mod:`.bounds`) and what a recompute costs under an executor (:mod:`.costs`)."""
