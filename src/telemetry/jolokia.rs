//! Jolokia traffic metrics: what the operator asks of each broker endpoint, how many HTTP POSTs
//! that took, how long they took, and what the per-node budget permits now.
//!
//! One set per operator, a field of its `Metrics` (`Metrics::jolokia`); the transport reaches
//! it through the operator's `broker::Registry`, which every client is built with.
//!
//! Labels are bounded: `node` is an endpoint URL without its user info, `kind` is
//! `JolokiaRequest::kind()` (read, search or an operation name, never arguments), `result` is
//! `ok` or a refusal kind in snake case.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::RefusalKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JolokiaRequestLabels {
    pub node: String,
    pub kind: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InventoryReadLabels {
    pub node: String,
    /// `full` (every queue, address and divert) or `by_change` (counts and one page).
    pub read: String,
}

type HistogramFamily = Family<NodeLabels, Histogram, fn() -> Histogram>;

fn post_duration_histogram() -> Histogram {
    // 5 ms … ~10 s: a healthy bulk POST to a broker is milliseconds; the request timeout is seconds.
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

/// The Jolokia metric families (one per operator: its broker registry counts into them).
pub struct JolokiaMetrics {
    /// One per Jolokia operation (an element of a POST), by node, kind and result.
    pub requests: Family<JolokiaRequestLabels, Counter>,
    /// One per HTTP POST, by node.
    pub posts: Family<NodeLabels, Counter>,
    /// Seconds from sending a POST to having its whole answer (or the error), by node.
    pub post_duration: HistogramFamily,
    /// POSTs the budget permits in flight to a node now (AIMD: drops when the node is slow).
    pub permitted_concurrency: Family<NodeLabels, Gauge>,
    /// POSTs in flight to a node now.
    pub in_flight: Family<NodeLabels, Gauge>,
    /// Times the budget backed off from a node (a timeout, or answers slower than the threshold).
    pub backoffs: Family<NodeLabels, Counter>,
    /// A poll's inventory reads by node: in full, or by change (issue 45).
    pub inventory_reads: Family<InventoryReadLabels, Counter>,
    /// Operations per node whatever their kind and result (not exported: the exported family
    /// cannot be summed in process, and tests want the total).
    requests_by_node: Family<NodeLabels, Counter>,
}

impl Default for JolokiaMetrics {
    fn default() -> Self {
        JolokiaMetrics {
            requests: Family::default(),
            posts: Family::default(),
            post_duration: Family::new_with_constructor(post_duration_histogram),
            permitted_concurrency: Family::default(),
            in_flight: Family::default(),
            backoffs: Family::default(),
            inventory_reads: Family::default(),
            requests_by_node: Family::default(),
        }
    }
}

impl JolokiaMetrics {
    /// Add the families to a registry (prefix `artemis_studio` there).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "jolokia_requests",
            "Jolokia operations by node, kind and result (ok or the refusal kind)",
            self.requests.clone(),
        );
        registry.register("jolokia_posts", "Jolokia HTTP POSTs by node", self.posts.clone());
        registry.register(
            "jolokia_post_duration_seconds",
            "Duration of Jolokia HTTP POSTs by node",
            self.post_duration.clone(),
        );
        registry.register(
            "jolokia_permitted_concurrency",
            "Jolokia POSTs the per-node budget permits in flight now",
            self.permitted_concurrency.clone(),
        );
        registry.register(
            "jolokia_in_flight",
            "Jolokia POSTs in flight by node",
            self.in_flight.clone(),
        );
        registry.register(
            "jolokia_backoffs",
            "Times the per-node budget reduced what it permits (slow answers or timeouts)",
            self.backoffs.clone(),
        );
        registry.register(
            "inventory_reads",
            "A poll's inventory reads by node: full (every queue, address and divert) or by_change (counts and one page of queues)",
            self.inventory_reads.clone(),
        );
    }

    /// One poll's read of a node's inventory.
    pub fn record_inventory_read(&self, node: &str, full: bool) {
        let read = if full { "full" } else { "by_change" };
        self.inventory_reads
            .get_or_create(&InventoryReadLabels {
                node: node.to_string(),
                read: read.to_string(),
            })
            .inc();
    }

    /// Inventory reads of this node so far: (full, by change).
    pub fn inventory_reads_of(&self, node: &str) -> (u64, u64) {
        let of = |read: &str| {
            self.inventory_reads
                .get_or_create(&InventoryReadLabels {
                    node: node.to_string(),
                    read: read.to_string(),
                })
                .get()
        };
        (of("full"), of("by_change"))
    }

    /// One operation's result.
    pub fn record_request(&self, node: &str, kind: String, result: Option<RefusalKind>) {
        let result = match result {
            None => "ok".to_string(),
            Some(k) => refusal_label(k),
        };
        self.requests
            .get_or_create(&JolokiaRequestLabels {
                node: node.to_string(),
                kind,
                result,
            })
            .inc();
        self.requests_by_node.get_or_create(&node_labels(node)).inc();
    }

    /// One POST and how long it took.
    pub fn record_post(&self, node: &str, seconds: f64) {
        let labels = node_labels(node);
        self.posts.get_or_create(&labels).inc();
        self.post_duration.get_or_create(&labels).observe(seconds);
    }

    /// Operations sent to this node (by its budget key, see `broker::budget::node_key`).
    pub fn requests_of(&self, node: &str) -> u64 {
        self.requests_by_node.get_or_create(&node_labels(node)).get()
    }

    /// POSTs sent to this node.
    pub fn posts_of(&self, node: &str) -> u64 {
        self.posts.get_or_create(&node_labels(node)).get()
    }
}

