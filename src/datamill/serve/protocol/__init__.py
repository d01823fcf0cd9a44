"""The lease protocol as a pure state machine: an iteration's records, units, queues and done set
(:mod:`~datamill.serve.protocol.state`), its transitions: leases, acknowledgements, heartbeats,
expiry, rewinds, cancel and session deaths (:mod:`~datamill.serve.protocol.iteration`), and one
round trip's decide / apply / undo transitions with the journal records they imply
(:mod:`~datamill.serve.protocol.round_trip`). Each transition takes its event's time as data;
nothing here does I/O, locks or reads a clock (the driver,
:class:`datamill.serve.server.ServeState`, does). The only code that changes a lease."""
