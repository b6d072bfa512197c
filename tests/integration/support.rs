#![allow(dead_code)] // shared by every test module; not every test uses every helper
//! Test support: the real test bed (deploy/dev/testbed) as the tests see it. Every test gets a
//! fresh namespace and a fresh database; brokers are shared, so tests use unique object names.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use kube::{Api, Client, Config};

use crate::bed::{self, Apply, Bed};

pub use crate::bed::Broker;

/// The field manager the tests install the CRDs and the operator's RBAC as (forcing).
const MANAGER: &str = "artemis-studio-tests";

/// The test bed (tests/common/bed.rs), every error a panic naming it.
pub struct TestBed {
    bed: Bed,
}

/// The value, or a panic with the error and its causes.
fn ok<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

impl TestBed {
    /// The running test bed. Panics with the command to run when it is not up.
    pub fn get() -> TestBed {
        TestBed { bed: ok(Bed::get()) }
    }

    pub fn var(&self, key: &str) -> String {
        self.bed
            .var(key)
            .unwrap_or_else(|_| panic!("test bed env has no {key}"))
    }

    pub fn brokers(&self) -> Vec<Broker> {
        ok(self.bed.brokers())
    }

    pub fn broker(&self, name: &str) -> Broker {
        ok(self.bed.broker(name))
    }

    pub fn cluster_brokers(&self, cluster: &str) -> Vec<Broker> {
        ok(self.bed.cluster_brokers(cluster))
    }

    pub fn broker_user(&self) -> (String, String) {
        ok(self.bed.broker_user())
    }

    pub fn viewer_user(&self) -> (String, String) {
        ok(self.bed.viewer_user())
    }

    pub fn database_url(&self) -> String {
        ok(self.bed.database_url())
    }

    /// A client for the API server with the admin identity.
    pub async fn kube_admin(&self) -> Client {
        client_from(&self.var("TESTBED_KUBECONFIG")).await
    }

    /// A client with the operator's own identity: only what the chart's RBAC grants it.
    pub async fn kube_operator(&self) -> Client {
        client_from(&self.var("TESTBED_OPERATOR_KUBECONFIG")).await
    }

    /// A fresh namespace for one test.
    pub async fn fresh_namespace(&self, prefix: &str) -> String {
        let client = self.kube_admin().await;
        let name = format!("{prefix}-{}", short_id());
        bed::create_namespace(&client, &name, &[])
            .await
            .expect("create namespace");
        name
    }

    /// A fresh, empty database for one test; returns its URL.
    pub async fn fresh_database(&self) -> String {
        let db = format!("t_{}", short_id());
        self.bed.create_database(&db).await.expect("create database")
    }

    /// Start, stop, kill (SIGKILL), freeze (SIGSTOP) or thaw (SIGCONT) one broker; `start`
    /// returns once the broker is ready.
    pub fn broker_action(&self, action: &str, name: &str) {
        let status = std::process::Command::new(self.var("TESTBED_SCRIPT"))
            .args(["broker", action, name])
            .status()
            .expect("run the testbed script");
        assert!(status.success(), "testbed broker {action} {name} failed");
    }

    /// A throwaway Postgres server (its own data dir and port) this test may stop and start;
    /// destroyed when dropped. The shared server never stops.
    pub fn scratch_postgres(&self, name: &str) -> ScratchPostgres {
        let mut sp = ScratchPostgres {
            script: self.var("TESTBED_SCRIPT"),
            name: name.to_string(),
            url: String::new(),
        };
        let port = sp.run("start");
        sp.url = format!("postgres://postgres@127.0.0.1:{}/postgres", port.trim());
        sp
    }

    /// Restore the replicated pair (primary active, backup in sync) after a failover test.
    pub fn ha_restore(&self) {
        let status = std::process::Command::new(self.var("TESTBED_SCRIPT"))
            .arg("ha-restore")
            .status()
            .expect("run the testbed script");
        assert!(status.success(), "testbed ha-restore failed");
    }
}

pub async fn config_from(path: &str) -> Config {
    bed::config_from(path).await.expect("kubeconfig")
}

