//! Arrival order for a kind's reconciles (issue 45, "no object left behind"): the objects that
//! wait for a reconcile slot are served in the order their changes arrived, in every namespace.
//!
//! kube-runtime's own limit (`Config::concurrency`) parks the requests it cannot start yet in
//! its scheduler's `pending` set, a `HashSet`, and starts them in that set's iteration order
//! (kube-runtime 5.0 `scheduler.rs`, `poll_pop_queue_message`): a burst larger than the limit is
//! served in hash order, and an object can wait behind thousands that arrived after it. Instead,
//! kube starts every reconcile at once (no limit of its own; still one reconcile per object at a
//! time) and each waits here, at the kind's [`Gate`], for one of its slots; the gate grants
//! them by [`Arrival`], lowest first. A controller's [`Book`] gives each object its arrival:
//! when its change (or trigger) entered the controller — the moment the controller takes it
//! from its feed, so across namespaces the changes taken in one poll of the controllers are
//! ordered namespace by namespace — and keeps it while the object waits.
//!
//! A waiting reconcile is the task kube spawns for it, holding a small future (the pass itself
//! is built once a slot is granted), and an entry here: nothing else runs for it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

/// An object's place in line: the number its change drew when it entered the controller (lower
/// came first). One counter per [`Gate`], so the arrivals of every namespace's controller of a
/// kind are in one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arrival(u64);

/// A kind's reconcile slots, granted in [`Arrival`] order: so many reconciles at once over all
/// the kind's controllers, and when every slot is taken the waiting reconcile that arrived first
/// gets the next free one. Cloning shares the slots.
#[derive(Clone)]
pub struct Gate {
    shared: Arc<Shared>,
}

/// What the clones of a [`Gate`] share.
struct Shared {
    line: Mutex<Line>,
    clock: AtomicU64,
}

/// The slots not taken and the reconciles waiting for one.
struct Line {
    free: usize,
    /// Once closed (shutdown), nobody waits: every wait ends without a slot.
    closed: bool,
    /// Waiting reconciles by arrival (then by when they came to the gate, for equal arrivals).
    waiting: BTreeMap<(Arrival, u64), Arc<Ticket>>,
    /// How many waits came to the gate (the second half of a `waiting` key).
    came: u64,
}

/// One waiting reconcile's news: still waiting, granted a slot, or sent away (gate closed).
struct Ticket {
    state: AtomicU8,
    waker: AtomicWaker,
}

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const SENT_AWAY: u8 = 2;

impl Ticket {
    /// Set the waiter's news: under the line's lock, so that a waiter leaving the line sees
    /// either its ticket there or its news (then [`Ticket::wake`] it, outside the lock).
    fn set(&self, news: u8) {
        self.state.store(news, Ordering::Release);
    }

    fn wake(&self) {
        self.waker.wake();
    }
}

impl Gate {
    /// A gate of `size` slots (at least one).
    pub fn new(size: usize) -> Self {
        Gate {
            shared: Arc::new(Shared {
                line: Mutex::new(Line {
                    free: size.max(1),
                    closed: false,
                    waiting: BTreeMap::new(),
                    came: 0,
                }),
                clock: AtomicU64::new(0),
            }),
        }
    }

    /// The next arrival: after every arrival drawn before it, of any controller of the kind.
    pub fn arrival(&self) -> Arrival {
        Arrival(self.shared.clock.fetch_add(1, Ordering::Relaxed))
    }

    /// Wait for a slot, in line at `place`. Resolves to `None` once the gate is closed.
    pub fn wait(&self, place: Arrival) -> Wait {
        Wait {
            gate: self.clone(),
            place,
            ticket: None,
        }
    }

    /// Close the gate (shutdown): every waiting reconcile, and every later one, leaves without
    /// a slot; those holding one keep it until they finish.
    pub fn close(&self) {
        let sent_away: Vec<Arc<Ticket>> = {
            let mut line = self.line();
            line.closed = true;
            let waiting = std::mem::take(&mut line.waiting);
            waiting.into_values().inspect(|t| t.set(SENT_AWAY)).collect()
        };
        sent_away.iter().for_each(|t| t.wake());
    }

    /// How many reconciles wait for a slot.
    pub fn waiting(&self) -> usize {
        self.line().waiting.len()
    }

    fn line(&self) -> MutexGuard<'_, Line> {
        // The lock guards plain bookkeeping that no panic leaves half-done.
        self.shared.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot comes back: to the first in line, or to the free ones.
    fn give_back(&self) {
        let next = {
            let mut line = self.line();
            match line.waiting.pop_first() {
                Some((_, next)) => {
                    next.set(GRANTED);
                    Some(next)
                }
                None => {
                    line.free += 1;
                    None
                }
            }
        };
        if let Some(next) = next {
            next.wake();
        }
    }
}

