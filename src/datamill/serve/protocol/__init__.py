"""The lease protocol: an iteration's units, queues, leases, acknowledgements, expiry and rewinds
(:mod:`~datamill.serve.protocol.iteration`, no I/O), and one round trip's decide / journal / apply
steps (:mod:`~datamill.serve.protocol.round_trip`). The only code that changes a lease."""
