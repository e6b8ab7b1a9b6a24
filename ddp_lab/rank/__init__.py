"""The rank's machinery: what surrounds train() on every rank. None of it is needed to
read how data-parallel training works.

`main` (a rank's start and end: `run_rank`, `rank_main`), `telemetry` and `presentation`
(the epoch lines and TensorBoard scalars), `epoch` (one measured epoch), `step_progress`,
`stop` (signals and the stop file), `checkpointer` (load/save/on_stop for train()),
`failure` (which rank stopped the others), `delay` (a slow rank on purpose), `compile` and
`cuda_graph` (the step, compiled or captured), `trace` (Chrome traces of steps).
"""
