//! Integration tests against the real test bed: Artemis brokers, kube-apiserver + etcd, Postgres.
//! Bring it up with `deploy/dev/testbed up` (the README's test command does).

mod api_metrics;
mod audit_log;
#[path = "../common/bed.rs"]
mod bed;
mod binary;
mod broker_budget;
mod capture;
mod capture_blast;
mod capture_cost;
mod capture_failover_loss;
mod capture_faults;
mod capture_ha_scale;
mod capture_names;
mod capture_reconcile;
mod capture_scale;
mod chart;
mod close_once;
mod cluster_core;
mod connection_close;
mod crash_delete;
mod credentials;
mod delivery;
mod divert;
mod faults;
mod filters;
mod gitops;
mod hung_node;
mod leader;
mod loops;
mod mcp;
mod pause;
mod process_faults;
mod queue;
mod reading;
mod replay;
mod safety;
mod sampling;
mod scale;
mod shards;
mod smoke;
mod support;
#[path = "../common/testbed_env.rs"]
mod testbed_env;
mod tls;
mod two_installations;
mod upgrade;
mod walkthrough;
