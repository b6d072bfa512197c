//! The operator process facing faults around it, as a user meets them with the binary (issue 41
//! item 6): a database password with special characters, an API server that cannot be reached,
//! and a stop (SIGTERM) while idle.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use artemis_studio_operator::store::{DatabaseConfig, Store};

use crate::leader::free_port;
use crate::support::{TestBed, short_id, wait_ready, wait_until};

/// A password with every character that ends a URL's authority early. Its pieces are
/// distinctive enough that finding one in an output means the password leaked.
const PASSWORD: &str = "Qxq@Zzy/Kwk#Jvj?Pqp";
const PIECES: [&str; 5] = ["Qxq", "Zzy", "Kwk", "Jvj", "Pqp"];

/// The namespace of the chart's leader-election Role as `install_operator_rbac` renders it.
const LEASE_NAMESPACE: &str = "artemis-studio";

fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_artemis-studio-operator"));
    // A failure's report is compared as text: no backtrace in it.
    cmd.env("RUST_BACKTRACE", "0").env("RUST_LIB_BACKTRACE", "0");
    cmd
}

/// Run the binary until it exits (bounded: a start-up that should fail must fail soon); its
/// output, stdout and stderr together.
fn run_to_exit(mut cmd: Command, within: Duration) -> (Output, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the operator binary");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "the operator did not exit within {within:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

fn assert_no_password(text: &str) {
    for piece in PIECES {
        assert!(
            !text.contains(piece),
            "the output shows the password ({piece}):\n{text}"
        );
    }
}

#[test]
fn a_raw_special_character_in_the_database_password_is_refused_naming_the_field_and_the_fix() {
    let bed = TestBed::get();
    let mut cmd = binary();
    cmd.args([
        "run",
        "--database-url",
        &format!("postgres://op:{PASSWORD}@127.0.0.1:5432/studio"),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ])
    .env("KUBECONFIG", bed.var("TESTBED_OPERATOR_KUBECONFIG"));
    let (out, text) = run_to_exit(cmd, Duration::from_secs(20));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("DATABASE_URL"), "names the setting:\n{text}");
    assert!(
        text.contains("Percent-encode") && text.contains("DATABASE_PASSWORD"),
        "says how to fix it:\n{text}"
    );
    assert_no_password(&text);
}

#[test]
fn a_database_that_cannot_be_reached_is_named_by_host_port_and_database_never_the_password() {
    let bed = TestBed::get();
    let port = free_port();
    let mut cmd = binary();
    cmd.args([
        "run",
        "--database-url",
        &format!("postgres://op@127.0.0.1:{port}/studio"),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ])
    .env("DATABASE_PASSWORD", PASSWORD)
    .env("KUBECONFIG", bed.var("TESTBED_OPERATOR_KUBECONFIG"));
    let (out, text) = run_to_exit(cmd, Duration::from_secs(60));
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{port}, database studio, user op")),
        "names the server:\n{text}"
    );
    assert_no_password(&text);
}

#[tokio::test]
async fn a_password_given_apart_from_the_url_is_used_as_it_is() {
    use sqlx::Connection;
    let bed = TestBed::get();
    let db = bed.fresh_database().await;
    let role = format!("r_{}", short_id());
    let mut admin = sqlx::PgConnection::connect(&bed.database_url())
        .await
        .expect("connect as admin");
    // The quote doubled: the password is SQL text here, and only here.
    let quoted = PASSWORD.replace('\'', "''");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{quoted}'"))
        .execute(&mut admin)
        .await
        .expect("create role");
    let parsed = url::Url::parse(&db).expect("bed url");
    let url = format!(
        "postgres://{role}@{}:{}{}",
        parsed.host_str().expect("host"),
        parsed.port().unwrap_or(5432),
        parsed.path()
    );
    let config = DatabaseConfig::new(&url, Some(PASSWORD)).expect("a URL without password");
    Store::migrate_to(&config).await.expect("migrate as the role");
    let store = Store::connect_to(&config).await.expect("connect as the role");
    let who: String = sqlx::query_scalar("SELECT current_user")
        .fetch_one(store.pool())
        .await
        .expect("query");
    assert_eq!(who, role);
}

