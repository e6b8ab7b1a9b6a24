"""The cost model: what every collective sends and how long it should take (the alpha-beta model),
and the small arithmetic it shares with the collectives, the clocks and the report. Torch-free: the
report and the submitting command import it without torch.
"""
