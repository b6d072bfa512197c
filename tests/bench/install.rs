//! The run's context, and one installation under test: a fresh namespace and database, the
//! operator process watching that namespace, an ArtemisCluster for the 3-node cluster "c".
//! Everything it creates is registered, so a failed or interrupted run still cleans up.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use kube::Client;

use crate::bed::{self, Apply, Bed};
use crate::config::Config;
use crate::jolokia::Jolokia;
use crate::metrics::{self, ApiServerCounts, OperatorCounts};
use crate::objects::{HarnessRequests, Objects};
use crate::operator::{Launch, Operator};
use crate::report::RunInfo;

/// The label on every namespace the benchmark creates.
const NAMESPACE_LABELS: &[(&str, &str)] = &[("artemis-studio.io/bench", "true")];

/// How long a scenario waits for a broker that another user of the bed is restarting.
pub const BROKERS_DOWN_LIMIT: Duration = Duration::from_secs(300);

pub struct Ctx {
    pub cfg: Config,
    pub bed: Bed,
    pub admin: Client,
    /// Bare Jolokia to the three nodes of cluster "c".
    pub jolokia: Jolokia,
    /// Namespaces (and their databases, if any) not cleaned up yet.
    leftovers: Mutex<Vec<(String, Option<String>)>>,
    /// Brokers besides cluster c's that a scenario uses: the run's cleanup removes the run's
    /// objects from them too.
    other_brokers: Mutex<Vec<Jolokia>>,
    date: String,
}

/// The operator's and the API server's counters at one moment, and the harness's own requests.
#[derive(Clone)]
pub struct Snapshot {
    pub operator: OperatorCounts,
    pub apiserver: ApiServerCounts,
    pub harness: (f64, f64),
}

/// What happened between two snapshots.
pub struct Delta {
    pub operator: OperatorCounts,
    pub apiserver: ApiServerCounts,
    /// The harness's own reads and writes (subtract them from the API server's).
    pub harness: (f64, f64),
}

impl Delta {
    /// API server reads (GET, LIST) by every client but the harness.
    pub fn apiserver_reads(&self) -> f64 {
        (self.apiserver.sum(&metrics::API_READS) - self.harness.0).max(0.0)
    }
    pub fn apiserver_writes(&self) -> f64 {
        (self.apiserver.sum(&metrics::API_WRITES) - self.harness.1).max(0.0)
    }
    pub fn apiserver_lists(&self) -> f64 {
        self.apiserver.sum(&["LIST"])
    }
    pub fn operator_reads(&self) -> f64 {
        self.operator.api(&["get", "list"])
    }
    pub fn operator_writes(&self) -> f64 {
        self.operator.api(&["create", "update", "patch", "delete"])
    }
}

impl Snapshot {
    pub fn since(&self, earlier: &Snapshot) -> Delta {
        Delta {
            operator: self.operator.since(&earlier.operator),
            apiserver: self.apiserver.since(&earlier.apiserver),
            harness: (
                self.harness.0 - earlier.harness.0,
                self.harness.1 - earlier.harness.1,
            ),
        }
    }
}

impl Ctx {
    pub async fn new(cfg: Config) -> Result<Ctx> {
        let bed = Bed::get()?;
        let admin = bed.kube_admin().await?;
        install_crds_and_rbac(&bed, &admin, &cfg.operator_bin, &cfg.repo).await?;
        let brokers = bed.cluster_brokers("c")?;
        if brokers.is_empty() {
            bail!("the test bed has no cluster c");
        }
        let mut jolokia = Jolokia::connect(&brokers, bed.broker_user()?)
            .await
            .context("reach the brokers of cluster c")?;
        jolokia.durable = cfg.durable;
        Ok(Ctx {
            cfg,
            bed,
            admin,
            jolokia,
            leftovers: Mutex::new(vec![]),
            other_brokers: Mutex::new(vec![]),
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        })
    }

    /// The prefix of every broker object and Kubernetes name of this run.
    pub fn prefix(&self, tag: &str) -> String {
        format!("bench.{}.{tag}.", self.cfg.run_id)
    }