/// The Lease's holder, if any.
async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn sigterm_on_an_idle_leader_exits_at_once_with_0_and_releases_the_lease() {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("stop").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let instance = format!("st-{}", short_id());
    let lease_name = format!("artemis-studio-operator-{instance}");
    let leases: Api<Lease> = Api::namespaced(bed.kube_admin().await, LEASE_NAMESPACE);
    let port = free_port();
    let env = [
        ("LEADER_ELECTION", "true"),
        ("LEASE_NAMESPACE", LEASE_NAMESPACE),
        ("INSTANCE_ID", instance.as_str()),
        ("POD_NAME", "stop-a"),
        ("SHUTDOWN_GRACE_SECONDS", "20"),
    ];
    let mut op = bed.spawn_operator(&ns, &db, port, &env);
    let http = reqwest::Client::new();
    wait_ready(&http, port).await;
    wait_until("this process holds the Lease", Duration::from_secs(60), || {
        let leases = leases.clone();
        let name = lease_name.clone();
        async move { holder(&leases, &name).await.filter(|h| h.starts_with("stop-a-")) }
    })
    .await;
    // Leading and ready: the controllers run, with nothing to do.
    wait_ready(&http, port).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &op.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM");
    let exit = wait_until(
        "the operator exits after SIGTERM",
        Duration::from_secs(30),
        || {
            let r = op.0.try_wait().expect("try_wait");
            async move { r }
        },
    )
    .await;
    let took = sent.elapsed();
    assert!(exit.success(), "a stop by SIGTERM exits 0: {exit:?}");
    assert!(
        took < Duration::from_secs(3),
        "an idle operator stops at once, not after the 20 s grace: took {took:?}"
    );
    assert_eq!(holder(&leases, &lease_name).await, None, "the Lease is released");
    let _ = leases.delete(&lease_name, &Default::default()).await;
}

/// The operator's kubeconfig, pointed at a port nothing listens on: the API server unreachable.
fn unreachable_api_kubeconfig(bed: &TestBed) -> tempfile_path::Kubeconfig {
    let text = std::fs::read_to_string(bed.var("TESTBED_OPERATOR_KUBECONFIG")).expect("kubeconfig");
    let mut config: serde_json::Value = serde_saphyr::from_str(&text).expect("kubeconfig yaml");
    let server = format!("https://127.0.0.1:{}", free_port());
    for cluster in config["clusters"].as_array_mut().expect("clusters").iter_mut() {
        cluster["cluster"]["server"] = serde_json::Value::String(server.clone());
    }
    let path = std::env::temp_dir().join(format!("unreachable-{}.kubeconfig", short_id()));
    std::fs::write(&path, serde_saphyr::to_string(&config).expect("yaml")).expect("write kubeconfig");
    tempfile_path::Kubeconfig(path)
}

mod tempfile_path {
    /// A file removed when dropped.
    pub struct Kubeconfig(pub std::path::PathBuf);
    impl Drop for Kubeconfig {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The operator against an unreachable API server, logging JSON lines at info into a file.
struct Unreachable {
    process: crate::support::OperatorProcess,
    log: std::path::PathBuf,
    _kubeconfig: tempfile_path::Kubeconfig,
}

impl Unreachable {
    async fn start(leader_election: bool) -> Unreachable {
        let bed = TestBed::get();
        let db = bed.fresh_database().await;
        let kubeconfig = unreachable_api_kubeconfig(&bed);
        let log = std::env::temp_dir().join(format!("unreachable-{}.log", short_id()));
        let file = std::fs::File::create(&log).expect("log file");
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_artemis-studio-operator"));
        let mut cmd = bed.operator_command(binary, "unreachable", &db, free_port(), &[]);
        cmd.env("KUBECONFIG", &kubeconfig.0)
            .env("RUST_LOG", "info")
            .env("LOG_JSON", "true")
            .env("LEADER_ELECTION", leader_election.to_string())
            .env("LEASE_NAMESPACE", LEASE_NAMESPACE)
            .stdout(file);
        let process = crate::support::OperatorProcess(cmd.spawn().expect("start the operator"));
        Unreachable {
            process,
            log,
            _kubeconfig: kubeconfig,
        }
    }

    /// Started, left 30 s facing the unreachable API server, then stopped by SIGTERM (which
    /// must exit 0 at once: nothing is in flight): its log lines.
    async fn log_of_30s(leader_election: bool) -> Vec<serde_json::Value> {
        let mut op = Unreachable::start(leader_election).await;
        op.wait_started().await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let lines = op.lines();
        let (took, exit) = op.stop().await;
        assert!(
            exit.success() && took < Duration::from_secs(3),
            "{exit:?} after {took:?}"
        );
        lines
    }

    /// The log's lines so far, parsed.
    fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Wait until the process has started (its "starting" line).
    async fn wait_started(&self) {
        wait_until(
            "the operator logs that it starts",
            Duration::from_secs(60),
            || {
                let started = self.lines().iter().any(|l| l["fields"]["message"] == "starting");
                async move { started.then_some(()) }
            },
        )
        .await;
    }

