"""Checkmate's rematerialization MILP and what is built on it: the model (:mod:`.model`), its
``R``/``S`` matrices to a schedule (:mod:`.plan`), the solvers ``checkmate-milp`` (:mod:`.milp`)
and ``checkmate-lp`` (:mod:`.lp`), graph coarsening (:mod:`.coarsen`), and the exact keep /
recompute / swap MILP ``hybrid-milp`` on Checkmate's stages (:mod:`.hybrid_model`,
:mod:`.hybrid_milp`).  Nothing is imported here: a solver's backend loads when it is used."""
