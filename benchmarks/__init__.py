"""llamablock's benchmark suite: one module per benchmark, run by benchmarks.runner."""
