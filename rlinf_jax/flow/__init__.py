"""The engine every task runs on, knowing no workload: the host loop (cadence, resume,
logs, checkpoints), the trainer contract, stages and channels for placed components, and
the guarded optimiser update."""
