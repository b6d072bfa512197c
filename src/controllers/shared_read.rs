//! A fresh read shared by the commands that ask for it at the same time. Each caller gets the
//! answer of a read that began after it asked — as fresh as the one it would have sent itself —
//! and callers that ask while one read is in flight share the next one. The gate before every
//! broker write reads the cluster's Secrets this way (a Secret withdrawn before a command asked
//! stops it), at one GET per round of concurrent commands instead of one per command.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The shared reads, one slot per key.
pub struct SharedReads<T> {
    slots: Mutex<HashMap<String, Arc<Slot<T>>>>,
}

impl<T> Default for SharedReads<T> {
    fn default() -> Self {
        SharedReads {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

struct Slot<T> {
    state: Mutex<State<T>>,
    done: Notify,
}

/// Reads are numbered in the order they began; `last` is the answer of read `finished`.
struct State<T> {
    started: u64,
    finished: u64,
    last: Option<T>,
}

fn lock<S>(m: &Mutex<S>) -> MutexGuard<'_, S> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// When a caller asked: it takes the answer of a read of its key that began after that.
#[derive(Clone, Copy, Debug)]
pub struct Asked {
    need: u64,
}

impl<T: Clone> SharedReads<T> {
    /// The answer of a read of `key` that began after this call: `read` is called only when
    /// no such read is in flight or done.
    pub async fn read<F, Fut>(&self, key: &str, read: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let asked = self.ask(key);
        self.answer(key, asked, read).await
    }

    /// Ask now, for an answer taken later ([`SharedReads::answer`]): a read begun meanwhile (by
    /// this caller alongside other work, or by anyone) answers it.
    pub fn ask(&self, key: &str) -> Asked {
        Asked {
            need: lock(&self.slot(key).state).started + 1,
        }
    }

    /// The answer of a read of `key` that began after `asked`: `read` is called only when no
    /// such read is in flight or done.
    pub async fn answer<F, Fut>(&self, key: &str, asked: Asked, read: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let slot = self.slot(key);
        let need = asked.need;
        let mut read = Some(read);
        loop {
            let notified = slot.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mine = {
                let mut s = lock(&slot.state);
                match &s.last {
                    Some(answer) if s.finished >= need => return answer.clone(),
                    _ if s.started == s.finished => {
                        s.started += 1;
                        Some(s.started)
                    }
                    _ => None,
                }
            };
            if let (Some(number), Some(read)) = (mine, mine.and_then(|_| read.take())) {
                let reading = Reading { slot: &slot, number };
                return reading.finish(read().await);
            }
            notified.await;
        }
    }

    fn slot(&self, key: &str) -> Arc<Slot<T>> {
        lock(&self.slots)
            .entry(key.to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    state: Mutex::new(State {
                        started: 0,
                        finished: 0,
                        last: None,
                    }),
                    done: Notify::new(),
                })
            })
            .clone()
    }
}

/// A read in flight: its answer is recorded for the callers waiting on it; dropped unfinished
/// (its caller cancelled), it gives the turn back so that a waiting caller reads instead.
struct Reading<'a, T> {
    slot: &'a Slot<T>,
    number: u64,
}

impl<T: Clone> Reading<'_, T> {
    fn finish(self, answer: T) -> T {
        {
            let mut s = lock(&self.slot.state);
            s.finished = self.number;
            s.last = Some(answer.clone());
        }
        answer
    }
}

impl<T> Drop for Reading<'_, T> {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.slot.state);
            if s.finished < self.number {
                s.started = s.finished;
            }
        }
        self.slot.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test]
    async fn callers_asking_together_share_one_read_and_a_later_caller_reads_again() {
        let reads: SharedReads<u64> = SharedReads::default();
        let count = AtomicU64::new(0);
        let gate = tokio::sync::Semaphore::new(0);
        let read = || async {
            let _ = gate.acquire().await;
            count.fetch_add(1, Ordering::SeqCst) + 1
        };
        // The first caller's read is in flight when the next three ask: they need a read that
        // began after them, and share it.
        let first = reads.read("c", read);
        let later = futures::future::join3(
            reads.read("c", read),
            reads.read("c", read),
            reads.read("c", read),
        );
        let both = futures::future::join(first, async {
            tokio::task::yield_now().await;
            gate.add_permits(10);
            later.await
        });
        let (a, (b, c, d)) = both.await;
        assert_eq!(a, 1);
        assert_eq!(
            (b, c, d),
            (2, 2, 2),
            "one read for the three that asked during the first"
        );
        assert_eq!(reads.read("c", read).await, 3, "a caller after them reads again");
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_read_begun_after_the_ask_answers_it_and_an_older_one_does_not() {
        let reads: SharedReads<u64> = SharedReads::default();
        let count = AtomicU64::new(0);
        let read = || async { count.fetch_add(1, Ordering::SeqCst) + 1 };
        assert_eq!(reads.read("c", read).await, 1);
        let asked = reads.ask("c");
        // Read 1 finished before the ask: not an answer. Read 2, begun after it, is.
        assert_eq!(reads.read("c", read).await, 2);
        assert_eq!(reads.answer("c", asked, read).await, 2);
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "the answer was the read begun after"
        );
        let later = reads.ask("c");
        assert_eq!(
            reads.answer("c", later, read).await,
            3,
            "nothing begun since: read"
        );
    }

    #[tokio::test]
    async fn a_cancelled_read_hands_the_turn_to_a_waiting_caller() {
        let reads: SharedReads<u64> = SharedReads::default();
        let never = || std::future::pending::<u64>();
        let cancelled = tokio::time::timeout(std::time::Duration::from_millis(10), reads.read("c", never));
        assert!(cancelled.await.is_err());
        assert_eq!(reads.read("c", || async { 7 }).await, 7);
    }
}
