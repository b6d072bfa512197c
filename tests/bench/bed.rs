//! The local test bed as the benchmark sees it: `deploy/dev/testbed env`'s variables, clients
//! for the API server, fresh namespaces and databases, the CRDs and the operator's RBAC.
//!
//! Written for the benchmark (the integration tests' support module is a test module): the
//! same approach, small pieces copied, errors returned instead of panics.

#[path = "../common/testbed_env.rs"]
mod testbed_env;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use testbed_env::env_file;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// One broker of the test bed.
#[derive(Debug, Clone)]
pub struct Broker {
    pub name: String,
    pub jolokia: String,
}

pub struct Bed {
    vars: HashMap<String, String>,
}

impl Bed {
    /// The running test bed, or an error naming the command that brings it up.
    pub fn get() -> Result<Bed> {
        let path = env_file();
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "the test bed is not up ({}); run `deploy/dev/testbed up`",
                path.display()
            )
        })?;
        let vars = testbed_env::vars(&text);
        Ok(Bed { vars })
    }

    pub fn var(&self, key: &str) -> Result<String> {
        self.vars
            .get(key)
            .cloned()
            .ok_or_else(|| anyhow!("the test bed env has no {key}"))
    }

    /// The brokers of one test bed cluster (`c`: c1, c2, c3).
    pub fn cluster_brokers(&self, cluster: &str) -> Result<Vec<Broker>> {
        let mut out = vec![];
        for name in self.var("TESTBED_BROKERS")?.split_whitespace() {
            let up = name.to_uppercase();
            if self.var(&format!("TESTBED_{up}_CLUSTER"))? == cluster {
                out.push(Broker {
                    name: name.to_string(),
                    jolokia: self.var(&format!("TESTBED_{up}_JOLOKIA"))?,
                });
            }
        }
        if out.is_empty() {
            bail!("the test bed has no cluster {cluster}");
        }
        Ok(out)
    }

    pub fn broker_user(&self) -> Result<(String, String)> {
        Ok((
            self.var("TESTBED_BROKER_USER")?,
            self.var("TESTBED_BROKER_PASSWORD")?,
        ))
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

    pub async fn kube_admin(&self) -> Result<Client> {
        client_from(&self.var("TESTBED_KUBECONFIG")?).await
    }

    /// Create a namespace.
    pub async fn create_namespace(&self, client: &Client, name: &str) -> Result<()> {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"artemis-studio.io/bench": "true"}}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        Ok(())
    }

    /// Delete a namespace (without waiting for it to go).
    pub async fn delete_namespace(&self, client: &Client, name: &str) -> Result<()> {
        match Api::<Namespace>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("delete namespace {name}")),
        }
    }

    /// A fresh, empty database; returns its URL.
    pub async fn create_database(&self, db: &str) -> Result<String> {
        use sqlx::Connection;
        let admin = self.var("TESTBED_DATABASE_URL")?;
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .context("connect to the test bed's Postgres")?;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("create database {db}"))?;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Ok(format!("{base}/{db}"))
    }

    pub async fn drop_database(&self, db: &str) -> Result<()> {
        use sqlx::Connection;
        let admin = self.var("TESTBED_DATABASE_URL")?;
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .with_context(|| format!("drop database {db}"))?;
        Ok(())
    }

    /// The CRDs (from the operator binary under test) and the chart's RBAC (rendered by the
    /// bed's helm for release `artemis-studio-operator` in `artemis-studio`, the identity of
    /// TESTBED_OPERATOR_KUBECONFIG), applied server-side with kubectl as the admin. Without
    /// --force-conflicts: objects another field manager (the integration tests) owns with other
    /// values are left as they are, with a warning — they are there, which is what the
    /// operator needs.
    pub fn install_crds_and_rbac(
        &self,
        operator_bin: &std::path::Path,
        repo: &std::path::Path,
    ) -> Result<()> {
        let crds = run_output(Command::new(operator_bin).arg("crd")).context("operator crd")?;
        self.kubectl_apply(&crds, "CRDs")?;
        let kubeconfig = self.var("TESTBED_KUBECONFIG")?;
        run_output(
            Command::new(self.var("TESTBED_KUBECTL")?)
                .args([
                    "--kubeconfig",
                    &kubeconfig,
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                ])
                .args(["crd", "--all"]),
        )
        .context("wait for the CRDs to be Established")?;
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: artemis-studio}\n";
        self.kubectl_apply(ns, "namespace artemis-studio")?;
        let chart = repo.join("charts/artemis-studio-operator");
        let rbac = run_output(
            Command::new(self.var("TESTBED_HELM")?)
                .arg("template")
                .arg("artemis-studio-operator")
                .arg(&chart)
                .args([
                    "--namespace",
                    "artemis-studio",
                    "--show-only",
                    "templates/rbac.yaml",
                ]),
        )
        .context("helm template of the chart's RBAC")?;
        self.kubectl_apply(&rbac, "the chart's RBAC")
    }

    fn kubectl_apply(&self, manifests: &str, what: &str) -> Result<()> {
        use std::io::Write;
        let mut child = Command::new(self.var("TESTBED_KUBECTL")?)
            .args(["--kubeconfig", &self.var("TESTBED_KUBECONFIG")?])
            .args([
                "apply",
                "--server-side",
                "--field-manager",
                "artemis-studio-bench",
                "-f",
                "-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        child
            .stdin
            .take()
            .ok_or_else(|| anyhow!("kubectl stdin"))?
            .write_all(manifests.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("conflict") {
                eprintln!("[bench] {what}: present and owned by another field manager, left as they are");
            } else {
                bail!("kubectl apply of {what}: {err}");
            }
        }
        Ok(())
    }
}

fn run_output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub async fn client_from(path: &str) -> Result<Client> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read kubeconfig {path}"))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}
