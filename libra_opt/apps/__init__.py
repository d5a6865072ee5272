"""Applications built on the library: the demo (:mod:`.demo`), the largest batch under a memory
cap (:mod:`.max_batch`, :mod:`.batch_search`), training-step methods compared
(:mod:`.train_methods`), the model zoo (:mod:`.zoo`), solver comparisons and plots
(:mod:`.compare`, :mod:`.plots`) and the solver fuzzer (:mod:`.fuzz`)."""