    /// The database of an installation `tag` of this run.
    pub fn database_name(&self, tag: &str) -> String {
        format!("bench_{}_{}", self.cfg.run_id, tag.replace('-', "_"))
    }

    pub fn queue_names(&self, tag: &str, n: usize) -> Vec<String> {
        let p = self.prefix(tag);
        (0..n).map(|i| format!("{p}{i:05}")).collect()
    }

    /// The operator's instance ID in this run (its Leases' names hold it).
    pub fn instance_id(&self) -> String {
        format!("bench{}", self.cfg.run_id)
    }

    pub fn info(&self) -> RunInfo {
        RunInfo {
            run_id: self.cfg.run_id.clone(),
            date: self.date.clone(),
            commit: git_commit(&self.cfg.repo),
            machine: machine(),
            settings: self.cfg.json(),
        }
    }

    /// Remove whatever this run left: namespaces (finalizers stripped), databases, broker
    /// objects named with the run's prefixes, Leases of its operators.
    pub async fn cleanup(&self) {
        let left: Vec<(String, Option<String>)> =
            self.leftovers.lock().map(|l| l.clone()).unwrap_or_default();
        for (ns, db) in left {
            self.remove_namespace(&ns, db.as_deref()).await;
        }
        self.clean_brokers().await;
        self.delete_leases().await;
    }

    /// Register a namespace (and a database) the run's cleanup removes unless
    /// [`Ctx::remove_namespace`] did.
    pub fn register_leftover(&self, ns: &str, db: Option<&str>) -> Result<()> {
        self.leftovers
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push((ns.to_string(), db.map(str::to_string)));
        Ok(())
    }

    /// A namespace `bench-<run>-<tag>` no operator watches (the floor's objects go there),
    /// registered so the run's cleanup removes it if [`Ctx::drop_scratch_namespace`] does not.
    pub async fn scratch_namespace(&self, tag: &str) -> Result<String> {
        let ns = format!("bench-{}-{tag}", self.cfg.run_id);
        self.create_namespace(&ns, None).await?;
        Ok(ns)
    }

    /// Create a namespace of the run (labelled), registered with its database, if any.
    pub async fn create_namespace(&self, ns: &str, db: Option<&str>) -> Result<()> {
        self.register_leftover(ns, db)?;
        bed::create_namespace(&self.admin, ns, NAMESPACE_LABELS).await
    }

    /// Delete a scratch namespace (finalizers of what is left in it stripped first); errors are
    /// printed, and the run's cleanup tries again.
    pub async fn drop_scratch_namespace(&self, ns: &str) {
        self.remove_namespace(ns, None).await;
    }

    /// Strip the finalizers of what is left in a namespace, delete it and drop its database (if
    /// any); forgotten by the run's cleanup once all of it went. Errors are printed, and the
    /// run's cleanup tries again.
    pub async fn remove_namespace(&self, ns: &str, db: Option<&str>) {
        let mut clean = true;
        if let Err(e) = bed::delete_finalizer_policy(&self.admin, ns).await {
            eprintln!("[bench] {ns}: {e:#}");
            clean = false;
        }
        if let Err(e) = self.objects(ns).strip_finalizers().await {
            eprintln!("[bench] {ns}: {e:#}");
            clean = false;
        }
        if let Err(e) = bed::delete_namespace(&self.admin, ns).await {
            eprintln!("[bench] {e:#}");
            clean = false;
        }
        if let Some(db) = db
            && let Err(e) = self.bed.drop_database(db).await
        {
            eprintln!("[bench] {e:#}");
            clean = false;
        }
        if clean && let Ok(mut l) = self.leftovers.lock() {
            l.retain(|(left, _)| left != ns);
        }
    }

    /// The chart's finalizer policy as `helm install` puts it on this bed, bound to the
    /// installation's namespace `ns` (its release named after it; removed with the namespace):
    /// a queue is stored with its finalizer from its create on, as where the cluster serves
    /// MutatingAdmissionPolicy (issue 45).
    pub async fn install_finalizer_policy(&self, ns: &str) -> Result<()> {
        let yaml = self
            .bed
            .finalizer_policy(&self.cfg.repo.join(bed::CHART), ns, &[ns])?;
        let apply = Apply {
            manager: "artemis-studio-bench",
            force: true,
        };
        bed::apply_manifests(&self.admin, &yaml, &apply).await?;
        bed::wait_finalizer_policy(&self.admin, ns, Duration::from_secs(30)).await
    }

