"""The lease protocol as a pure state machine: an iteration's records, units, queues and done set
(:mod:`~datamill.serve.protocol.state`), and its transitions: leases, acknowledgements, heartbeats,
expiry, rewinds, cancel, session deaths and one round trip's plan / apply / undo with the journal
records it implies (:mod:`~datamill.serve.protocol.iteration`). Each transition takes its event's
time as data; nothing here does I/O, locks or reads a clock (the driver,
:class:`datamill.serve.server.ServeState`, does). The only code that changes a lease."""
