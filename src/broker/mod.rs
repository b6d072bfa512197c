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
pub mod registry;

pub use error::{BrokerError, ManagementRefusal};
pub use jolokia::{Credentials, JolokiaClient, JolokiaRequest};
pub use management::{BrokerManagement, NodeIdentity, TopologyMember};
pub use registry::Registry;
