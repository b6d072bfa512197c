//! Issue 43: the process's long-lived tasks, watched. A task spawned here that ends while the
//! process is not stopping — it returned, or it panicked — marks the process unhealthy and not
//! ready (`/healthz` and `/readyz` say which task), and the binary exits non-zero
//! ([`EXIT_TASK_ENDED`]) so that Kubernetes restarts it: a replica whose capture worker died
//! must not stay Ready serving nothing.
//!
//! What restarts by design restarts inside its own task and is not an end: a capture drain
//! (`capture::drain`, with a counted backoff) and the audit writer (`store::audit`). The
//! controllers run under the leader election, which exits on their end (`leader`).
//!
//! A task may also promise a heartbeat ([`Supervisor::expect_beats`]): one that has not beaten
//! within its bound is stuck, and the probes fail naming it (Kubernetes restarts the pod).

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

/// The exit code of a process one of whose supervised tasks ended unasked (EX_SOFTWARE).
pub const EXIT_TASK_ENDED: i32 = 70;

/// How a supervised task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The task's registered name, e.g. `capture`.
    pub task: &'static str,
    /// `returned`, or `panicked: <message>`.
    pub how: String,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {} task ended unasked ({})", self.task, self.how)
    }
}

/// Registers tasks and remembers the first that ended unasked. Cheap to clone.
#[derive(Clone, Default)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    ended: Mutex<Option<Ended>>,
    notify: Notify,
    stopping: std::sync::atomic::AtomicBool,
    /// Per task that promised heartbeats: its last beat and the most time between two.
    beats: Mutex<std::collections::BTreeMap<&'static str, (Instant, Duration)>>,
}

impl Supervisor {
    /// Spawn `task` as a long-lived task named `name`: its end is a failure of the process
    /// unless [`Supervisor::stopping`] was called first.
    pub fn spawn<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let how = match std::panic::AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) => "returned".to_string(),
                Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
            };
            inner.record(Ended { task: name, how });
        });
    }

    /// The process is stopping (a signal, the Lease lost): tasks that end now are expected.
    pub fn stopping(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// `task` beats at least every `within` from now on (it is stuck otherwise).
    pub fn expect_beats(&self, task: &'static str, within: Duration) {
        if let Ok(mut b) = self.inner.beats.lock() {
            b.insert(task, (Instant::now(), within));
        }
    }

    /// `task` is making progress.
    pub fn beat(&self, task: &'static str) {
        if let Ok(mut b) = self.inner.beats.lock()
            && let Some((last, _)) = b.get_mut(task)
        {
            *last = Instant::now();
        }
    }

    /// What is wrong with the process now: a task that ended unasked, or one whose last beat is
    /// older than its bound. None: healthy.
    pub fn unhealthy(&self) -> Option<String> {
        if let Some(ended) = self.ended() {
            return Some(ended.to_string());
        }
        let beats = self.inner.beats.lock().ok()?;
        beats.iter().find_map(|(task, (last, within))| {
            let quiet = last.elapsed();
            (quiet > *within).then(|| {
                format!(
                    "the {task} task has not made progress for {}s (at most {}s expected)",
                    quiet.as_secs(),
                    within.as_secs()
                )
            })
        })
    }

    /// The first task that ended unasked, if one did.
    pub fn ended(&self) -> Option<Ended> {
        self.inner.ended.lock().ok().and_then(|e| e.clone())
    }

    /// Wait until a task ends unasked; returns which.
    pub async fn first_end(&self) -> Ended {
        loop {
            let notified = self.inner.notify.notified();
            if let Some(ended) = self.ended() {
                return ended;
            }
            notified.await;
        }
    }
}

impl Inner {
    fn record(&self, ended: Ended) {
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            tracing::info!(task = ended.task, how = %ended.how, "task ended while stopping");
            return;
        }
        tracing::error!(task = ended.task, how = %ended.how, "a supervised task ended unasked: the process is unhealthy and exits");
        if let Ok(mut first) = self.ended.lock() {
            first.get_or_insert(ended);
        }
        self.notify.notify_waiters();
    }
}

/// A panic's message when it is text (`panic!("…")`), else a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_named_with_its_message() {
        let s = Supervisor::default();
        s.spawn("capture", async { panic!("boom") });
        let ended = s.first_end().await;
        assert_eq!(ended.task, "capture");
        assert_eq!(ended.how, "panicked: boom");
        assert_eq!(s.ended(), Some(ended));
    }

    #[tokio::test]
    async fn a_task_that_returns_is_an_end_and_the_first_end_is_kept() {
        let s = Supervisor::default();
        s.spawn("health", async {});
        assert_eq!(s.first_end().await.how, "returned");
        s.spawn("capture", async { panic!("later") });
        tokio::task::yield_now().await;
        assert_eq!(s.first_end().await.task, "health");
    }

    #[tokio::test]
    async fn a_task_ending_while_the_process_stops_is_not_a_failure() {
        let s = Supervisor::default();
        s.stopping();
        let (tx, rx) = tokio::sync::oneshot::channel();
        s.spawn("capture", async move {
            let _ = tx.send(());
        });
        let _ = rx.await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(s.ended(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_stops_beating_is_unhealthy_until_it_beats_again() {
        let s = Supervisor::default();
        s.expect_beats("capture", Duration::from_secs(300));
        tokio::time::sleep(Duration::from_secs(299)).await;
        assert_eq!(s.unhealthy(), None);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            s.unhealthy().as_deref(),
            Some("the capture task has not made progress for 301s (at most 300s expected)")
        );
        s.beat("capture");
        assert_eq!(s.unhealthy(), None);
        s.beat("never-registered");
        assert_eq!(
            s.unhealthy(),
            None,
            "a beat of a task that promised none changes nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_task_is_no_end() {
        let s = Supervisor::default();
        s.spawn("capture", std::future::pending());
        let waited = tokio::time::timeout(std::time::Duration::from_secs(3600), s.first_end()).await;
        assert!(waited.is_err(), "no end while the task runs");
    }
}
