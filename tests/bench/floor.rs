//! The ideal-operator floor (issue 45): what the least a queue operator must do per object
//! costs on this bed, measured in the same run as the operator. A port of
//! `../shared/bench/ideal_operator.py` (the floor as it is judged; `floor_shared.rs` runs that
//! script too when it is there, so a reader sees the two agree).
//!
//! Per ArtemisQueue: the object's create (what the harness does), one finalizer patch (before
//! the broker write, ADR-0084), one `createQueue` per node, one status patch (after; the bytes of
//! a status the operator wrote in this run). Two shapes, the faster one is the floor:
//! - single: each object through that pipeline, `in_flight` objects at a time, one exec per node
//!   per object (the nodes in parallel);
//! - bulk: groups of `bulk`: the group's creates, then its finalizer patches (`in_flight` at a
//!   time), one bulk POST per node, then its status patches.
//!
//! Plus the one-object latency: ten objects through the single pipeline one after another,
//! median. Objects go in a namespace no operator watches; what the floor made is removed after
//! each shape (finalizers dropped, objects deleted, queues destroyed on every node).

use std::time::Instant;

use anyhow::{Context, Result};
use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use artemis_studio_operator::api::queue::ArtemisQueue;

use crate::jolokia::{Jolokia, Node};

/// Objects through the single pipeline one after another for the one-object latency (the
/// shared script's count).
const LATENCY_OBJECTS: usize = 10;

/// What one floor measurement gave.
#[derive(Debug, Clone, Copy)]
pub struct FloorFigures {
    /// Objects/s, each through its own pipeline, `in_flight` at a time.
    pub single_rate: f64,
    /// Objects/s in groups sharing one bulk POST per node.
    pub bulk_rate: f64,
    /// One object through the single pipeline, alone: median milliseconds.
    pub one_object_ms: f64,
}

impl FloorFigures {
    /// The floor: the faster shape.
    pub fn rate(&self) -> f64 {
        self.single_rate.max(self.bulk_rate)
    }

    pub fn shape(&self) -> &'static str {
        if self.bulk_rate > self.single_rate {
            "bulk"
        } else {
            "single"
        }
    }

    pub fn json(&self) -> Value {
        json!({"singlePerSecond": self.single_rate, "bulkPerSecond": self.bulk_rate,
            "perSecond": self.rate(), "shape": self.shape(), "oneObjectMs": self.one_object_ms})
    }
}

/// The ideal operator: what it writes and where.
pub struct IdealOperator<'a> {
    queues: Api<DynamicObject>,
    ns: String,
    jolokia: &'a Jolokia,
    /// The status every object gets, copied from an object the operator made.
    status: Value,
    in_flight: usize,
    bulk: usize,
    durable: bool,
}

