//! The local test bed (deploy/dev/testbed) as the integration tests and the benchmark both see
//! it: `deploy/dev/testbed env`'s variables, its brokers and users, clients for the API server,
//! namespaces, databases, the CRDs and the operator's RBAC. Each test crate includes this file by
//! `#[path]` as `mod bed` (like `testbed_env.rs`). Every function returns its error: the
//! integration tests' `TestBed` (tests/integration/support.rs) panics on it, the benchmark
//! reports it.
#![allow(dead_code)] // each crate uses its own part

use crate::testbed_env;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope;
use kube::{Api, Client, Config, ResourceExt};

/// The release and namespace the operator's RBAC is rendered for: the ServiceAccount
/// `artemis-studio:artemis-studio-operator`, which is who TESTBED_OPERATOR_KUBECONFIG's token
/// authenticates as.
pub const OPERATOR_RELEASE: &str = "artemis-studio-operator";
pub const OPERATOR_NAMESPACE: &str = "artemis-studio";
/// The chart, relative to the repository.
pub const CHART: &str = "charts/artemis-studio-operator";
/// The MutatingAdmissionPolicy API the bed's API server serves (1.34, its feature gate on).
pub const FINALIZER_POLICY_API: &str = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy";

/// One broker of the test bed.
#[derive(Debug, Clone)]
pub struct Broker {
    pub name: String,
    pub cluster: String,
    pub role: String,
    pub jolokia: String,
    pub amqp: String,
    pub strict_origin: bool,
}

/// The running test bed's settings.
pub struct Bed {
    vars: HashMap<String, String>,
}

impl Bed {
    /// The running test bed, or an error naming the command that brings it up.
    pub fn get() -> Result<Bed> {
        let vars = testbed_env::read().map_err(anyhow::Error::msg)?;
        Ok(Bed { vars })
    }

    pub fn var(&self, key: &str) -> Result<String> {
        self.vars
            .get(key)
            .cloned()
            .ok_or_else(|| anyhow!("the test bed env has no {key}"))
    }

    /// Every broker of the bed (TESTBED_BROKERS).
    pub fn brokers(&self) -> Result<Vec<Broker>> {
        self.var("TESTBED_BROKERS")?
            .split_whitespace()
            .map(|n| self.broker(n))
            .collect()
    }

    pub fn broker(&self, name: &str) -> Result<Broker> {
        let up = name.to_uppercase();
        Ok(Broker {
            name: name.to_string(),
            cluster: self.var(&format!("TESTBED_{up}_CLUSTER"))?,
            role: self.var(&format!("TESTBED_{up}_ROLE"))?,
            jolokia: self.var(&format!("TESTBED_{up}_JOLOKIA"))?,
            amqp: self.var(&format!("TESTBED_{up}_AMQP"))?,
            strict_origin: self.var(&format!("TESTBED_{up}_STRICT_ORIGIN"))? == "true",
        })
    }

    /// The brokers of one test bed cluster (`c`: c1, c2, c3); empty when there is no such
    /// cluster.
    pub fn cluster_brokers(&self, cluster: &str) -> Result<Vec<Broker>> {
        Ok(self
            .brokers()?
            .into_iter()
            .filter(|b| b.cluster == cluster)
            .collect())
    }

    pub fn broker_user(&self) -> Result<(String, String)> {
        Ok((
            self.var("TESTBED_BROKER_USER")?,
            self.var("TESTBED_BROKER_PASSWORD")?,
        ))
    }

    pub fn viewer_user(&self) -> Result<(String, String)> {
        Ok((
            self.var("TESTBED_VIEWER_USER")?,
            self.var("TESTBED_VIEWER_PASSWORD")?,
        ))
    }

    /// The shared Postgres server's admin URL.
    pub fn database_url(&self) -> Result<String> {
        self.var("TESTBED_DATABASE_URL")
    }

    /// The URL of database `db` on the shared Postgres server.
    pub fn database_url_of(&self, db: &str) -> Result<String> {
        let admin = self.database_url()?;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Ok(format!("{base}/{db}"))
    }

