//! Artemis Studio Operator: manages Apache ActiveMQ Artemis clusters from Kubernetes.
//! The ADRs in the design records are the spec; each module below owns one concept.

pub mod api;
pub mod backoff;
pub mod broker;
pub mod capture;
pub mod cli;
#[cfg(test)]
mod config_contract;
pub mod controllers;
pub mod crash_window;
pub mod fanout;
pub mod leader;
pub mod mcp;
pub mod reading;
pub mod shards;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod topology;
