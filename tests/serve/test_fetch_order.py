"""A server-built client's fetch threads keep two lease requests in flight; their leases must reach
the loop in the order the server granted them (:class:`~datamill.client.feed.Arrivals`)."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from datamill.client.feed import END, Arrivals


class FetchesInFlight(RuleBasedStateMachine):
    """Requests sent by any number of fetch threads, granted by the server in any order among those
    in flight (each gets the next positions of the queue, or none), answered, their bodies read or
    cut off, at random interleavings; the model: the server's grant order."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[Any] = []
        self.starving = True  # the loop has no lease waiting for it
        self.arrivals = Arrivals(self.out.append, lambda: self.starving)
        self.sent: list[int] = []  # sent, not granted yet
        self.granted: dict[int, int | None] = {}  # granted (a start, or None: no lease), unanswered
        self.answered: list[int] = []  # answered with a lease, body not read
        self.start_of: dict[int, int] = {}
        self.next_start = 0
        self.kept: list[int] = []  # starts whose bodies arrived, in grant order
        self.ended = False
        self.heard = False  # a request was answered

    @precondition(lambda self: not self.ended and len(self.sent) + len(self.granted) < 4)
    @rule()
    def send(self) -> None:
        """A fetch thread sends a request: beside another on its way only while the loop starves,
        and not beside the epoch's first before that one is answered."""
        n = self.arrivals.sent(wait=0)
        on_its_way = bool(self.sent or self.granted or self.answered)
        assert (n is None) == (on_its_way and not (self.heard and self.starving))
        if n is not None:
            self.sent.append(n)

    @rule(starving=st.booleans())
    def loop(self, starving: bool) -> None:
        """The loop takes the leases waiting for it, or some wait."""
        self.starving = starving

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), lease=st.booleans())
    def grant(self, data: st.DataObject, lease: bool) -> None:
        """The server takes any request in flight: the next 16 positions, or none (a 409)."""
        n = self.sent.pop(data.draw(st.integers(0, len(self.sent) - 1)))
        if lease:
            self.granted[n] = self.next_start
            self.next_start += 16
        else:
            self.granted[n] = None

    @precondition(lambda self: self.granted)
    @rule(data=st.data())
    def head(self, data: st.DataObject) -> None:
        """Any granted request's headers arrive."""
        self.answer(data.draw(st.sampled_from(sorted(self.granted))))

    def answer(self, n: int) -> None:
        start = self.granted.pop(n)
        self.heard = True
        if start is None:
            self.arrivals.dropped(n)
        else:
            self.start_of[n] = start
            self.arrivals.answered(n, (0, start))
            self.answered.append(n)

    @precondition(lambda self: self.answered)
    @rule(data=st.data(), cut=st.booleans())
    def body(self, data: st.DataObject, cut: bool) -> None:
        """Any answered lease's body is read, or cut off (the lease is asked again later)."""
        n = self.answered.pop(data.draw(st.integers(0, len(self.answered) - 1)))
        if not cut:
            self.kept.append(self.start_of[n])
        self.arrivals.arrived(n, None if cut else self.start_of[n])

    @precondition(
        lambda self: (
            not (self.sent or self.granted)
            and (not self.answered or (self.heard and self.starving))
        )
    )
    @rule()
    def end(self) -> None:
        """A request answered 204: the epoch is over (sent, granted and answered at once; again
        when another fetch thread sent one before it saw the first)."""
        n = self.arrivals.sent(wait=0)
        assert n is not None
        self.arrivals.dropped(n, end=True)
        self.ended = self.heard = True

    @invariant()
    def handed_in_grant_order(self) -> None:
        leases = [x for x in self.out if x is not END]
        assert leases == sorted(leases)
        assert len(set(leases)) == len(leases)
        assert set(leases) <= set(self.kept)
        assert END not in self.out[:-1]  # the end comes last, once
        if self.out and self.out[-1] is END:
            assert leases == sorted(self.kept)  # after every lease whose body arrived

    def teardown(self) -> None:
        """Every request answered and read: every lease kept was handed on."""
        while self.sent:
            self.grant_all()
        for n in sorted(self.granted):
            self.answer(n)
        for n in self.answered:
            self.kept.append(self.start_of[n])
            self.arrivals.arrived(n, self.start_of[n])
        if not self.ended:
            n = self.arrivals.sent(wait=0)
            assert n is not None
            self.arrivals.dropped(n, end=True)
        assert self.out == [*sorted(self.kept), END]

    def grant_all(self) -> None:
        n = self.sent.pop(0)
        self.granted[n] = self.next_start
        self.next_start += 16


FetchesInFlight.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestFetchesInFlight = FetchesInFlight.TestCase


def test_a_lease_waits_for_the_request_in_flight_when_it_arrived_and_the_end_comes_last() -> None:
    out: list[Any] = []
    a = Arrivals(out.append)
    zero = a.sent()
    assert a.sent(wait=0) is None  # the epoch's first request goes alone
    a.dropped(zero)  # answered 409: others hold the rest
    one, two = a.sent(), a.sent()
    a.answered(two, (0, 16))  # granted first here: the other request may still get 0-16
    a.arrived(two, "16-32")
    assert out == []
    a.answered(one, (0, 0))
    three = a.sent()  # sent after both heads: granted after both
    assert three is not None
    a.dropped(three, end=True)
    assert out == []  # 0-16's body is still on its way
    a.arrived(one, "0-16")
    assert out == ["0-16", "16-32", END]


def test_a_body_cut_off_is_skipped_and_the_leases_after_it_go_on() -> None:
    out: list[Any] = []
    a = Arrivals(out.append)
    one = a.sent()
    a.answered(one, (0, 0))
    two = a.sent()
    a.answered(two, (0, 16))
    a.arrived(two, "16-32")
    a.arrived(one, None)  # cut off: the server re-issues it once it expires
    assert out == ["16-32"]
