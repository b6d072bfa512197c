//! Issue 41, last item: faults at size, reduced for CI (200 queues with a divert each, 30 capture
//! taps, under a producer): a broker restarts, a node freezes and thaws, the operator is SIGKILLed
//! mid-burst and restarted, a second installation declares a tenth of the queues. After each
//! fault the brokers (every node, over Jolokia) and the audit databases (SQL) must show the
//! declared state, no pending audit row, nothing destroyed that no object asked to destroy,
//! every tap HEALTHY within two capture passes, and stored + reported loss = sent (±20 %).
//!
//! The scenario is the benchmark's (`deploy/dev/bench faults` runs it at full size): one
//! implementation, tests/bench/faults_core.rs, with a size parameter.

#[path = "../bench/faults_core.rs"]
mod faults_core;

use crate::support::{TestBed, brokers_exclusive, short_id};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_reduced_size_keep_brokers_as_declared_destroy_nothing_and_account_for_every_copy() {
    // It stops, freezes and thaws brokers of cluster c.
    let _exclusive = brokers_exclusive().await;
    let bed = TestBed::get();
    bed.install_operator_rbac().await;
    let id = short_id();
    // Declared before the operators run (the scenario stops them before it returns, and sweeps
    // the brokers itself too): every broker object of the run carries `id`.
    let _clean = bed.clean_up(&[&id]);
    let run = faults_core::RunSpec {
        size: faults_core::Size::reduced(),
        operator_bin: std::path::PathBuf::from(env!("CARGO_BIN_EXE_artemis-studio-operator")),
        prefix: format!("faults.{id}."),
        instance: format!("faults-{id}"),
        log_dir: std::env::temp_dir(),
        token: id.clone(),
    };
    let report = faults_core::run(&run)
        .await
        .expect("the scenario could not start");
    eprintln!("{}", report.markdown());
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "{} checks failed (operator logs: {}/faults-operator-*-{id}.log):\n{}",
        failures.len(),
        run.log_dir.display(),
        failures.join("\n")
    );
}
