"""The runtime: executes any plan (recompute + asynchronous swap) inside an
ordinary ``loss.backward()``."""
