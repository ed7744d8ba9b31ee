"""The scheduling policy: priority classes, tenant-fair queues, earliest deadline first. No I/O.

- Across classes: strict priority by `rank`, with aging: a class whose oldest waiting request
  has waited `starve_after_s` is served ahead of rank, so no class starves. A class never holds
  more than `max_slot_share` of a worker's slots, so higher classes always find headroom; one
  below the top class leaves free what the top class's recent bursts there took (headroom.py).
- Prefill: a worker reports its engine's tokens per step and, per class, the prompt tokens it
  holds that have not started; a class's (with what this batch adds) stay under
  `max_prefill_share` of the step, so a flood of long prompts cannot fill the steps a chat's
  first token waits on. A class with none pending may always take one prompt, however long.
  And whatever the classes' caps, a worker holds at most `QUEUED_PREFILL_STEPS` steps of
  unstarted prompts of the same or a higher class than the one taken: an engine serves its queue
  by priority, then in arrival order, so what a worker holds beyond what it can start soon waits
  there in arrival order, out of the lanes' reach. A neighbour's flood in a chat's own class
  then queues here, where tenants share fairly, not in the engine ahead of the chat.
- Within a class: start-time fair queuing across tenants, cost counted in tokens (prompt
  estimate + max_tokens) divided by the tenant's weight. A tenant that goes idle cannot bank
  credit: on becoming backlogged again its virtual time is lifted to the class clock.
- Tenant headroom: while another tenant is active in the class (it has requests waiting there,
  or had one admitted within `ACTIVE_WINDOW_S`), a tenant holds at most `max_tenant_share` of
  the class's slots at a worker, and its step share (`max_tenant_step_share`) of the worker's KV
  cache and of the prompts a worker may hold unstarted, as the worker's credit reports them (a
  tenant holding none there may take one); a tenant whose weight is a larger part of the active
  tenants' weights, that part. A tenant at its cap is passed over for the next fair
  tenant, so a neighbour's next request finds a slot and KV room at once instead of waiting for
  one of the flood's to end. A lone tenant keeps everything.
- Within a tenant: earliest deadline first.
- Redelivered first: a request JetStream delivers again (a lost worker's, its stream stalled) was
  accepted and charged before: it goes ahead of its class's new work, every tenant's, uncharged.
- Prefix affinity (`select(prefer=...)`): among the items the rules above would serve next, within
  AFFINITY_SLACK_S of the head's deadline and AFFINITY_SLACK_COST of the fair tenant's virtual
  time (never an expired one, never another class), the one the worker scores highest goes first.
  The slack bounds what affinity may reorder: a tenant passed over falls at most one slack behind.
- Every admitted item ends in exactly one terminal state: dispatched, expired or cancelled
  (or `forget`, when a redelivery supersedes it).

The dispatcher calls `admit`, `select`, `cancel` and `expire`; time is passed in, never read.
What fits a worker (its room, the caps above) is judged in broker/room.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from broker.room import Room, Wants, held_from
from broker.waiting import Admit, ClassLane, Item, Selection, State, TenantQueue
from core.policy.classes import ClassPolicy

AFFINITY_SLACK_S = 0.25  # how much later a deadline an affinity choice may serve first
AFFINITY_SLACK_COST = 4096.0  # fair-share virtual time (tokens / weight) it may skip across tenants
HEAD_CANDIDATES = 3  # a tenant's heap entries looked at: its root and the root's children
# A tenant with nothing waiting in a class is still active in it this long after its last
# admission: the gaps of one sending every few seconds (at 0.5/s, Poisson, one gap in ~150 is
# longer), at a cost to a lone flood of its headroom share for 10 s after the other's last request.
ACTIVE_WINDOW_S = 10.0


class Lanes:
    def __init__(
        self,
        classes: Iterable[ClassPolicy],
        tenant_weight: Callable[[str], float] = lambda tenant: 1.0,
    ) -> None:
        self._lanes: dict[str, ClassLane] = {}
        self._items: dict[tuple[str, str], Item] = {}
        self._order = itertools.count()
        self._tenant_weight = tenant_weight
        self.set_classes(classes)

    # -- configuration --------------------------------------------------------------------
    def set_classes(self, classes: Iterable[ClassPolicy]) -> None:
        """Apply a new class set live. Waiting items of a removed class stay queued under it
        until served or expired; a class is only dropped once empty."""
        new = {c.name: c for c in classes}
        for name, lane in list(self._lanes.items()):
            if name in new:
                lane.policy = new[name]
            elif lane.waiting == 0:
                del self._lanes[name]
        for name, policy in new.items():
            self._lanes.setdefault(name, ClassLane(policy))
        self._known = new

    def set_tenant_weight(self, tenant_weight: Callable[[str], float]) -> None:
        self._tenant_weight = tenant_weight

    def policy(self, klass: str) -> ClassPolicy | None:
        return self._known.get(klass)

    @property
    def top(self) -> ClassPolicy | None:  # served first: the others leave room for its bursts
        return min(self._known.values(), key=lambda p: p.rank, default=None)

    # -- introspection --------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(lane.waiting for lane in self._lanes.values())

    def depth(self, klass: str, tenant: str | None = None) -> int:
        lane = self._lanes.get(klass)
        if lane is None or tenant is None:
            return lane.waiting if lane else 0
        queue = lane.tenants.get(tenant)
        return queue.waiting if queue else 0

    def depths(self) -> dict[str, dict[str, int]]:
        """Waiting per class, then per tenant (one with none waiting left out): the gauges."""
        return {
            name: {t: q.waiting for t, q in lane.tenants.items() if q.waiting} for name, lane in self._lanes.items()
        }

    def get(self, tenant: str, request_id: str) -> Item | None:
        return self._items.get((tenant, request_id))

    def waiting_items(self) -> list[Item]:
        return list(self._items.values())

    # -- transitions ----------------------------------------------------------------------
    def admit(self, item: Item, now: float) -> Admit:
        policy = self._known.get(item.klass)
        if policy is None:
            return Admit.UNKNOWN_CLASS
        if item.key in self._items:
            return Admit.DUPLICATE
        if self._expired(item, policy, now):
            return Admit.EXPIRED
        lane = self._lanes[item.klass]
        queue = lane.tenants.get(item.tenant)
        if queue is None:
            queue = lane.tenants[item.tenant] = TenantQueue(vtime=lane.vclock)
        if queue.waiting >= policy.max_tenant_depth:
            return Admit.QUEUE_FULL
        if queue.waiting == 0:
            # Idle tenants cannot bank credit for the time they sent nothing.
            queue.vtime = max(queue.vtime, lane.vclock)
        item.order = next(self._order)
        queue.admitted_at = now
        item.state = State.WAITING
        heapq.heappush(queue.heap, (item.deadline, item.order, item))
        queue.waiting += 1
        lane.waiting += 1
        lane.arrivals.append(item)
        if item.redelivered:
            lane.redelivered.append(item)
        self._items[item.key] = item
        return Admit.OK

    def cancel(self, tenant: str, request_id: str) -> Item | None:
        return self._remove(tenant, request_id, State.CANCELLED)

    def forget(self, tenant: str, request_id: str) -> Item | None:
        return self._remove(tenant, request_id, State.FORGOTTEN)

    def expire(self, now: float) -> list[Item]:
        expired = [item for item in self._items.values() if self._expired(item, self._lanes[item.klass].policy, now)]
        for item in expired:
            self._remove(item.tenant, item.request_id, State.EXPIRED)
        return expired

    def select(
        self,
        *,
        free_slots: int,
        token_budget: int,
        total_slots: int,
        running: dict[str, int],
        classes: Iterable[str] = (),
        now: float,
        max_bytes: int | None = None,
        step_tokens: int = 0,
        prefill: dict[str, int] | None = None,
        prefer: Callable[[Item], float] | None = None,
        kv_tokens: int = 0,
        tenant_slots: dict[str, dict[str, int]] | None = None,
        tenant_tokens: dict[str, dict[str, int]] | None = None,
        tenant_prefill: dict[str, dict[str, int]] | None = None,
        balanced: Callable[[ClassPolicy, Wants, int], bool] | None = None,
        reserve: int = 0,
    ) -> Selection:
        """Choose work for one worker's credit. An item whose cost exceeds the remaining token
        budget is left for a worker with more room, unless this worker is empty (it would
        otherwise never run anywhere). `max_bytes` bounds the batch's message size (NATS
        max_payload); the first item always goes. `step_tokens` and `prefill` (the worker's
        unstarted prompt tokens per class) apply the classes' prefill caps; `kv_tokens` and
        `tenant_slots`/`tenant_tokens` (class → tenant → what it holds there) the tenant headroom.
        `prefer` scores an item for this worker (prefix affinity), within the slack the module's
        top describes; `balanced` keeps the pool's balance (broker/balance.py); `reserve` is what the
        classes below the top one leave free here (broker/headroom.py)."""
        out = Selection()
        allowed = set(classes) or set(self._lanes)
        room = Room.of(
            free_slots=free_slots,
            token_budget=token_budget,
            total_slots=total_slots,
            running=running,
            step_tokens=step_tokens,
            prefill=prefill,
            kv_tokens=kv_tokens,
            tenant_slots=tenant_slots,
            tenant_tokens=tenant_tokens,
            tenant_prefill=tenant_prefill,
            balanced=balanced,
            rank=self._rank,
            reserve=reserve,
            top_rank=self.top.rank if self.top else None,
        )
        blocked: set[str] = set()
        capped: dict[str, set[str]] = {}  # class → tenants at their headroom cap here
        while room.free_slots > 0:
            lane = self._pick_lane(now, room, allowed - blocked)
            if lane is None:
                break
            policy = lane.policy
            skip = capped.setdefault(policy.name, set())
            head = self._head(lane, now, out.expired, skip)
            if head is None:
                if lane.waiting:
                    blocked.add(policy.name)  # every tenant waiting there is at its cap
                continue
            queue, item = head
            first = room.empty and not out.dispatch
            if not first and not self._within_share(lane, room, item, now):
                skip.add(item.tenant)
                continue
            # The lane's clock: the fair tenant's, whatever is picked (a capped one's too).
            fair = skip or item.redelivered
            fair_vtime = min(q.vtime for q in lane.tenants.values() if q.waiting) if fair else queue.vtime
            ahead = room.queued_ahead(policy, self._rank)
            if prefer is not None and not item.redelivered:
                chosen = self._preferred(lane, queue, item, now, prefer, skip)
                if first or (room.fits(policy, chosen[1], ahead) and self._within_share(lane, room, chosen[1], now)):
                    queue, item = chosen
            if not (first or room.fits(policy, item, ahead)):
                blocked.add(policy.name)
                continue
            if max_bytes is not None and out.dispatch and item.size > max_bytes:
                break  # the message is full; the rest go in the next pull's batch
            if max_bytes is not None:
                max_bytes -= item.size
            if queue.heap[0][2] is item:
                heapq.heappop(queue.heap)  # else an affinity pick: dropped lazily by _head
            self._settle(lane, queue, item, State.DISPATCHED)
            lane.vclock = fair_vtime
            if not item.redelivered:
                queue.vtime += item.cost / max(self._tenant_weight(item.tenant), 1e-6)
            out.dispatch.append(item)
            room.take(item)
        return out

    # -- internals ------------------------------------------------------------------------
    def _rank(self, klass: str) -> int | None:
        lane = self._lanes.get(klass)
        return None if lane is None else lane.policy.rank

    def _within_share(self, lane: ClassLane, room: Room, item: Item, now: float) -> bool:
        """The tenant headroom: only while another tenant is active in the class. A tenant whose
        weight is a larger part of the active tenants' than a share may hold that part. The
        class's own shares first: within them, the tenants need not be counted."""
        policy = lane.policy
        if room.within_tenant_share(policy, item, policy.max_tenant_share, policy.tenant_step_share):
            return True
        others = [
            self._tenant_weight(name)
            for name, q in lane.tenants.items()
            if name != item.tenant and (q.waiting or now - q.admitted_at < ACTIVE_WINDOW_S)
        ]
        if not others:
            return True
        weight = self._tenant_weight(item.tenant)
        part = weight / max(weight + sum(others), 1e-9)
        return room.within_tenant_share(
            policy, item, max(policy.max_tenant_share, part), max(policy.tenant_step_share, part)
        )

    @staticmethod
    def _expired(item: Item, policy: ClassPolicy, now: float) -> bool:
        return now >= item.deadline or now - item.enqueued_at > policy.max_queue_wait_s

    def _pick_lane(self, now: float, room: Room | None, allowed: set[str]) -> ClassLane | None:
        """The lane the next item comes from: one whose class (with those after it) is under its
        slot share at `room`'s worker (None: any)."""
        best: ClassLane | None = None
        best_key: tuple[int, float] | None = None
        for name in allowed:
            lane = self._lanes.get(name)
            if lane is None or lane.waiting == 0:
                continue
            if room is not None and held_from(room.held, lane.policy, self._rank) >= room.cap(lane.policy):
                continue
            oldest = lane.oldest()
            age = now - oldest.enqueued_at if oldest else 0.0
            starving = age >= lane.policy.starve_after_s
            # Starving lanes first (most overdue first), then by rank.
            key = (0, -age / lane.policy.starve_after_s) if starving else (1, float(lane.policy.rank))
            if best_key is None or key < best_key:
                best, best_key = lane, key
        return best

    def _head(
        self, lane: ClassLane, now: float, expired: list[Item], skip: set[str]
    ) -> tuple[TenantQueue, Item] | None:
        """The next item of the lane by fair queuing, of a tenant not in `skip`, dropping expired
        and stale entries; None when no such tenant has one waiting. Redelivered items first."""
        if found := self._redelivered(lane, now, expired, skip):
            return found
        while lane.waiting:
            tenant = min(
                (q for name, q in lane.tenants.items() if q.waiting and name not in skip),
                key=lambda q: q.vtime,
                default=None,
            )
            if tenant is None:
                return None
            while tenant.heap:
                item = tenant.heap[0][2]
                if item.state is not State.WAITING:
                    heapq.heappop(tenant.heap)
                elif self._expired(item, lane.policy, now):
                    heapq.heappop(tenant.heap)
                    self._settle(lane, tenant, item, State.EXPIRED)
                    expired.append(item)
                else:
                    return tenant, item
        return None

    def _redelivered(
        self, lane: ClassLane, now: float, expired: list[Item], skip: set[str]
    ) -> tuple[TenantQueue, Item] | None:
        """The first redelivered item waiting in the lane, of a tenant not in `skip`."""
        while lane.redelivered and lane.redelivered[0].state is not State.WAITING:
            lane.redelivered.popleft()
        for item in lane.redelivered:  # settling changes an item's state, never the deque
            if item.state is not State.WAITING:
                continue
            if self._expired(item, lane.policy, now):
                self._settle(lane, lane.tenants[item.tenant], item, State.EXPIRED)
                expired.append(item)
            elif item.tenant not in skip:
                return lane.tenants[item.tenant], item
        return None

    def _preferred(
        self,
        lane: ClassLane,
        queue: TenantQueue,
        head: Item,
        now: float,
        prefer: Callable[[Item], float],
        skip: set[str],
    ) -> tuple[TenantQueue, Item]:
        """The best-scored item within the affinity slack of `head` (which wins ties), of a
        tenant not in `skip`."""
        best, best_score = (queue, head), prefer(head)
        for name, q in lane.tenants.items():
            if not q.waiting or name in skip or q.vtime > queue.vtime + AFFINITY_SLACK_COST:
                continue
            for _, _, item in q.heap[:HEAD_CANDIDATES]:
                if (
                    item is head
                    or item.state is not State.WAITING
                    or item.deadline - head.deadline > AFFINITY_SLACK_S
                    or self._expired(item, lane.policy, now)
                ):
                    continue
                score = prefer(item)
                if score > best_score:
                    best, best_score = (q, item), score
        return best

    def peek(self, now: float, classes: Iterable[str] = ()) -> Item | None:
        """The item a pull would most likely take first (the lane by rank or age, the fair tenant,
        its earliest deadline), or None; never changes a thing (an expired head: None)."""
        lane = self._pick_lane(now, None, set(classes) or set(self._lanes))
        if lane is None:
            return None
        if first := next((i for i in lane.redelivered if i.state is State.WAITING), None):
            return None if self._expired(first, lane.policy, now) else first
        queue = min((t for t in lane.tenants.values() if t.waiting), key=lambda t: t.vtime, default=None)
        if queue is None:
            return None
        live = [e[2] for e in queue.heap[:HEAD_CANDIDATES] if e[2].state is State.WAITING]
        item = min(live, key=lambda i: (i.deadline, i.order), default=None)
        return None if item is None or self._expired(item, lane.policy, now) else item

    def _remove(self, tenant: str, request_id: str, state: State) -> Item | None:
        item = self._items.get((tenant, request_id))
        if item is None:
            return None
        lane = self._lanes[item.klass]
        self._settle(lane, lane.tenants[item.tenant], item, state)
        return item  # its heap entry is dropped lazily by _head

    def _settle(self, lane: ClassLane, queue: TenantQueue, item: Item, state: State) -> None:
        item.state = state
        queue.waiting -= 1
        lane.waiting -= 1
        del self._items[item.key]
        if queue.waiting == 0:
            queue.heap.clear()  # only stale entries remain; the queue (and its vtime) stays