    /// Brokers besides cluster c's whose objects of this run [`Ctx::clean_brokers`] removes.
    pub fn register_brokers(&self, brokers: Jolokia) -> Result<()> {
        self.other_brokers
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push(brokers);
        Ok(())
    }

    /// Delete the Leases of this run's operators (sharded replicas leave theirs and their
    /// clusters' when killed); errors are printed.
    pub async fn delete_leases(&self) {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(self.admin.clone(), bed::OPERATOR_NAMESPACE);
        let instance = self.instance_id();
        let names = match leases.list(&Default::default()).await {
            Ok(list) => list.items.into_iter().filter_map(|l| l.metadata.name),
            Err(e) => {
                eprintln!("[bench] list the Leases: {e:#}");
                return;
            }
        };
        for name in names.filter(|n| n.contains(&instance)) {
            if let Err(e) = leases.delete(&name, &Default::default()).await {
                eprintln!("[bench] delete the Lease {name}: {e:#}");
            }
        }
    }

    pub async fn clean_brokers(&self) {
        let prefixes = [
            format!("bench.{}.", self.cfg.run_id),
            format!("artemis-studio.capture.{}.", self.instance_id()),
        ];
        let others: Vec<Jolokia> = self.other_brokers.lock().map(|o| o.clone()).unwrap_or_default();
        for brokers in std::iter::once(&self.jolokia).chain(&others) {
            match brokers.remove_by_prefix(&prefixes).await {
                Ok(0) => {}
                Ok(n) => println!(
                    "bench: removed {n} broker objects of this run (addresses a delete keeps, leftovers)"
                ),
                Err(e) => eprintln!("[bench] broker cleanup: {e:#}"),
            }
        }
    }

    pub fn objects(&self, ns: &str) -> Objects {
        Objects {
            client: self.admin.clone(),
            ns: ns.to_string(),
            harness: Arc::new(HarnessRequests::default()),
            concurrency: self.cfg.apply_in_flight,
            durable: self.cfg.durable,
            cluster: "c".into(),
        }
    }
}