    /// A connection to the bed's Postgres as its administrator.
    async fn admin_connection(&self) -> Result<sqlx::PgConnection> {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&self.database_url()?)
            .await
            .context("connect to the test bed's Postgres")
    }

    /// Create an empty database `db`; returns its URL.
    pub async fn create_database(&self, db: &str) -> Result<String> {
        let mut conn = self.admin_connection().await?;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("create database {db}"))?;
        self.database_url_of(db)
    }

    /// Drop database `db` (its connections cut); nothing when it is not there.
    pub async fn drop_database(&self, db: &str) -> Result<()> {
        let mut conn = self.admin_connection().await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("drop database {db}"))?;
        Ok(())
    }

    /// The broker process of `name` (its pid file under the bed's state directory).
    pub fn broker_pid(&self, name: &str) -> Result<u32> {
        let path = PathBuf::from(self.var("TESTBED_STATE")?)
            .join("brokers")
            .join(name)
            .join("broker.pid");
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a pid", path.display()))
    }

    /// A client for the API server with the admin identity.
    pub async fn kube_admin(&self) -> Result<Client> {
        client_from(&self.var("TESTBED_KUBECONFIG")?).await
    }

    /// A client with the operator's own identity: only what the chart's RBAC grants it.
    pub async fn kube_operator(&self) -> Result<Client> {
        client_from(&self.var("TESTBED_OPERATOR_KUBECONFIG")?).await
    }

    /// A `helm` command: the bed's (TESTBED_HELM), or, on a bed started by an older script,
    /// the one this checkout's testbed script builds.
    pub fn helm(&self) -> Result<Command> {
        if let Some(helm) = self.vars.get("TESTBED_HELM") {
            return Ok(Command::new(helm));
        }
        static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dev/testbed");
        BUILT
            .get_or_init(|| {
                let status = Command::new(&script)
                    .args(["helm", "version", "--short"])
                    .status()
                    .map_err(|e| format!("run the testbed script: {e}"))?;
                if !status.success() {
                    return Err("deploy/dev/testbed helm could not build helm".to_string());
                }
                Ok(())
            })
            .clone()
            .map_err(anyhow::Error::msg)?;
        let mut cmd = Command::new(script);
        cmd.arg("helm");
        Ok(cmd)
    }

    /// `helm template RELEASE CHART --namespace NAMESPACE ARGS`: Err when helm could not run,
    /// else Ok of helm's answer: the rendered manifests, or helm's error output.
    pub fn helm_template(
        &self,
        chart: &Path,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> Result<std::result::Result<String, String>> {
        let out = self
            .helm()?
            .arg("template")
            .arg(release)
            .arg(chart)
            .args(["--namespace", namespace])
            .args(args)
            .output()
            .context("run helm")?;
        Ok(if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        })
    }

    /// The chart's RBAC (templates/rbac.yaml), rendered for release `artemis-studio-operator`
    /// in namespace `artemis-studio`.
    pub fn operator_rbac(&self, chart: &Path) -> Result<String> {
        self.helm_template(
            chart,
            OPERATOR_RELEASE,
            OPERATOR_NAMESPACE,
            // Every test operator runs under this one ServiceAccount with its own instance ID
            // (its own Lease): the Role may not be limited to one Lease name here.
            &[
                "--show-only",
                "templates/rbac.yaml",
                "--set",
                "leaderElection.restrictToLeaseName=false",
                // Sharding's grants too (list and delete on Leases): tests run shards as well.
                "--set",
                "replicaCount=2",
            ],
        )?
        .map_err(anyhow::Error::msg)
        .context("helm template of the chart's RBAC failed")
    }

    /// The chart's finalizer policy (`templates/finalizer-policy.yaml`) for release `release`,
    /// bound to `namespaces`: what `helm install` renders on this bed, whose API server serves
    /// MutatingAdmissionPolicy as v1beta1 (`helm template` cannot discover it, so it is told).
    pub fn finalizer_policy(&self, chart: &Path, release: &str, namespaces: &[&str]) -> Result<String> {
        let watch = format!("watchNamespaces={{{}}}", namespaces.join(","));
        self.helm_template(
            chart,
            release,
            OPERATOR_NAMESPACE,
            &[
                "--show-only",
                "templates/finalizer-policy.yaml",
                "--api-versions",
                FINALIZER_POLICY_API,
                "--set",
                &watch,
            ],
        )?
        .map_err(anyhow::Error::msg)
        .context("helm template of the chart's finalizer policy failed")
    }

    /// Install these CRDs (and wait until they are Established), the namespace
    /// `artemis-studio` (the leader-election Role lives in the release namespace) and the
    /// chart's RBAC ([`Bed::operator_rbac`]), as the admin `client`, applied as `apply` says.
    /// Returns the objects left as they were for a conflict (only without force).
    pub async fn install_crds_and_rbac(
        &self,
        client: &Client,
        crds: &[CustomResourceDefinition],
        chart: &Path,
        apply: &Apply<'_>,
    ) -> Result<Vec<String>> {
        let mut conflicts = install_crds(client, crds, apply).await?;
        ensure_namespace(client, OPERATOR_NAMESPACE).await?;
        let rbac = self.operator_rbac(chart)?;
        conflicts.extend(apply_manifests(client, &rbac, apply).await?.conflicts);
        Ok(conflicts)
    }
}

pub async fn config_from(path: &str) -> Result<Config> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read kubeconfig {path}"))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {path}"))
}

pub async fn client_from(path: &str) -> Result<Client> {
    Client::try_from(config_from(path).await?).context("kube client")
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_string());
    if !labels.is_empty() {
        ns.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    ns
}

/// Create a namespace with these labels; an error when it exists.
pub async fn create_namespace(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace(name, labels))
        .await
        .with_context(|| format!("create namespace {name}"))?;
    Ok(())
}