    /// SIGTERM; how long the exit took, and its status.
    async fn stop(&mut self) -> (Duration, std::process::ExitStatus) {
        let sent = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.process.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM");
        let child = &mut self.process.0;
        let exit = wait_until(
            "the operator exits after SIGTERM",
            Duration::from_secs(30),
            || {
                let r = child.try_wait().expect("try_wait");
                async move { r }
            },
        )
        .await;
        (sent.elapsed(), exit)
    }
}

impl Drop for Unreachable {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Warnings and errors, as `level target message` lines (for failure messages and counts).
fn complaints(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .map(|l| format!("{} {} {}", l["level"], l["target"], l["fields"]))
        .collect()
}

/// What a user of the binary sees with the API server unreachable: the kube client's own line
/// for every failed request is gone, and the standby's attempts on the Lease back off and are
/// summarised (the 1st, 2nd, 4th… failure in a row), never one line per retry period.
#[tokio::test]
async fn an_unreachable_api_server_is_retried_by_the_lease_loop_with_growing_delays_and_few_lines() {
    let lines = Unreachable::log_of_30s(true).await;
    let all = complaints(&lines);
    let per_request: Vec<&String> = all
        .iter()
        .filter(|l| l.contains("kube_client::client::builder"))
        .collect();
    assert!(
        per_request.is_empty(),
        "a line per failed request: {per_request:#?}"
    );
    let lease: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "artemis_studio_operator::leader" && l["level"] == "WARN")
        .collect();
    // Retried every 2 s, 15 attempts would have been 15 lines; backing off, 30 s hold about 6
    // attempts, of which the 1st, 2nd and 4th are logged.
    assert!(
        (1..=4).contains(&lease.len()),
        "the Lease loop's lines in 30 s: {lease:#?}"
    );
    for l in &lease {
        let failures = l["fields"]["failures"].as_u64().expect("failures field");
        assert!(failures.is_power_of_two(), "{l}");
    }
}

/// Every watch backs off too (kube's default backoff never grew: ~1 line per watch per second).
#[tokio::test]
async fn an_unreachable_api_server_is_retried_by_every_watch_with_growing_delays_and_few_lines() {
    let lines = Unreachable::log_of_30s(false).await;
    let all = complaints(&lines);
    // Eight watches: at most a handful of lines each in 30 s (was about 30 each).
    assert!(all.len() <= 8 * 4, "{} lines in 30 s: {all:#?}", all.len());
}

/// A stop while the caches cannot sync: the controllers never started, nothing is in flight, so
/// the stop is at once, not after the shutdown grace.
#[tokio::test]
async fn sigterm_while_the_caches_cannot_sync_exits_at_once_with_0() {
    let mut op = Unreachable::start(false).await;
    op.wait_started().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (took, exit) = op.stop().await;
    assert!(exit.success(), "a stop by SIGTERM exits 0: {exit:?}");
    assert!(
        took < Duration::from_secs(3),
        "nothing was in flight, yet the stop took {took:?} (the grace is 20 s)"
    );
}

/// Issue 43: a supervised task that ends unasked (the capture worker, killed by a test hook
/// once the process is ready) takes the process down non-zero, naming the task — never a pod
/// that stays Ready with capture dead.
#[tokio::test]
async fn a_capture_worker_that_dies_takes_the_process_down_naming_it() {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("task-ends").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let port = free_port();
    let marker = std::env::temp_dir().join(format!("task-ends-{}", short_id()));
    let hook = format!("capture:{}", marker.display());
    let mut cmd = bed.operator_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_artemis-studio-operator")),
        &ns,
        &db,
        port,
        &[
            ("ARTEMIS_STUDIO_TEST_TASK_ENDS", hook.as_str()),
            ("LOG_JSON", "true"),
        ],
    );
    let mut op =
        crate::support::OperatorProcess(cmd.stdout(Stdio::piped()).spawn().expect("start the operator"));
    let http = reqwest::Client::new();
    wait_ready(&http, port).await;
    let health = http
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert!(health.status().is_success(), "healthy before: {health:?}");
    std::fs::write(&marker, "end").expect("marker");
    let exit = wait_until("the operator exits", Duration::from_secs(30), || {
        let r = op.0.try_wait().expect("try_wait");
        async move { r }
    })
    .await;
    let _ = std::fs::remove_file(&marker);
    assert_eq!(
        exit.code(),
        Some(artemis_studio_operator::supervisor::EXIT_TASK_ENDED),
        "{exit:?}"
    );
    let mut log = String::new();
    if let Some(mut out) = op.0.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_string(&mut log);
    }
    assert!(
        log.lines()
            .any(|l| l.contains("supervised task ended unasked") && l.contains("\"task\":\"capture\"")),
        "the log names the task: {log}"
    );
}