/// A reconcile waiting at a [`Gate`] (see [`Gate::wait`]); dropped while waiting, it leaves
/// the line (and passes on a slot granted meanwhile).
pub struct Wait {
    gate: Gate,
    place: Arrival,
    /// Once in line: its key there and its ticket.
    ticket: Option<((Arrival, u64), Arc<Ticket>)>,
}

impl Future for Wait {
    type Output = Option<Slot>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Slot>> {
        if let Some((_, ticket)) = &self.ticket {
            // Cheap while waiting (one atomic read): kube polls every waiting task's handle.
            ticket.waker.register(cx.waker());
            let news = ticket.state.load(Ordering::Acquire);
            if news == WAITING {
                return Poll::Pending;
            }
            self.ticket = None;
            return Poll::Ready((news == GRANTED).then(|| Slot {
                gate: self.gate.clone(),
            }));
        }
        let mut line = self.gate.line();
        if line.closed {
            return Poll::Ready(None);
        }
        // Nobody waits while a slot is free: a freed slot goes straight to the first in line.
        if line.free > 0 {
            line.free -= 1;
            drop(line);
            return Poll::Ready(Some(Slot {
                gate: self.gate.clone(),
            }));
        }
        let key = (self.place, line.came);
        line.came += 1;
        let ticket = Arc::new(Ticket {
            state: AtomicU8::new(WAITING),
            waker: AtomicWaker::new(),
        });
        ticket.waker.register(cx.waker());
        line.waiting.insert(key, ticket.clone());
        drop(line);
        self.ticket = Some((key, ticket));
        Poll::Pending
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let Some((key, ticket)) = self.ticket.take() else {
            return;
        };
        let granted = {
            let mut line = self.gate.line();
            // Not in line any more: granted (or sent away) after its last poll.
            line.waiting.remove(&key).is_none() && ticket.state.load(Ordering::Acquire) == GRANTED
        };
        if granted {
            self.gate.give_back();
        }
    }
}

/// One of a gate's slots, held by a reconcile; dropping it frees the slot for the first in line.
pub struct Slot {
    gate: Gate,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.give_back();
    }
}

/// One controller's arrivals: each object's place in line, from the moment its change or
/// trigger entered the controller until its reconcile is granted a slot.
pub struct Book<K: Resource<DynamicType = ()> + 'static> {
    gate: Gate,
    /// The controller's cache: what a granted reconcile reads, and what a stale entry misses.
    reader: Store<K>,
    places: Mutex<Places<K>>,
}

/// The objects with a place, and the size at which the next sweep runs.
struct Places<K: Resource<DynamicType = ()> + 'static> {
    by_object: HashMap<ObjectRef<K>, Place>,
    sweep_at: usize,
}

/// Where an object stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Its change arrived; its reconcile has not reached the gate yet (kube holds it while the
    /// object's previous reconcile runs, or has not handed it over yet).
    Arrived(Arrival),
    /// Its reconcile waits at the gate, and reads the object's latest version once granted.
    AtGate,
}

/// Fewest places before a sweep of the entries whose object is gone.
const FIRST_SWEEP: usize = 1024;