/// Create a namespace unless it exists.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace(name, &[]))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("create namespace {name}")),
    }
}

/// Delete a namespace (without waiting for it to go); nothing when it is not there.
pub async fn delete_namespace(client: &Client, name: &str) -> Result<()> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("delete namespace {name}")),
    }
}

/// Remove release `release`'s finalizer policy and its binding (cluster-scoped; the namespaces
/// they bound go on their own). Absent ones are no error.
pub async fn delete_finalizer_policy(client: &Client, release: &str) -> Result<()> {
    let name = format!("{release}-finalizers");
    for kind in ["MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"] {
        let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1beta1", kind);
        let (ar, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("discover {kind}"))?;
        match Api::<DynamicObject>::all_with(client.clone(), &ar)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("delete {kind} {name}")),
        }
    }
    Ok(())
}

/// Wait until a queue created in `ns` is stored with the operator's finalizer (the policy's
/// first effect comes a moment after it is applied): asked by dry-run creates, which pass
/// admission and store nothing.
pub async fn wait_finalizer_policy(client: &Client, ns: &str, limit: Duration) -> Result<()> {
    let gvk = GroupVersionKind::gvk("artemis-studio.io", "v1alpha1", "ArtemisQueue");
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
    let probe: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "artemis-studio.io/v1alpha1",
        "kind": "ArtemisQueue",
        "metadata": {"name": "finalizer-policy-probe"},
        "spec": {"clusterRef": {"name": "c"}},
    }))?;
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = std::time::Instant::now() + limit;
    loop {
        let made = api.create(&pp, &probe).await.context("dry-run create")?;
        if made.finalizers().iter().any(|f| f == "artemis-studio.io/queue") {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("the finalizer policy had no effect in {ns} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How objects are applied: server-side, as field manager `manager`. With `force`, fields other
/// managers own are taken over; without it, an object whose fields another manager owns with
/// other values is left as it is (a conflict, named in the answer) — it is there, which is what
/// the operator needs.
#[derive(Debug, Clone, Copy)]
pub struct Apply<'a> {
    pub manager: &'a str,
    pub force: bool,
}

impl Apply<'_> {
    fn params(&self) -> PatchParams {
        let p = PatchParams::apply(self.manager);
        if self.force { p.force() } else { p }
    }
}

/// What [`apply_manifests`] applied, and what it left for a conflict (`Kind name`).
pub struct Applied {
    pub objects: Vec<DynamicObject>,
    pub conflicts: Vec<String>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Server-side apply every document of a multi-document YAML stream (each object's kind found
/// by discovery).
pub async fn apply_manifests(client: &Client, yaml: &str, apply: &Apply<'_>) -> Result<Applied> {
    let mut applied = Applied {
        objects: vec![],
        conflicts: vec![],
    };
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(yaml).context("YAML documents")?;
    for value in docs {
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value).context("a Kubernetes object")?;
        let types = obj.types.clone().context("apiVersion and kind")?;
        let gvk = GroupVersionKind::try_from(&types).context("apiVersion")?;
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("discover {}/{}", types.api_version, types.kind))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &ar),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata
                    .namespace
                    .as_deref()
                    .context("a namespaced object names its namespace")?,
                &ar,
            ),
        };
        let name = obj.metadata.name.clone().context("name")?;
        match api.patch(&name, &apply.params(), &Patch::Apply(&obj)).await {
            Ok(out) => applied.objects.push(out),
            Err(e) if !apply.force && is_conflict(&e) => {
                applied.conflicts.push(format!("{} {name}", types.kind))
            }
            Err(e) => return Err(e).with_context(|| format!("server-side apply of {} {name}", types.kind)),
        }
    }
    Ok(applied)
}

/// Apply these CRDs and wait until each one is Established (served). Returns the CRDs left as
/// they were for a conflict (only without force).
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
    apply: &Apply<'_>,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut conflicts = vec![];
    for crd in crds {
        let name = crd.name_any();
        match api.patch(&name, &apply.params(), &Patch::Apply(crd)).await {
            Ok(_) => {}
            Err(e) if !apply.force && is_conflict(&e) => {
                conflicts.push(format!("CustomResourceDefinition {name}"))
            }
            Err(e) => return Err(e).with_context(|| format!("apply CRD {name}")),
        }
    }
    for crd in crds {
        wait_established(&api, &crd.name_any(), Duration::from_secs(60)).await?;
    }
    Ok(conflicts)
}

/// Poll until CRD `name` is Established, or fail after `timeout`.
async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let established = api.get(name).await.ok().and_then(|c| c.status).is_some_and(|s| {
            s.conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for: CRD {name} Established");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The CRDs of a multi-document YAML stream (e.g. `artemis-studio-operator crd`'s output).
pub fn crds_from_yaml(yaml: &str) -> Result<Vec<CustomResourceDefinition>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(yaml).context("YAML documents")?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| serde_json::from_value(d).context("a CustomResourceDefinition"))
        .collect()
}
