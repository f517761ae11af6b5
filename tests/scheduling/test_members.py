"""Member rules in the core: caps per member of a team, and requests of non-members."""

from __future__ import annotations

import dataclasses

from scheduling import schedule
from scheduling.members import member_rules
from scheduling.types import Member
from tests.scheduling.builders import node, outcome, quota, req, run, snapshot


def _mine(r, user: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(r, user=user)


def test_a_member_over_their_cap_waits_oldest_first_while_others_are_admitted() -> None:
    snap = dataclasses.replace(
        snapshot(
            nodes=[node(gpus=8)],
            pending=[
                _mine(req("old", gpus=2, created_s=30), "bob"),
                _mine(req("new", gpus=1, created_s=20), "bob"),
                _mine(req("alice", gpus=1, created_s=10), "alice"),
            ],
            quotas=[quota("a", 8)],
        ),
        members=(Member("a", "bob", 2000), Member("a", "alice")),
    )
    got = outcome(schedule(snap))
    assert got == {"old": "admit:fits", "new": "wait:member-cap", "alice": "admit:fits"}
    wait = next(d for d in schedule(snap) if d.request_id == "new")
    assert "cap in team a is 2 GPUs and you hold 2" in wait.message
    assert wait.facts == {"cap_milli": 2000, "holding_milli": 2000}


def test_running_work_counts_against_the_cap() -> None:
    snap = dataclasses.replace(
        snapshot(
            nodes=[node(gpus=8)],
            running=[_mine(run("r1", devices=(0, 1)), "bob")],
            pending=[_mine(req("p1", gpus=1), "bob")],
            quotas=[quota("a", 8)],
        ),
        members=(Member("a", "bob", 2500),),
    )
    assert outcome(schedule(snap)) == {"p1": "wait:member-cap"}


def test_a_request_of_someone_no_longer_a_member_is_rejected() -> None:
    snap = dataclasses.replace(
        snapshot(pending=[_mine(req("gone"), "bob")], quotas=[quota("a", 8)]),
        members=(Member("a", "alice"),),
    )
    assert outcome(schedule(snap)) == {"gone": "reject:not-a-member"}


def test_without_members_or_a_user_there_are_no_member_rules() -> None:
    pending = [req("anon"), _mine(req("bob", created_s=5), "bob")]
    snap = snapshot(pending=pending, quotas=[quota("a", 8)])
    assert member_rules(snap) == (snap, [])
    only_anon = dataclasses.replace(snap, pending=(pending[0],), members=())
    assert member_rules(only_anon) == (only_anon, [])