async fn client_from(path: &str) -> Client {
    bed::client_from(path).await.expect("kube client")
}

/// Create a namespace unless it exists.
pub async fn ensure_namespace(client: &Client, name: &str) {
    ok(bed::ensure_namespace(client, name).await)
}

/// Server-side apply every document of a multi-document YAML stream (each object's kind found
/// by discovery), forcing; returns the applied objects.
pub async fn apply_manifests(client: &Client, yaml: &str, manager: &str) -> Vec<kube::api::DynamicObject> {
    ok(bed::apply_manifests(client, yaml, &Apply { manager, force: true }).await).objects
}

pub fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// Poll `check` until it returns Some, or fail after `timeout` naming `what`. The timeout is a
/// bound on a broken system, never an assertion about speed.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_until_or_say(what, timeout, check, || async { String::new() }).await
}

/// [`wait_until`], and on timeout the failure also says what `say` finds then (the state that
/// explains the wait: CI's log may keep little else of a failing test).
pub async fn wait_until_or_say<T, F, Fut, S, SFut>(what: &str, timeout: Duration, mut check: F, say: S) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
    S: FnOnce() -> SFut,
    SFut: Future<Output = String>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}\n{}", say().await);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The queue names `broker` holds now, read from the broker itself (`QueueNames`); `None` when
/// it did not answer with them.
pub async fn queue_names(bed: &TestBed, broker: &Broker) -> Option<std::collections::BTreeSet<String>> {
    let (_, body) = jolokia_raw(
        broker,
        &bed.broker_user(),
        Some("http://localhost"),
        serde_json::json!({"type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", broker.name),
               "attribute": "QueueNames"}),
    )
    .await;
    body["value"].as_array().map(|names| {
        names
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    })
}

/// One raw Jolokia POST (tests only; the operator uses broker::JolokiaClient).
pub async fn jolokia_raw(
    broker: &Broker,
    user: &(String, String),
    origin: Option<&str>,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let client = reqwest::Client::new();
    let mut req = client
        .post(&broker.jolokia)
        .basic_auth(&user.0, Some(&user.1))
        .json(&body);
    if let Some(o) = origin {
        req = req.header("Origin", o);
    }
    let resp = req.send().await.expect("jolokia request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// Tests that stop, kill or freeze brokers hold this exclusively; tests that need every broker
/// up hold it shared.
static BROKER_STATE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub async fn brokers_shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    BROKER_STATE.read().await
}

pub async fn brokers_exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    BROKER_STATE.write().await
}

impl TestBed {
    /// ClusterAccess for one test bed cluster, with the given broker user.
    pub fn access(
        &self,
        cluster: &str,
        user: (String, String),
    ) -> artemis_studio_operator::topology::ClusterAccess {
        artemis_studio_operator::topology::ClusterAccess {
            http: artemis_studio_operator::broker::jolokia::http_client(
                &artemis_studio_operator::broker::Registry::standalone(),
                None,
            )
            .expect("client"),
            endpoints: self
                .cluster_brokers(cluster)
                .into_iter()
                .map(|b| b.jolokia)
                .collect(),
            origin: None,
            credentials: artemis_studio_operator::broker::Credentials {
                username: user.0,
                password: user.1,
            },
            request_timeout: Duration::from_secs(5),
            poll_timeout: Duration::from_secs(5),
            secret_versions: Default::default(),
            ca: None,
            full_read_interval: artemis_studio_operator::topology::by_change::FULL_READ_INTERVAL,
        }
    }

    /// Install the CRDs (the library's, `api::all_crds()`) and the chart's RBAC, rendered by
    /// `helm template` for release `artemis-studio-operator` in namespace `artemis-studio`: the
    /// ServiceAccount `artemis-studio:artemis-studio-operator`, which is who
    /// TESTBED_OPERATOR_KUBECONFIG's token authenticates as. Applied as `artemis-studio-tests`,
    /// forcing.
    pub async fn install_operator_rbac(&self) {
        let client = self.kube_admin().await;
        let crds = artemis_studio_operator::api::all_crds();
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(bed::CHART);
        let apply = Apply {
            manager: MANAGER,
            force: true,
        };
        ok(self
            .bed
            .install_crds_and_rbac(&client, &crds, &chart, &apply)
            .await);
    }

