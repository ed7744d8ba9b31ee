"""The balance held while one pull's batch is made (broker/balance.py): what counts of the pool's
other workers, and how far a batch may fill its worker against them."""

from __future__ import annotations

from dataclasses import dataclass

from broker.affinity import balance_slack
from broker.balance import RETURN_S, Balance, Loads, after, load
from schemas.work import Credit

SLOTS = 64                          # a floor of 4 sequences (BALANCE_FLOOR of 64)


@dataclass
class Want:
    klass: str = "interactive"
    slots: int = 1
    cost: int = 100
    tenant: str = "acme"
    prompt: int = 10


def credit(worker: str, held: int = 0, classes: tuple[str, ...] = (), budget: int = 100_000) -> Credit:
    return Credit(worker_id=worker, pool="sim", free_slots=SLOTS - held, token_budget=budget, total_slots=SLOTS,
                  classes=list(classes), running={"interactive": held} if held else {})


def test_a_batch_fills_its_worker_up_to_the_balance_above_the_least_loaded():
    balance = Balance([credit("w2", held=10), credit("w3", held=30)], SLOTS)
    ceiling = 10 + balance_slack(10, SLOTS)
    assert balance.allows(Want(), int(ceiling) - 1)
    assert not balance.allows(Want(), int(ceiling))
    assert not balance.allows(Want(slots=2), int(ceiling) - 1)
    # The least loaded takes an item however many sequences it needs.
    assert balance.allows(Want(slots=SLOTS), 10)
    assert Balance([], SLOTS).allows(Want(), 1_000)         # alone in its pool


def test_only_a_worker_that_could_take_the_item_holds_a_batch_back():
    full = credit("w2", held=SLOTS)
    other_class = credit("w3", held=0, classes=("batch",))
    no_kv = credit("w4", held=1, budget=10)
    balance = Balance([full, other_class, no_kv], SLOTS)
    assert balance.allows(Want(), 40)
    assert not balance.allows(Want(klass="batch"), 40)
    assert not balance.allows(Want(cost=5), 40)


def test_a_worker_just_sent_a_batch_counts_with_it_until_its_fresh_pull_or_return_s():
    loads = Loads()
    mine, sent = credit("w1", held=0), credit("w2", held=0)
    loads.sent(sent, [Want()] * 3, now=100.0)
    assert load(after(sent, [Want()] * 3)) == 3
    assert not loads.balance(mine, [], now=100.1).allows(Want(), 3 + int(balance_slack(3, SLOTS)))
    assert loads.balance(mine, [], now=100.0 + RETURN_S).allows(Want(), 40)   # full, or gone
    loads.sent(sent, [Want()] * 3, now=200.0)
    loads.pulled("w2")          # its fresh credit now parks, or is answered, on its own
    assert loads.balance(mine, [], now=200.1).allows(Want(), 40)
    # A parked pull counts while its credit is fresh; one parked longer while work waited was
    # kept from it by the caps, and holds no batch back.
    assert not loads.balance(mine, [(credit("w3", held=2), 300.0)], now=300.5).allows(Want(), 40)
    assert loads.balance(mine, [(credit("w3", held=2), 300.0)], now=300.0 + RETURN_S).allows(Want(), 40)
    assert loads.balance(mine, [(credit("w1", held=2), 300.0)], now=300.5).allows(Want(), 40)   # itself
