"""The lease protocol as a pure state machine, the only code that changes a lease: an iteration's
state (``state``) and its transitions, with the journal records they imply (``iteration``).
"""