    /// A `helm` command: the bed's (TESTBED_HELM), or, on a bed started by an older script,
    /// the one this checkout's testbed script builds.
    pub fn helm(&self) -> std::process::Command {
        ok(self.bed.helm())
    }

    /// `helm template RELEASE charts/artemis-studio-operator --namespace NAMESPACE ARGS`: the
    /// rendered manifests, or helm's error output.
    pub fn helm_template(&self, release: &str, namespace: &str, args: &[&str]) -> Result<String, String> {
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(bed::CHART);
        ok(self.bed.helm_template(&chart, release, namespace, args))
    }

    /// The chart's finalizer policy for release `release`, bound to `namespaces`, applied as
    /// `helm install` would put it on this bed, and effective (a dry-run create in the first
    /// namespace is stored with the finalizer). [`TestBed::remove_finalizer_policy`] removes it.
    pub async fn install_finalizer_policy(&self, release: &str, namespaces: &[&str]) {
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(bed::CHART);
        let yaml = ok(self.bed.finalizer_policy(&chart, release, namespaces));
        let admin = self.kube_admin().await;
        apply_manifests(&admin, &yaml, "artemis-studio-tests").await;
        if let Some(ns) = namespaces.first() {
            ok(bed::wait_finalizer_policy(&admin, ns, Duration::from_secs(60)).await);
        }
    }

    pub async fn remove_finalizer_policy(&self, release: &str) {
        ok(bed::delete_finalizer_policy(&self.kube_admin().await, release).await);
    }

    /// Start the operator's controllers in this process, as the operator's own identity (only
    /// the chart's RBAC), watching one namespace. Dropping the handle stops them.
    pub async fn start_operator(&self, namespace: &str) -> OperatorHandle {
        self.start_operator_for(&[namespace]).await
    }

    /// The operator watching several namespaces.
    pub async fn start_operator_for(&self, namespaces: &[&str]) -> OperatorHandle {
        let db = self.fresh_database().await;
        self.start_operator_on(namespaces, &db, &format!("test-{}", short_id()))
            .await
    }

    /// The operator on a given database and instance ID (a restart of the same installation).
    pub async fn start_operator_on(
        &self,
        namespaces: &[&str],
        db: &str,
        instance_id: &str,
    ) -> OperatorHandle {
        self.install_operator_rbac().await;
        let config = config_from(&self.var("TESTBED_OPERATOR_KUBECONFIG")).await;
        self.start_operator_as(namespaces, db, instance_id, config).await
    }

    /// The operator under a given identity (e.g. a release's ServiceAccount, impersonated),
    /// whose RBAC the caller installed.
    pub async fn start_operator_as(
        &self,
        namespaces: &[&str],
        db: &str,
        instance_id: &str,
        config: Config,
    ) -> OperatorHandle {
        self.start_operator_passing_every(namespaces, db, instance_id, config, Duration::from_secs(2))
            .await
    }