/// The CRDs (from the operator binary under test, `crd`) and the chart's RBAC (for release
/// `artemis-studio-operator` in `artemis-studio`, the identity of TESTBED_OPERATOR_KUBECONFIG),
/// applied server-side as the admin, field manager `artemis-studio-bench`, without force:
/// objects another field manager (the integration tests) owns with other values are left as
/// they are, with a warning — they are there, which is what the operator needs.
async fn install_crds_and_rbac(bed: &Bed, admin: &Client, operator_bin: &Path, repo: &Path) -> Result<()> {
    let out = Command::new(operator_bin)
        .arg("crd")
        .output()
        .with_context(|| format!("run {} crd", operator_bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} crd: {}",
            operator_bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let crds = bed::crds_from_yaml(&String::from_utf8_lossy(&out.stdout)).context("operator crd")?;
    let apply = Apply {
        manager: "artemis-studio-bench",
        force: false,
    };
    let conflicts = bed
        .install_crds_and_rbac(admin, &crds, &repo.join(bed::CHART), &apply)
        .await?;
    for what in conflicts {
        eprintln!("[bench] {what}: present and owned by another field manager, left as it is");
    }
    Ok(())
}

/// One installation under test.
pub struct Install {
    pub objects: Objects,
    pub operator: Operator,
    ns: String,
    db: String,
    tag: String,
}

impl Install {
    /// Namespace `bench-<run>-<tag>`, database, operator, ArtemisCluster `c` with 3 live nodes.
    pub async fn up(ctx: &Ctx, tag: &str, extra_env: &[(&str, &str)]) -> Result<Install> {
        ctx.jolokia.wait_up(BROKERS_DOWN_LIMIT).await?;
        let ns = format!("bench-{}-{tag}", ctx.cfg.run_id);
        let db = ctx.database_name(tag);
        ctx.create_namespace(&ns, Some(&db)).await?;
        let url = ctx.bed.create_database(&db).await?;
        ctx.install_finalizer_policy(&ns).await?;
        std::fs::create_dir_all(&ctx.cfg.out_dir)?;
        let operator = Operator::start(Launch {
            rust_log: &ctx.cfg.operator_log,
            binary: &ctx.cfg.operator_bin,
            kubeconfig: &ctx.bed.var("TESTBED_OPERATOR_KUBECONFIG")?,
            database_url: &url,
            namespace: &ns,
            instance_id: &ctx.instance_id(),
            log: ctx.cfg.out_dir.join(format!("operator-{tag}.log")),
            extra_env,
        })
        .await?;
        let objects = ctx.objects(&ns);
        let urls: Vec<String> = ctx.jolokia.nodes.iter().map(|n| n.url.clone()).collect();
        objects
            .create_cluster(&urls, &ctx.bed.broker_user()?, urls.len() as u32)
            .await?;
        Ok(Install {
            objects,
            operator,
            ns,
            db,
            tag: tag.to_string(),
        })
    }

    /// Stop the operator and start it again on the same namespace, database and instance ID
    /// (a restart of the same installation, e.g. a rolling upgrade). The old process is gone
    /// before the new one starts: two never run at once. On an error the namespace and the
    /// database are left to the run's cleanup (`Ctx::cleanup`).
    pub async fn restarted(self, ctx: &Ctx) -> Result<Install> {
        self.operator.stop().await?;
        let url = Install::url_of(ctx, &self.db)?;
        let operator = Operator::start(Launch {
            rust_log: &ctx.cfg.operator_log,
            binary: &ctx.cfg.operator_bin,
            kubeconfig: &ctx.bed.var("TESTBED_OPERATOR_KUBECONFIG")?,
            database_url: &url,
            namespace: &self.ns,
            instance_id: &ctx.instance_id(),
            log: ctx
                .cfg
                .out_dir
                .join(format!("operator-{}-restarted.log", self.tag)),
            extra_env: &[],
        })
        .await?;
        Ok(Install { operator, ..self })
    }

    /// The namespace the operator watches and the objects live in.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Audit rows in this installation's database.
    pub async fn audit_rows(&self, ctx: &Ctx) -> Result<i64> {
        let pool = sqlx::PgPool::connect(&self.database_url(ctx)?).await?;
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM audit_event")
            .fetch_one(&pool)
            .await?;
        pool.close().await;
        Ok(n)
    }

    /// The URL of this installation's database.
    pub fn database_url(&self, ctx: &Ctx) -> Result<String> {
        Install::url_of(ctx, &self.db)
    }

    fn url_of(ctx: &Ctx, db: &str) -> Result<String> {
        ctx.bed.database_url_of(db)
    }

    pub async fn snapshot(&self, ctx: &Ctx) -> Result<Snapshot> {
        Ok(Snapshot {
            operator: self.operator.counts().await?,
            apiserver: metrics::apiserver(&ctx.admin).await?,
            harness: self.objects.harness.get(),
        })
    }

    /// Stop the operator (after `delete_all` let it remove what it made), delete the namespace
    /// and the database, remove the run's broker objects. Errors are printed, not returned:
    /// the registry's cleanup at the end of the run tries again.
    pub async fn down(self, ctx: &Ctx) {
        if let Err(e) = self.operator.stop().await {
            eprintln!("[bench] stop the operator: {e:#}");
        }
        ctx.remove_namespace(&self.ns, Some(&self.db)).await;
        ctx.clean_brokers().await;
    }
}

/// Sleep, printing nothing: a named pause so call sites read as what they wait for.
pub async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

fn git_commit(repo: &std::path::Path) -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = run(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = run(&["status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"])
        .is_some_and(|s| !s.is_empty());
    if dirty { format!("{commit}+dirty") } else { commit }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, m)| m.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_default();
    format!("{cpus} CPUs ({model}), {mem_gib:.0} GiB, load {load} at start")
}
