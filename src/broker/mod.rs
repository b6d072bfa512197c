//! The broker: Jolokia transport (every POST within a per-node budget, concurrent single calls
//! batched), ObjectNames, the typed management surface, and the one error type every management
//! call returns, classified here (ADR-0049, ADR-0084 §6).

pub mod batch;
pub mod budget;
pub mod delivery;
pub mod error;
pub mod jolokia;
pub mod management;
pub mod mbean;
pub mod messages;

pub use error::{BrokerError, ManagementRefusal};
pub use jolokia::{Credentials, JolokiaClient, JolokiaRequest};
pub use management::{BrokerManagement, NodeIdentity, TopologyMember};

/// Jolokia operations sent to this endpoint URL (any kind, any result), process-wide.
pub fn jolokia_requests_of(url: &str) -> u64 {
    crate::telemetry::jolokia::metrics().requests_of(&budget::node_key(url))
}

/// Jolokia HTTP POSTs sent to this endpoint URL, process-wide.
pub fn jolokia_posts_of(url: &str) -> u64 {
    crate::telemetry::jolokia::metrics().posts_of(&budget::node_key(url))
}