impl<'a> IdealOperator<'a> {
    pub fn new(client: &Client, ns: &str, jolokia: &'a Jolokia, status: Value) -> IdealOperator<'a> {
        let resource = ApiResource::erase::<ArtemisQueue>(&());
        IdealOperator {
            queues: Api::namespaced_with(client.clone(), ns, &resource),
            ns: ns.to_string(),
            jolokia,
            status,
            in_flight: 32,
            bulk: 64,
            durable: jolokia.durable,
        }
    }

    /// Objects in flight (the single shape, and each step of a group).
    pub fn in_flight(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight.max(1);
        self
    }

    /// Objects per group (the bulk shape).
    pub fn bulk(mut self, bulk: usize) -> Self {
        self.bulk = bulk.max(1);
        self
    }

    /// The one-object latency, then the single shape, then the bulk shape, each over its own
    /// names (`<prefix>lat…`, `<prefix>s…`, `<prefix>b…`) and cleaned up after.
    pub async fn measure(&self, prefix: &str, n: usize) -> Result<FloorFigures> {
        let names = |shape: &str, count: usize| -> Vec<String> {
            (0..count).map(|i| format!("{prefix}{shape}{i:05}")).collect()
        };
        let latency_names = names("lat", LATENCY_OBJECTS);
        let mut took_ms = vec![];
        for name in &latency_names {
            let start = Instant::now();
            self.one(name).await?;
            took_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        self.cleanup(&latency_names).await?;
        let single_names = names("s", n);
        let start = Instant::now();
        stream::iter(&single_names)
            .map(|name| self.one(name))
            .buffer_unordered(self.in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        let single_rate = n as f64 / start.elapsed().as_secs_f64();
        self.cleanup(&single_names).await?;
        let bulk_names = names("b", n);
        let start = Instant::now();
        for group in bulk_names.chunks(self.bulk) {
            self.group(group).await?;
        }
        let bulk_rate = n as f64 / start.elapsed().as_secs_f64();
        self.cleanup(&bulk_names).await?;
        Ok(FloorFigures {
            single_rate,
            bulk_rate,
            one_object_ms: crate::stats::Summary::of(&took_ms).map_or(f64::NAN, |s| s.median),
        })
    }

    /// One object through the whole pipeline.
    async fn one(&self, name: &str) -> Result<()> {
        self.create(name).await?;
        self.finalize(name).await?;
        try_join_all(self.jolokia.nodes.iter().map(|node| async move {
            self.jolokia
                .post(node, &self.create_exec(node, name))
                .await
                .map(|_| ())
        }))
        .await?;
        self.report(name).await
    }

    /// One group: its creates, its finalizer patches, one bulk POST per node, its status
    /// patches.
    async fn group(&self, names: &[String]) -> Result<()> {
        self.each(names, |name| self.create(name)).await?;
        self.each(names, |name| self.finalize(name)).await?;
        self.broker_bulk(names, |node, name| self.create_exec(node, name))
            .await?;
        self.each(names, |name| self.report(name)).await
    }

    /// `step` for every name, `in_flight` at a time.
    async fn each<'n, F, Fut>(&self, names: &'n [String], step: F) -> Result<()>
    where
        F: Fn(&'n String) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        stream::iter(names)
            .map(step)
            .buffer_unordered(self.in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// One POST per node carrying the exec of every name (the nodes in parallel); an error when
    /// the broker refused one.
    async fn broker_bulk(&self, names: &[String], exec: impl Fn(&Node, &str) -> Value + Sync) -> Result<()> {
        let exec = &exec;
        try_join_all(self.jolokia.nodes.iter().map(|node| async move {
            let bodies = names.iter().map(|name| exec(node, name)).collect();
            for answer in self.jolokia.bulk(node, bodies).await? {
                answer?;
            }
            Ok::<(), anyhow::Error>(())
        }))
        .await?;
        Ok(())
    }

    async fn create(&self, name: &str) -> Result<()> {
        let mut spec = json!({"clusterRef": {"name": "c"}, "routingType": "ANYCAST"});
        if !self.durable {
            spec["durable"] = json!(false);
        }
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name, "namespace": self.ns}, "spec": spec,
        }))?;
        self.queues
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("floor: create {name}"))?;
        Ok(())
    }

    async fn finalize(&self, name: &str) -> Result<()> {
        let patch = json!({"metadata": {"finalizers": ["artemis-studio.io/ideal"]}});
        self.queues
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("floor: finalizer of {name}"))?;
        Ok(())
    }

    async fn report(&self, name: &str) -> Result<()> {
        let patch = json!({"status": self.status});
        self.queues
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("floor: status of {name}"))?;
        Ok(())
    }

    /// The exec the shared script sends: `createQueue(String)` with the queue's configuration.
    fn create_exec(&self, node: &Node, name: &str) -> Value {
        let config = json!({"name": name, "address": name, "routing-type": "ANYCAST",
            "durable": self.durable, "auto-create-address": true});
        json!({"type": "exec", "mbean": node.mbean, "operation": "createQueue(java.lang.String)",
            "arguments": [config.to_string()]})
    }

    fn destroy_exec(node: &Node, name: &str) -> Value {
        json!({"type": "exec", "mbean": node.mbean,
            "operation": "destroyQueue(java.lang.String,boolean,boolean)", "arguments": [name, true, true]})
    }

    /// Finalizers dropped and objects deleted (`in_flight` at a time), then the queues destroyed
    /// on every node in bulk POSTs (addresses with them).
    async fn cleanup(&self, names: &[String]) -> Result<()> {
        let release = json!({"metadata": {"finalizers": null}});
        self.each(names, |name| {
            let release = &release;
            async move {
                self.queues
                    .patch(name, &PatchParams::default(), &Patch::Merge(release))
                    .await
                    .with_context(|| format!("floor: release {name}"))?;
                match self.queues.delete(name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(e).with_context(|| format!("floor: delete {name}")),
                }
            }
        })
        .await?;
        for group in names.chunks(self.bulk) {
            self.broker_bulk(group, Self::destroy_exec).await?;
        }
        Ok(())
    }
}
