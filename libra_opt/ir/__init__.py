"""The IR every part of libra-opt shares: the rematerialization problem (:mod:`.problem`: ops,
tensors on storages, fixed memory; its files: :mod:`.problem_io`; the flat per-problem tables every
pass reads, built once: :mod:`.tables`), the plan (:mod:`.schedule`:
five instructions, a versioned :class:`~libra_opt.ir.schedule.Schedule`) and budgets and byte
sizes (:mod:`.units`: the budget contract)."""