    /// The operator with capture passes every `pass_interval` (2 s elsewhere in the tests).
    pub async fn start_operator_passing_every(
        &self,
        namespaces: &[&str],
        db: &str,
        instance_id: &str,
        config: Config,
        pass_interval: Duration,
    ) -> OperatorHandle {
        // The operator's logs go to the test's output (shown when it fails); RUST_LOG filters.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        // The operator's API requests are counted as the binary counts them.
        let metrics = std::sync::Arc::new(artemis_studio_operator::telemetry::Metrics::default());
        let client = artemis_studio_operator::telemetry::api_client_with(config, &metrics).expect("client");
        artemis_studio_operator::store::Store::migrate(db)
            .await
            .expect("migrate");
        let store = artemis_studio_operator::store::Store::connect(db)
            .await
            .expect("store");
        let (mut ctx, mut reflectors) = artemis_studio_operator::controllers::Context::new(
            client,
            store.clone(),
            instance_id.to_string(),
            artemis_studio_operator::controllers::Namespaces::Only(
                namespaces.iter().map(|n| n.to_string()).collect(),
            ),
            metrics,
        );
        ctx.capture_pass_interval = pass_interval;
        let ctx = std::sync::Arc::new(ctx);
        let subscription_writers = reflectors.take_subscriptions();
        let controllers = tokio::spawn(artemis_studio_operator::controllers::run_all(
            ctx.clone(),
            reflectors,
        ));
        // As the binary runs it: capture beside the controllers.
        let capture = tokio::spawn(artemis_studio_operator::capture::run(
            ctx.clone(),
            subscription_writers,
        ));
        OperatorHandle {
            ctx,
            store,
            db: db.to_string(),
            task: controllers,
            capture,
        }
    }
}

pub struct OperatorHandle {
    pub ctx: std::sync::Arc<artemis_studio_operator::controllers::Context>,
    pub store: artemis_studio_operator::store::Store,
    /// The database URL this operator uses.
    pub db: String,
    task: tokio::task::JoinHandle<()>,
    capture: tokio::task::JoinHandle<()>,
}

impl OperatorHandle {
    /// Stop this operator's controllers and capture now (as a process exit would).
    pub fn stop(&self) {
        self.task.abort();
        self.capture.abort();
    }
}

impl Drop for OperatorHandle {
    fn drop(&mut self) {
        self.task.abort();
        self.capture.abort();
    }
}

/// Create a Secret with broker credentials and an ArtemisCluster pointing at `urls`.
pub async fn create_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    urls: &[String],
    user: Option<(String, String)>,
) -> artemis_studio_operator::api::ArtemisCluster {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    if let Some((u, p)) = user {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{name}-credentials")},
            "stringData": {"username": u, "password": p}
        }))
        .expect("secret json");
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }
    let brokers: Vec<serde_json::Value> = urls.iter().map(|u| serde_json::json!({"url": u})).collect();
    let cluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
        "metadata": {"name": name},
        "spec": {"brokers": brokers, "credentials": {"secretName": format!("{name}-credentials")},
                 "pollIntervalSeconds": 2, "requestTimeoutSeconds": 10}
    }))
    .expect("cluster json");
    Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create ArtemisCluster")
}

/// Wait until an ArtemisCluster's condition `type_` has `status`; returns the object.
pub async fn wait_cluster_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
) -> artemis_studio_operator::api::ArtemisCluster {
    let api: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(client.clone(), ns);
    wait_until(
        &format!("ArtemisCluster {ns}/{name} {type_}={status}"),
        Duration::from_secs(60),
        || {
            let api = api.clone();
            async move {
                let c = api.get(name).await.ok()?;
                let ok = c
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .any(|x| x.type_ == type_ && x.status == status);
                ok.then_some(c)
            }
        },
    )
    .await
}

/// Send `count` text messages to an address on one broker (AddressControl.sendMessage).
pub async fn send_messages(bed: &TestBed, broker: &str, address: &str, count: usize) {
    send_messages_with(bed, broker, address, count, serde_json::json!({})).await
}

/// Send `count` text messages with these (string) properties.
pub async fn send_messages_with(
    bed: &TestBed,
    broker: &str,
    address: &str,
    count: usize,
    properties: serde_json::Value,
) {
    let b = bed.broker(broker);
    let user = bed.broker_user();
    let mbean =
        format!("org.apache.activemq.artemis:broker=\"{broker}\",component=addresses,address=\"{address}\"");
    for i in 0..count {
        let (_, body) = jolokia_raw(
            &b,
            &user,
            Some("http://localhost"),
            serde_json::json!({"type": "exec", "mbean": mbean,
                "operation": "sendMessage(java.util.Map,int,java.lang.String,boolean,java.lang.String,java.lang.String)",
                "arguments": [properties.clone(), 3, format!("message {i}"), true, user.0, user.1]}),
        )
        .await;
        assert_eq!(body["status"], 200, "send to {address} on {broker}: {body}");
    }
}

