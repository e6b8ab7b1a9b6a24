"""The measuring tools beside the lesson: `costmodel` (the alpha-beta model of every
collective: the bytes each rank sends, the time it should take), `fingerprint` (what a
measurement ran on: versions, CPU, threads, network), `trace` (Chrome traces of steps)
and `study` (a scaling study: one run per world size, over one allocation). The bench
(`python -m ddp_lab.bench`) and the report (`python -m ddp_lab.report`) are their own
packages beside this one.
"""