impl<K: Resource<DynamicType = ()> + Clone + 'static> Book<K> {
    pub fn new(gate: Gate, reader: Store<K>) -> Self {
        Book {
            gate,
            reader,
            places: Mutex::new(Places {
                by_object: HashMap::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }

    /// A change or trigger for `object` entered the controller: it takes its place in line,
    /// unless it already has one (a re-trigger of a waiting object does not move it back).
    /// An object the cache does not hold gets none: kube does not reconcile it.
    pub fn arrived(&self, object: ObjectRef<K>) {
        if self.reader.get(&object).is_none() {
            return;
        }
        let mut places = self.places();
        places
            .by_object
            .entry(object)
            .or_insert_with(|| Place::Arrived(self.gate.arrival()));
        if places.by_object.len() >= places.sweep_at {
            // Entries whose reconcile never came (the object went before kube handed it over).
            let reader = &self.reader;
            places
                .by_object
                .retain(|o, p| *p == Place::AtGate || reader.get(o).is_some());
            places.sweep_at = (places.by_object.len() * 2).max(FIRST_SWEEP);
        }
    }

    /// A reconcile of `object` comes to the gate: in line at its change's arrival, or — a
    /// re-queue kube scheduled itself (a requeue, a retry) — at the back.
    pub fn in_line(self: &Arc<Self>, object: ObjectRef<K>) -> InLine<K> {
        let place = match self.places().by_object.insert(object.clone(), Place::AtGate) {
            Some(Place::Arrived(arrival)) => arrival,
            Some(Place::AtGate) | None => self.gate.arrival(),
        };
        InLine {
            book: self.clone(),
            object,
            place,
        }
    }

    /// How many objects have a place (arrived or at the gate).
    #[cfg(test)]
    pub fn places_held(&self) -> usize {
        self.places().by_object.len()
    }

    fn places(&self) -> MutexGuard<'_, Places<K>> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object no longer waits (granted a slot, or its wait dropped).
    fn leave(&self, object: &ObjectRef<K>) {
        let mut places = self.places();
        if places.by_object.get(object) == Some(&Place::AtGate) {
            places.by_object.remove(object);
        }
    }
}

/// A reconcile in line at its controller's gate (see [`Book::in_line`]).
pub struct InLine<K: Resource<DynamicType = ()> + Clone + 'static> {
    book: Arc<Book<K>>,
    object: ObjectRef<K>,
    place: Arrival,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> InLine<K> {
    /// Its place in line.
    #[cfg(test)]
    pub fn place(&self) -> Arrival {
        self.place
    }

    /// Wait for a slot, then read the object's latest version from the cache: a change that
    /// arrived while it waited is in what it reconciles. `None` when the gate closed (shutdown)
    /// or the object has left the cache meanwhile.
    pub async fn turn(self) -> Option<(Slot, Arc<K>)> {
        let slot = self.book.gate.wait(self.place).await?;
        let (book, object) = (self.book.clone(), self.object.clone());
        // Out of line before the read: a change arriving after it takes a new place.
        drop(self);
        let latest = book.reader.get(&object)?;
        Some((slot, latest))
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for InLine<K> {
    fn drop(&mut self) {
        self.book.leave(&self.object);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Arc;

    use futures::poll;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;

    use super::{Arrival, Book, Gate, Wait};

    /// The waits still pending after one poll each; the indexes of those that got a slot.
    async fn poll_all(waits: &mut [(usize, Option<Pin<Box<Wait>>>)]) -> Vec<(usize, super::Slot)> {
        let mut granted = vec![];
        for (i, w) in waits.iter_mut() {
            let Some(wait) = w.as_mut() else { continue };
            if let std::task::Poll::Ready(slot) = poll!(wait.as_mut()) {
                *w = None;
                granted.push((*i, slot.unwrap_or_else(|| panic!("wait {i} sent away"))));
            }
        }
        granted
    }

    /// The test the issue asks for: a full gate (its one slot held), n objects arriving in
    /// order but their reconciles reaching the gate in another order (reversed, then
    /// scrambled): the slot goes to them in arrival order.
    #[tokio::test]
    async fn slots_are_granted_in_arrival_order_whatever_order_reconciles_come_in() {
        let n = 61;
        for come_in in [
            (0..n).rev().collect::<Vec<_>>(),
            (0..n).map(|i| (i * 17 + 5) % n).collect(),
        ] {
            let gate = Gate::new(1);
            let held = gate.wait(gate.arrival()).await;
            let arrivals: Vec<Arrival> = (0..n).map(|_| gate.arrival()).collect();
            let mut waits: Vec<_> = come_in
                .iter()
                .map(|&i| (i, Some(Box::pin(gate.wait(arrivals[i])))))
                .collect();
            assert!(poll_all(&mut waits).await.is_empty(), "the gate is full");
            assert_eq!(gate.waiting(), n);
            let mut slot = held.unwrap_or_else(|| panic!("a free slot"));
            let mut served = vec![];
            for _ in 0..n {
                drop(slot);
                let mut granted = poll_all(&mut waits).await;
                assert_eq!(granted.len(), 1, "one slot, one grant");
                let (i, next) = granted.remove(0);
                served.push(i);
                slot = next;
            }
            assert_eq!(served, (0..n).collect::<Vec<_>>(), "come in as {come_in:?}");
            drop(slot);
            assert_eq!(gate.waiting(), 0);
        }
    }

    /// A slot free when a reconcile comes is taken at once; the slots are a total.
    #[tokio::test]
    async fn free_slots_are_taken_at_once_and_no_more() {
        let gate = Gate::new(2);
        let a = gate.wait(gate.arrival()).await;
        let b = gate.wait(gate.arrival()).await;
        assert!(a.is_some() && b.is_some());
        let mut c = Box::pin(gate.wait(gate.arrival()));
        assert!(poll!(c.as_mut()).is_pending());
        drop(a);
        assert!(matches!(poll!(c.as_mut()), std::task::Poll::Ready(Some(_))));
    }

    /// A wait dropped after it was granted a slot, before it saw it, passes the slot on; one
    /// dropped while waiting leaves the line.
    #[tokio::test]
    async fn a_dropped_wait_leaves_the_line_and_passes_a_granted_slot_on() {
        let gate = Gate::new(1);
        let held = gate.wait(gate.arrival()).await;
        let mut first = Box::pin(gate.wait(gate.arrival()));
        let mut second = Box::pin(gate.wait(gate.arrival()));
        let mut third = Box::pin(gate.wait(gate.arrival()));
        for w in [&mut first, &mut second, &mut third] {
            assert!(poll!(w.as_mut()).is_pending());
        }
        drop(second);
        assert_eq!(gate.waiting(), 2);
        drop(held);
        drop(first);
        assert!(matches!(poll!(third.as_mut()), std::task::Poll::Ready(Some(_))));
    }

    /// Shutdown: closing sends every waiting reconcile away, and any later one.
    #[tokio::test]
    async fn a_closed_gate_sends_waiters_away() {
        let gate = Gate::new(1);
        let held = gate.wait(gate.arrival()).await;
        let mut waiting = Box::pin(gate.wait(gate.arrival()));
        assert!(poll!(waiting.as_mut()).is_pending());
        gate.close();
        assert!(matches!(poll!(waiting.as_mut()), std::task::Poll::Ready(None)));
        assert!(gate.wait(gate.arrival()).await.is_none());
        drop(held);
        assert_eq!(gate.waiting(), 0);
    }

    fn map(name: &str, version: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version}
        }))
        .unwrap_or_else(|e| panic!("configmap: {e}"))
    }

    fn book_of(names: &[&str]) -> (Arc<Book<ConfigMap>>, reflector::store::Writer<ConfigMap>) {
        let (reader, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for n in names {
            writer.apply_watcher_event(&watcher::Event::InitApply(map(n, "1")));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        (Arc::new(Book::new(Gate::new(1), reader)), writer)
    }

    fn at(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    /// The test the issue asks for: a re-trigger (or a new change) of an object that already
    /// waits does not move it back in line.
    #[tokio::test]
    async fn a_retrigger_of_a_waiting_object_keeps_its_place() {
        let (book, _writer) = book_of(&["a", "b"]);
        book.arrived(at("a"));
        book.arrived(at("b"));
        book.arrived(at("a"));
        let b = book.in_line(at("b"));
        let a = book.in_line(at("a"));
        assert!(a.place() < b.place(), "a arrived first and keeps its place");
        // At the gate already: a trigger now changes nothing (the turn reads the latest).
        book.arrived(at("a"));
        assert_eq!(book.places_held(), 2);
    }

    /// Once its reconcile got a slot, an object's next change takes a new place, behind those
    /// that arrived meanwhile; a re-queue of kube's own (no change arrived) goes to the back.
    #[tokio::test]
    async fn after_its_turn_an_object_queues_anew() {
        let (book, _writer) = book_of(&["a", "b", "c"]);
        book.arrived(at("a"));
        let in_line = book.in_line(at("a"));
        let a_first = in_line.place();
        book.arrived(at("b"));
        let turn = in_line.turn().await;
        let (_slot, a) = turn.unwrap_or_else(|| panic!("a's turn"));
        assert_eq!(a.metadata.name.as_deref(), Some("a"));
        book.arrived(at("a"));
        let (a_again, b) = (book.in_line(at("a")).place(), book.in_line(at("b")).place());
        assert!(a_first < b && b < a_again, "a's new change is behind b");
        assert!(
            book.in_line(at("c")).place() > a_again,
            "a re-queue goes to the back"
        );
    }

    /// A turn reads the object's latest version (a change while it waited is in it), and an
    /// object the cache no longer holds gets no turn.
    #[tokio::test]
    async fn a_turn_reads_the_latest_version() {
        let (book, mut writer) = book_of(&["a", "b"]);
        book.arrived(at("a"));
        let waiting = book.in_line(at("a"));
        writer.apply_watcher_event(&watcher::Event::Apply(map("a", "2")));
        let turn = waiting.turn().await;
        let (slot, a) = turn.unwrap_or_else(|| panic!("a's turn"));
        assert_eq!(a.metadata.resource_version.as_deref(), Some("2"));
        drop(slot);
        let gone = book.in_line(at("b"));
        writer.apply_watcher_event(&watcher::Event::Delete(map("b", "2")));
        assert!(gone.turn().await.is_none());
        assert_eq!(book.places_held(), 0);
    }

    /// An object the cache does not hold takes no place (kube does not reconcile it), and the
    /// places of objects gone before their reconcile came are swept.
    #[tokio::test]
    async fn places_of_objects_not_in_the_cache_do_not_pile_up() {
        let names: Vec<String> = (0..super::FIRST_SWEEP).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (book, mut writer) = book_of(&refs);
        book.arrived(at("nowhere"));
        assert_eq!(book.places_held(), 0);
        for n in &names[..super::FIRST_SWEEP - 1] {
            book.arrived(at(n));
            writer.apply_watcher_event(&watcher::Event::Delete(map(n, "2")));
        }
        book.arrived(at(&names[super::FIRST_SWEEP - 1]));
        assert_eq!(
            book.places_held(),
            1,
            "only the object still cached keeps its place"
        );
    }
}