/// A real AMQP 1.0 consumer attached to an address on one broker; dropped = detached.
pub struct AmqpConsumer {
    pub connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    pub session: fe2o3_amqp::session::SessionHandle<()>,
    pub receiver: fe2o3_amqp::Receiver,
}

pub async fn amqp_consumer(bed: &TestBed, broker: &str, address: &str, container_id: &str) -> AmqpConsumer {
    let b = bed.broker(broker);
    let (u, p) = bed.broker_user();
    let url = b.amqp.replace("amqp://", &format!("amqp://{u}:{p}@"));
    let mut connection = fe2o3_amqp::Connection::open(container_id.to_string(), url.as_str())
        .await
        .expect("AMQP connection");
    let mut session = fe2o3_amqp::Session::begin(&mut connection)
        .await
        .expect("AMQP session");
    let receiver = fe2o3_amqp::Receiver::attach(&mut session, format!("{container_id}-rx"), address)
        .await
        .expect("AMQP receiver");
    AmqpConsumer {
        connection,
        session,
        receiver,
    }
}

/// A real AMQP 1.0 producer attached to an address on one broker (container `producer-{tag}`).
pub struct AmqpProducer {
    pub connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    pub session: fe2o3_amqp::session::SessionHandle<()>,
    pub sender: fe2o3_amqp::Sender,
}

impl AmqpProducer {
    /// Detach, end the session and close the connection.
    pub async fn close(mut self) {
        let _ = self.sender.close().await;
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

pub async fn amqp_producer(
    bed: &TestBed,
    broker: &str,
    address: &str,
    tag: &str,
) -> Result<AmqpProducer, String> {
    let b = bed.broker(broker);
    let (u, p) = bed.broker_user();
    let url = b.amqp.replace("amqp://", &format!("amqp://{u}:{p}@"));
    let mut connection = fe2o3_amqp::Connection::open(format!("producer-{tag}"), url.as_str())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut session = fe2o3_amqp::Session::begin(&mut connection)
        .await
        .map_err(|e| format!("session: {e}"))?;
    let sender = fe2o3_amqp::Sender::attach(&mut session, format!("tx-{tag}"), address.to_string())
        .await
        .map_err(|e| format!("attach: {e}"))?;
    Ok(AmqpProducer {
        connection,
        session,
        sender,
    })
}

/// Puts the HA cluster back (plain node started, pair failed back) however a test ends.
pub struct RestoreHa<'a>(pub &'a TestBed);
impl Drop for RestoreHa<'_> {
    fn drop(&mut self) {
        self.0.broker_action("start", "ha2");
        self.0.ha_restore();
    }
}

/// Thaws a frozen broker however the test ends.
pub struct Thaw<'a>(pub &'a TestBed, pub &'static str);
impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.broker_action("thaw", self.1);
    }
}

/// The connection ID the broker reports for a client ID, if it is connected.
pub async fn connection_of(
    m: &artemis_studio_operator::broker::BrokerManagement,
    client_id: &str,
) -> Option<String> {
    let rows = m
        .list(
            artemis_studio_operator::broker::management::ListKind::Connections,
            "clientID",
            client_id,
        )
        .await
        .ok()?;
    rows.first()?.get("connectionID")?.as_str().map(str::to_string)
}

