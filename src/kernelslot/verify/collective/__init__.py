"""The collective wing of the referee: collective slots verified across real rank processes.

``referee.py`` (the trusted supervisor and judge), ``session.py`` (the rank processes and their
deadlines), ``rank.py`` (the rank's call loop: the only code here that runs candidate code),
``cli.py`` (``python -m kernelslot.verify.collective``, locally or under torchrun).
"""