fn node_labels(node: &str) -> NodeLabels {
    NodeLabels {
        node: node.to_string(),
    }
}

/// `QUEUE_EXISTS` → `queue_exists`.
fn refusal_label(kind: RefusalKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(s)) => s.to_ascii_lowercase(),
        _ => format!("{kind:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_kinds_are_snake_case_labels() {
        assert_eq!(refusal_label(RefusalKind::QueueExists), "queue_exists");
        assert_eq!(refusal_label(RefusalKind::NotAuthorized), "not_authorized");
    }

    #[test]
    fn totals_count_every_kind_and_result() {
        let m = JolokiaMetrics::default();
        m.record_request("n", "read".into(), None);
        m.record_request("n", "createQueue".into(), Some(RefusalKind::QueueExists));
        m.record_request("other", "read".into(), None);
        m.record_post("n", 0.01);
        assert_eq!(m.requests_of("n"), 2);
        assert_eq!(m.posts_of("n"), 1);
        assert_eq!(m.posts_of("other"), 0);
    }

    #[test]
    fn every_metrics_registry_exports_the_jolokia_families() {
        let node = "http://exported.example:8161/console/jolokia";
        let registry = crate::telemetry::Metrics::default();
        registry.jolokia.record_post(node, 0.02);
        registry
            .jolokia
            .record_request(node, "createQueue".into(), Some(RefusalKind::QueueExists));
        let _budget = crate::broker::Registry::new(registry.jolokia.clone()).budget_for(node);
        registry
            .kube_api
            .requests
            .get_or_create(&crate::telemetry::kube_api::ApiRequestLabels {
                verb: "patch".into(),
                kind: "artemisqueues/status".into(),
                code: "2xx".into(),
            })
            .inc();
        let text = registry.encode_text();
        for needle in [
            "artemis_studio_jolokia_posts_total{node=\"http://exported.example:8161/console/jolokia\"} 1",
            "artemis_studio_jolokia_requests_total{node=\"http://exported.example:8161/console/jolokia\",kind=\"createQueue\",result=\"queue_exists\"} 1",
            "artemis_studio_jolokia_post_duration_seconds_bucket{",
            "artemis_studio_jolokia_permitted_concurrency{node=\"http://exported.example:8161/console/jolokia\"} 4",
            "artemis_studio_api_requests_total{verb=\"patch\",kind=\"artemisqueues/status\",code=\"2xx\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
