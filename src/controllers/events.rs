//! Events off the reconcile's path (issue 45): a pass queues its Event and goes on to write its
//! status; one task publishes the queued Events in order through kube's recorder (which
//! aggregates repeats), as client-go's event broadcaster does. An update's Event had been a round
//! trip to the API server before its status, about 3 ms of every update, while the object's
//! reconcile slot was held.
//!
//! An Event is what a human reads, never what the operator acts on: when the queue is full
//! (the API server refusing or slow), a new Event is dropped, counted
//! (`artemis_studio_events_dropped_total`) and logged, and the pass goes on. The status and the
//! audit log still say what happened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, mpsc};

/// Events that may wait for the publisher before new ones are dropped.
pub const QUEUED: usize = 1024;

/// The process's Event publisher. Cheap to clone; the task starts on the first Event.
#[derive(Clone)]
pub struct EventSink {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: Recorder,
    capacity: usize,
    tx: Mutex<Option<mpsc::Sender<Queued>>>,
    progress: Arc<Progress>,
    dropped: Counter,
}

type Queued = (Event, ObjectReference);

/// Events handed to the sink, and those it is done with (published, refused or dropped).
#[derive(Default)]
struct Progress {
    queued: AtomicU64,
    done: AtomicU64,
    changed: Notify,
}

impl Progress {
    fn finish(&self) {
        self.done.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }
}

impl EventSink {
    pub fn new(recorder: Recorder, dropped: Counter) -> Self {
        Self::with_capacity(recorder, dropped, QUEUED)
    }

    fn with_capacity(recorder: Recorder, dropped: Counter, capacity: usize) -> Self {
        EventSink {
            inner: Arc::new(Inner {
                recorder,
                capacity,
                tx: Mutex::new(None),
                progress: Arc::default(),
                dropped,
            }),
        }
    }

    /// Queue `ev` on the object `regarding`: it is published after the Events queued before it.
    pub fn publish(&self, ev: Event, regarding: ObjectReference) {
        let progress = &self.inner.progress;
        progress.queued.fetch_add(1, Ordering::AcqRel);
        // Why an Event was not queued: the publisher's queue is full, or (rarely) the publisher
        // ended since the check above or the lock was poisoned.
        let refused = match self.inner.tx.lock() {
            Ok(mut tx) => {
                let sender = match tx.as_ref() {
                    Some(s) if !s.is_closed() => s,
                    dead => {
                        if dead.is_some() {
                            tracing::error!("the Event publisher task ended: starting another");
                        }
                        tx.insert(self.spawn())
                    }
                };
                sender.try_send((ev, regarding)).err().map(|e| match e {
                    mpsc::error::TrySendError::Full((ev, _)) => (ev, "the publish queue is full"),
                    mpsc::error::TrySendError::Closed((ev, _)) => (ev, "the publisher ended"),
                })
            }
            Err(_) => Some((ev, "the publisher's lock was poisoned")),
        };
        if let Some((ev, why)) = refused {
            self.inner.dropped.inc();
            tracing::warn!(reason = %ev.reason, action = %ev.action, why, "event dropped");
            progress.finish();
        }
    }

    /// The publisher: one Event at a time, in the order queued. It ends by design when the last
    /// clone of the sink is dropped.
    fn spawn(&self) -> mpsc::Sender<Queued> {
        let (tx, mut rx) = mpsc::channel::<Queued>(self.inner.capacity);
        let (recorder, progress) = (self.inner.recorder.clone(), self.inner.progress.clone());
        // Supervision: a publisher that ended is replaced at the next Event (`publish`).
        tokio::spawn(async move {
            while let Some((ev, regarding)) = rx.recv().await {
                if let Err(e) = recorder.publish(&ev, &regarding).await {
                    tracing::warn!(error = %e, reason = %ev.reason, "could not publish event");
                }
                progress.finish();
            }
        });
        tx
    }

    /// Returns once every Event queued before the call is done with (published, refused by the
    /// API server, or dropped): what a test awaits before it reads Events, and the process before
    /// it exits.
    pub async fn settled(&self) {
        let progress = &self.inner.progress;
        let target = progress.queued.load(Ordering::Acquire);
        loop {
            let changed = progress.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if progress.done.load(Ordering::Acquire) >= target {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod on_a_mock_api {
    use std::time::Duration;

    use kube::runtime::events::{EventType, Reporter};
    use serde_json::json;

    use super::*;
    use crate::controllers::fixtures;

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(format!("{reason} note")),
            action: "queue.apply".into(),
            secondary: None,
        }
    }

    fn regarding(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("artemis-studio.io/v1alpha1".into()),
            kind: Some("ArtemisQueue".into()),
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn sink(capacity: usize) -> (EventSink, fixtures::Received, Counter) {
        let (ctx, received) = fixtures::context(Box::new(|sent| (201, sent.body.clone())));
        let recorder = Recorder::new(
            ctx.client.clone(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let dropped = Counter::default();
        (
            EventSink::with_capacity(recorder, dropped.clone(), capacity),
            received,
            dropped,
        )
    }

    fn reasons(received: &fixtures::Received) -> Vec<String> {
        received
            .all()
            .iter()
            .filter(|s| s.method == "POST" && s.uri.contains("/events"))
            .map(|s| s.body["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    #[tokio::test]
    async fn events_are_published_in_the_order_queued_and_settled_waits_for_them() {
        let (sink, received, dropped) = sink(QUEUED);
        for (i, r) in ["Applied", "Adopted", "OtherWriter"].into_iter().enumerate() {
            sink.publish(event(r), regarding(&format!("q{i}")));
        }
        tokio::time::timeout(Duration::from_secs(10), sink.settled())
            .await
            .expect("settled");
        assert_eq!(reasons(&received), ["Applied", "Adopted", "OtherWriter"]);
        assert_eq!(dropped.get(), 0);
        let sent = received.all();
        assert_eq!(
            sent[0].body["regarding"],
            json!({
                "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
                "name": "q0", "namespace": "ns", "uid": "uid-q0"
            })
        );
    }

    /// A publish never waits: past the queue's capacity an Event is dropped and counted, and the
    /// ones queued are still published.
    #[tokio::test(flavor = "current_thread")]
    async fn past_the_queue_s_capacity_an_event_is_dropped_and_counted_without_waiting() {
        let (sink, received, dropped) = sink(2);
        // On a current-thread runtime the publisher cannot run before this test yields: the
        // queue takes two Events, and the other three find it full.
        for i in 0..5 {
            sink.publish(event(&format!("E{i}")), regarding("q"));
        }
        assert_eq!(dropped.get(), 3, "three of five Events past a queue of two");
        tokio::time::timeout(Duration::from_secs(10), sink.settled())
            .await
            .expect("settled");
        assert_eq!(reasons(&received), ["E0", "E1"]);
    }
}
