//! The README's "Five minutes on the local stack", run as written (issue 22 item 8): the stack
//! `deploy/dev/demo` brings up (the CRDs, the operator on the `artemis-demo` namespace and the
//! test bed's database, the example cluster and queue), then the README's block through bash,
//! which must exit 0 and print what the walk-through promises.

use std::process::Command;
use std::time::Duration;

use crate::support::{TestBed, brokers_shared, wait_ready, wait_until};

/// The first ```sh block after the walk-through's heading.
fn walkthrough_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let from = readme
        .find("### Five minutes on the local stack")
        .expect("the walk-through heading");
    let rest = &readme[from..];
    let start = rest.find("```sh\n").expect("its sh block") + "```sh\n".len();
    let end = rest[start..].find("\n```").expect("the block's end");
    rest[start..start + end].to_string()
}

fn kubectl(bed: &TestBed, args: &[&str]) -> String {
    let out = Command::new(bed.var("TESTBED_KUBECTL"))
        .args(args)
        .env("KUBECONFIG", bed.var("TESTBED_KUBECONFIG"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test]
async fn the_readme_walkthrough_runs_as_written() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let plugin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-artemis"))
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("release"))
        .expect("target dir");
    let release_operator = plugin_dir.join("artemis-studio-operator");
    assert!(
        plugin_dir.join("kubectl-artemis").exists() && release_operator.exists(),
        "the walk-through runs the release build, as users do: run `cargo build --release --locked` first (.ci/run and deploy/dev/test do)"
    );
    // What deploy/dev/demo does, with the release operator (no test hooks): the smoke tier of
    // the binary users run. A test hook that would end its capture worker at once must do
    // nothing there (issue 43).
    let admin = bed.kube_admin().await;
    crate::smoke::install_crds(&admin).await;
    bed.install_operator_rbac().await;
    let port = 18_180 + (std::process::id() % 50) as u16;
    let hook = format!("capture:{}", plugin_dir.join("kubectl-artemis").display());
    let mut operator = bed.spawn_operator_binary(
        &release_operator,
        "artemis-demo",
        &bed.database_url(),
        port,
        &[
            ("INSTANCE_ID", "demo"),
            ("ARTEMIS_STUDIO_TEST_TASK_ENDS", hook.as_str()),
        ],
    );
    kubectl(&bed, &["apply", "-f", "deploy/examples/cluster.yaml"]);
    wait_ready(&reqwest::Client::new(), port).await;
    kubectl(
        &bed,
        &[
            "-n",
            "artemis-demo",
            "wait",
            "--for=condition=Ready",
            "artemiscluster/demo",
            "--timeout=120s",
        ],
    );
    kubectl(&bed, &["apply", "-f", "deploy/examples/queue.yaml"]);
    kubectl(
        &bed,
        &[
            "-n",
            "artemis-demo",
            "wait",
            "--for=condition=Ready",
            "artemisqueue/orders",
            "--timeout=120s",
        ],
    );

    // The block, as the README has it.
    let mut bash = Command::new("bash");
    bash.args(["-euo", "pipefail", "-c", &walkthrough_block()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", plugin_dir.parent().expect("target"));
    let out = tokio::task::spawn_blocking(move || bash.output())
        .await
        .expect("join")
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "the walk-through failed:\n{stdout}\n{stderr}"
    );
    // What it promises: per-node outcomes, the tail and the search of three orders, the audit.
    assert!(
        stdout.contains("APPLIED") || stdout.contains("ALREADY"),
        "{stdout}"
    );
    assert!(
        stdout.matches("order 3").count() >= 2,
        "tail and search show the messages:\n{stdout}"
    );
    assert!(stdout.contains("queue.apply"), "the audit trail:\n{stdout}");
    assert!(
        matches!(operator.0.try_wait(), Ok(None)),
        "the release operator runs on: it has no test hooks"
    );

    // Tidy the shared brokers: the subscription's taps, the queues, the namespace. The orders
    // queue holds the walk-through's messages: their loss is named, as the message cap (0) asks.
    kubectl(
        &bed,
        &[
            "-n",
            "artemis-demo",
            "patch",
            "artemisqueue/orders",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"deletion":{"allowMessageLoss":1000}}}"#,
        ],
    );
    for object in [
        "artemiscapturesubscription/orders-capture",
        "artemisqueue/orders",
        "connectionclose/slow-consumer",
    ] {
        kubectl(
            &bed,
            &[
                "-n",
                "artemis-demo",
                "delete",
                object,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
            ],
        );
    }
    kubectl(&bed, &["delete", "namespace", "artemis-demo", "--wait=false"]);
    wait_until("the demo namespace is gone", Duration::from_secs(120), || async {
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(admin.clone());
        namespaces
            .get_opt("artemis-demo")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}