/// The operator binary as a deployment runs it (the chart's RBAC identity), watching one
/// namespace; killed (SIGKILL) when dropped.
pub struct OperatorProcess(pub std::process::Child);
impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl TestBed {
    pub fn spawn_operator(&self, ns: &str, db: &str, port: u16, env: &[(&str, &str)]) -> OperatorProcess {
        self.spawn_operator_binary(
            std::path::Path::new(env!("CARGO_BIN_EXE_artemis-studio-operator")),
            ns,
            db,
            port,
            env,
        )
    }

    /// [`TestBed::spawn_operator`] with another build of the operator (e.g. the previous
    /// commit's, [`TestBed::previous_operator`]).
    pub fn spawn_operator_binary(
        &self,
        binary: &std::path::Path,
        ns: &str,
        db: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> OperatorProcess {
        OperatorProcess(
            self.operator_command(binary, ns, db, port, env)
                .spawn()
                .unwrap_or_else(|e| panic!("start the operator binary {}: {e}", binary.display())),
        )
    }

    /// The command `spawn_operator_binary` runs (its output discarded: a caller that reads the
    /// operator's log redirects stdout).
    pub fn operator_command(
        &self,
        binary: &std::path::Path,
        ns: &str,
        db: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> std::process::Command {
        let mut cmd = std::process::Command::new(binary);
        cmd.args([
            "run",
            "--database-url",
            db,
            "--namespaces",
            ns,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("KUBECONFIG", self.var("TESTBED_OPERATOR_KUBECONFIG"))
        .env("RUST_LOG", "warn")
        // Every process acts at once unless a test asks for leader election (tests/integration/
        // leader.rs): close_once runs two acting processes on purpose.
        .env("LEADER_ELECTION", "false")
        .stdout(std::process::Stdio::null());
        for (k, v) in env {
            assert!(
                !k.starts_with("ARTEMIS_STUDIO_TEST_") || cfg!(feature = "test-hooks"),
                "{k} opens a test hook only in a test-hooks build: run the suite with `--features test-hooks` (deploy/dev/test does)"
            );
            cmd.env(k, v);
        }
        cmd
    }

    /// The operator binary of the commit an upgrade starts from (`deploy/dev/upgrade-from`),
    /// built by this checkout's testbed script (once per commit, minutes on a cold cache), and
    /// that commit's CRD file.
    pub fn previous_operator(&self) -> (PathBuf, PathBuf) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dev/testbed");
        let out = std::process::Command::new(&script)
            .arg("previous-operator")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run the testbed script");
        assert!(
            out.status.success(),
            "deploy/dev/testbed previous-operator failed"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines().map(PathBuf::from);
        match (lines.next(), lines.next()) {
            (Some(binary), Some(crds)) => (binary, crds),
            _ => panic!("deploy/dev/testbed previous-operator printed no binary and CRD file: {text}"),
        }
    }
}

/// The `/metrics` text of an operator process on `port`.
pub async fn metrics(http: &reqwest::Client, port: u16) -> String {
    http.get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body")
}

/// Wait until an operator process on `port` answers /readyz with 200.
pub async fn wait_ready(http: &reqwest::Client, port: u16) {
    wait_until("/readyz answers 200", Duration::from_secs(60), || {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
}

/// A Postgres server of one test (see [`TestBed::scratch_postgres`]).
pub struct ScratchPostgres {
    script: String,
    name: String,
    /// `postgres://…/postgres` on this server.
    pub url: String,
}

impl ScratchPostgres {
    fn run(&self, action: &str) -> String {
        let out = std::process::Command::new(&self.script)
            .args(["scratch-postgres", action, &self.name])
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run the testbed script");
        assert!(
            out.status.success(),
            "testbed scratch-postgres {action} {} failed",
            self.name
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Stop it as a crash would (immediate shutdown: every connection cut).
    pub fn stop(&self) {
        self.run("stop");
    }

    /// Start it again, on the same port and data.
    pub fn start(&self) {
        self.run("start");
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.script)
            .args(["scratch-postgres", "destroy", &self.name])
            .status();
    }
}

/// Tests share the bed's brokers, so each one leaves them as it found them: when this is dropped
/// (the test ended, passed or panicked), every divert, queue and address whose name contains one
/// of its tokens is removed from every broker of the bed. Tokens are the test's `short_id()`s,
/// which every broker object name the test makes carries (capture's names carry the captured
/// address, so a tap on a test's address is removed with it). Declare it before the operator:
/// locals drop in reverse order, so the operator stops first and recreates nothing.
pub struct CleanUp {
    brokers: Vec<Broker>,
    user: (String, String),
    tokens: std::sync::Mutex<Vec<String>>,
}

impl TestBed {
    pub fn clean_up(&self, tokens: &[&str]) -> CleanUp {
        assert!(
            tokens.iter().all(|t| t.len() >= 8),
            "a clean-up token must be a short_id(), never a common word: {tokens:?}"
        );
        CleanUp {
            brokers: self.brokers(),
            user: self.broker_user(),
            tokens: std::sync::Mutex::new(tokens.iter().map(|t| t.to_string()).collect()),
        }
    }
}

impl CleanUp {
    /// Add a token minted after the guard was made.
    pub fn also(&self, token: &str) {
        assert!(token.len() >= 8, "a clean-up token must be a short_id(): {token}");
        if let Ok(mut t) = self.tokens.lock() {
            t.push(token.to_string());
        }
    }
}

impl Drop for CleanUp {
    fn drop(&mut self) {
        let brokers = std::mem::take(&mut self.brokers);
        let user = self.user.clone();
        let tokens = match self.tokens.get_mut() {
            Ok(t) => std::mem::take(t),
            Err(p) => std::mem::take(p.into_inner()),
        };
        if tokens.is_empty() {
            return;
        }
        let what = tokens.clone();
        // Its own thread and runtime: Drop cannot await, and may run inside the test's runtime.
        let swept = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("clean-up runtime");
            rt.block_on(async {
                let mut left = Vec::new();
                for b in &brokers {
                    left.extend(sweep_broker(b, &user, &tokens).await);
                }
                left
            })
        })
        .join();
        match swept {
            Ok(left) if left.is_empty() => {}
            Ok(left) => eprintln!("clean-up left on the brokers: {left:?}"),
            Err(_) => eprintln!("clean-up of {what:?} panicked"),
        }
    }
}

/// Remove one broker's objects named with a token: diverts first (a divert holds its source
/// address), then queues (with their messages and consumers), then the addresses left. Each phase
/// reads the names it removes, so an address the queue's removal took with it is not asked for
/// again. A broker that is down or passive has nothing to remove (the bed drops its data when it
/// starts it again). Returns what it could not remove.
async fn sweep_broker(broker: &Broker, user: &(String, String), tokens: &[String]) -> Vec<String> {
    // Generous: one bulk request destroys every durable queue of a test (hundreds in the scale
    // tests) on a busy bed.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client");
    let mbean = format!("org.apache.activemq.artemis:broker=\"{}\"", broker.name);
    let post = |body: serde_json::Value| {
        let req = http
            .post(&broker.jolokia)
            .basic_auth(&user.0, Some(&user.1))
            .header("Origin", "http://localhost")
            .json(&body);
        async move {
            match req.send().await {
                Ok(r) => r.json::<serde_json::Value>().await.unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            }
        }
    };
    type Args = fn(&str) -> serde_json::Value;
    let phases: [(&str, &str, Args); 3] = [
        ("DivertNames", "destroyDivert(java.lang.String)", |n| {
            serde_json::json!([n])
        }),
        (
            "QueueNames",
            "destroyQueue(java.lang.String,boolean,boolean)",
            |n| serde_json::json!([n, true, true]),
        ),
        ("AddressNames", "deleteAddress(java.lang.String,boolean)", |n| {
            serde_json::json!([n, true])
        }),
    ];
    let mut left = Vec::new();
    for (attribute, operation, args) in phases {
        let read = post(serde_json::json!({"type": "read", "mbean": mbean, "attribute": attribute})).await;
        let names: Vec<&str> = read["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .filter(|n| tokens.iter().any(|t| n.contains(t.as_str())))
            .collect();
        if names.is_empty() {
            continue;
        }
        let execs = names
            .iter()
            .map(|n| serde_json::json!({"type": "exec", "mbean": mbean, "operation": operation, "arguments": args(n)}))
            .collect();
        let answers = post(serde_json::Value::Array(execs)).await;
        for (i, n) in names.iter().enumerate() {
            if answers.get(i).and_then(|a| a["status"].as_u64()) != Some(200) {
                left.push(format!("{}: {n}", broker.name));
            }
        }
    }
    left
}
