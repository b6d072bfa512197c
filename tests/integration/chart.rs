//! The Helm chart against the bed's real API server (RBAC on): it lints, it renders and applies
//! server-side, its values schema refuses typos, two releases never collide, and the roles it
//! gives people keep connection:close (ADR-0057 D7) and capture:write (ADR-0062 D1) apart from
//! everything else, Kubernetes' aggregated `view`/`edit`/`admin` included. There is no kubelet:
//! the Deployment is applied, never run.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

use crate::support::{TestBed, apply_manifests, short_id, wait_until};

const MANAGER: &str = "artemis-studio-chart-tests";

fn chart_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/artemis-studio-operator")
}

/// The rendered documents of one kind: (name, namespace, the object as JSON).
fn docs_of(yaml: &str, kind: &str) -> Vec<serde_json::Value> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(yaml).expect("YAML documents");
    docs.into_iter().filter(|v| v["kind"] == kind).collect()
}

/// The pod spec of the rendered Deployment.
fn pod_spec_of(yaml: &str) -> serde_json::Value {
    docs_of(yaml, "Deployment")[0]["spec"]["template"]["spec"].clone()
}

/// The value of the operator container's environment variable `name`, when it has one.
fn env_value(pod: &serde_json::Value, name: &str) -> Option<String> {
    pod["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(String::from))
}

/// Remove what a release created outside its namespace (its namespace goes with the test).
async fn delete_cluster_scoped(client: &Client, release: &str) {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let _ = roles.delete_collection(&DeleteParams::default(), &lp).await;
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    let _ = bindings.delete_collection(&DeleteParams::default(), &lp).await;
}

async fn delete_namespace(client: &Client, ns: &str) {
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn helm_lint_passes() {
    let bed = TestBed::get();
    let out = bed
        .helm()
        .args(["lint", "--strict"])
        .arg(chart_dir())
        .output()
        .expect("run helm lint");
    assert!(
        out.status.success(),
        "helm lint --strict failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_values_schema_refuses_typos_and_wrong_types() {
    let bed = TestBed::get();
    bed.helm_template("schema", "default", &[])
        .expect("the default values render");
    let refused = |args: &[&str], what: &str| {
        let err = bed
            .helm_template("schema", "default", args)
            .err()
            .unwrap_or_else(|| panic!("{what} ({args:?}) rendered without a word"));
        assert!(
            err.contains("schema"),
            "{what}: helm refused it, but not by the schema: {err}"
        );
        err
    };
    let err = refused(&["--set", "replicaCount=two"], "replicaCount: two");
    assert!(err.contains("replicaCount"), "{err}");
    refused(&["--set-string", "replicaCount=2"], "replicaCount: \"2\"");
    let err = refused(&["--set", "replicas=2"], "an unknown top-level key");
    assert!(err.contains("replicas"), "{err}");
    let err = refused(&["--set", "image.tags=v1"], "an unknown nested key");
    assert!(err.contains("tags"), "{err}");
    refused(
        &["--set", "trialPostgres.enabled=yes please"],
        "a string for a boolean",
    );
    refused(
        &["--set", "watchNamespaces[0]=Not_A_Namespace"],
        "an invalid namespace name",
    );
    refused(&["--set", "metrics.port=0"], "port 0");
    refused(
        &["--set", "metrics.listenAddress=localhost"],
        "a host name for the listen address",
    );
    refused(
        &["--set", "metrics.probeScheme=https"],
        "a lower-case probe scheme",
    );
}

/// Default values and every optional part (two replicas, some watched namespaces, the trial
/// Postgres) render and apply server-side; the objects are what the values say.
#[tokio::test]
async fn the_rendered_chart_applies_server_side() {
    let bed = TestBed::get();
    let client = bed.kube_admin().await;
    let ns = bed.fresh_namespace("chart").await;
    let watched = bed.fresh_namespace("chart-watched").await;
    let release = format!("chart-{}", short_id());

    // Defaults: one replica, Recreate, no PodDisruptionBudget, a ClusterRoleBinding.
    let yaml = bed
        .helm_template(&release, &ns, &[])
        .expect("render the defaults");
    apply_manifests(&client, &yaml, MANAGER).await;
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    let d = deployments.get(&release).await.expect("the Deployment exists");
    let spec = &d.data["spec"];
    assert_eq!(spec["strategy"]["type"], "Recreate");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let env: BTreeSet<String> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    for v in ["DATABASE_URL", "POD_NAME", "POD_NAMESPACE", "INSTANCE_ID"] {
        assert!(env.contains(v), "{v} is not set: {env:?}");
    }
    // Issue 44: by default the listener is on every address of the pod, the probes speak plain
    // HTTP to it, and the operator is the pod's only container.
    let rendered = pod_spec_of(&yaml);
    assert_eq!(env_value(&rendered, "LISTEN").as_deref(), Some("0.0.0.0:8080"));
    assert!(rendered["containers"][0]["readinessProbe"]["httpGet"]["scheme"].is_null());
    assert_eq!(rendered["containers"].as_array().map(Vec::len), Some(1));
    assert!(docs_of(&yaml, "PodDisruptionBudget").is_empty());
    assert_eq!(docs_of(&yaml, "ClusterRoleBinding").len(), 1);
    assert_eq!(docs_of(&yaml, "Service").len(), 1, "the metrics Service");
    assert!(docs_of(&yaml, "ServiceMonitor").is_empty(), "off by default");
    assert!(docs_of(&yaml, "NetworkPolicy").is_empty(), "off by default");
    // Issue 44: the Lease Role names the one Lease (create cannot be limited by name).
    let lease_rules: Vec<serde_json::Value> = docs_of(&yaml, "Role")
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["resources"][0] == "leases")
        .collect();
    for rule in &lease_rules {
        let verbs = rule["verbs"].to_string();
        if verbs.contains("get") || verbs.contains("update") {
            assert_eq!(
                rule["resourceNames"],
                json!(["artemis-studio-operator-studio"]),
                "{rule}"
            );
        } else {
            assert_eq!(rule["verbs"], json!(["create"]), "{rule}");
        }
    }
    assert_eq!(lease_rules.len(), 2, "{lease_rules:?}");
    assert_eq!(
        env_value(&rendered, "SHARDING").as_deref(),
        Some("false"),
        "one replica: no shards"
    );

    // Two replicas (leader election): RollingUpdate and a PodDisruptionBudget; some watched
    // namespaces: the operator's ClusterRole bound there only; the trial Postgres.
    let watch = format!("watchNamespaces[0]={watched}");
    let yaml = bed
        .helm_template(
            &release,
            &ns,
            &[
                "--set",
                "replicaCount=2",
                "--set",
                &watch,
                "--set",
                "trialPostgres.enabled=true",
            ],
        )
        .expect("render the optional parts");
    apply_manifests(&client, &yaml, MANAGER).await;
    let d = deployments.get(&release).await.expect("the Deployment exists");
    assert_eq!(d.data["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(d.data["spec"]["replicas"], 2);
    assert_eq!(docs_of(&yaml, "PodDisruptionBudget").len(), 1);
    // Issue 46: more than one replica means shards, which list the Leases of the namespace and
    // delete their own (and those of replicas long gone).
    let sharded = pod_spec_of(&yaml);
    assert_eq!(env_value(&sharded, "SHARDING").as_deref(), Some("true"));
    let shard_verbs: BTreeSet<String> = docs_of(&yaml, "Role")
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["resources"][0] == "leases")
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert_eq!(
        shard_verbs,
        ["create", "delete", "get", "list", "update"]
            .map(String::from)
            .into(),
        "the Lease verbs of shards"
    );
    assert!(docs_of(&yaml, "ClusterRoleBinding").is_empty());
    // Issue 44: Secrets only where watched (no ClusterRoleBinding above), and only the verbs the
    // code uses: get (values, before every command), list and watch (metadata).
    let secret_verbs: BTreeSet<String> = docs_of(&yaml, "ClusterRole")
        .iter()
        .filter(|r| r["metadata"]["name"] == format!("{release}-operator"))
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|x| x.iter().any(|x| x == "secrets"))
        })
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert_eq!(
        secret_verbs,
        ["get", "list", "watch"].map(String::from).into(),
        "the operator's Secret verbs"
    );
    let bindings = docs_of(&yaml, "RoleBinding");
    assert!(
        bindings
            .iter()
            .any(|b| b["metadata"]["namespace"] == watched.as_str()
                && b["roleRef"]["name"] == format!("{release}-operator")),
        "no RoleBinding of the operator's ClusterRole in {watched}"
    );
    let statefulsets = docs_of(&yaml, "StatefulSet");
    assert_eq!(statefulsets.len(), 1, "the trial Postgres");
    assert_eq!(statefulsets[0]["spec"]["replicas"], 1);
    let operator_env = &d.data["spec"]["template"]["spec"]["containers"][0]["env"];
    let db = operator_env
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "DATABASE_URL"))
        .expect("DATABASE_URL");
    assert_eq!(
        db["valueFrom"]["secretKeyRef"]["name"],
        format!("{release}-trial-postgres"),
        "the operator uses the trial database"
    );
    let env_names: Vec<&str> = operator_env
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(env_names.contains(&"WATCH_NAMESPACES"), "{env_names:?}");

    // Issue 44: a NetworkPolicy admitting only the listed peers to the metrics port, and the
    // image pulled by digest, when asked for.
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let yaml = bed
        .helm_template(
            &release,
            &ns,
            &[
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
                "--set",
                &format!("image.digest={digest}"),
            ],
        )
        .expect("render with a NetworkPolicy and a digest");
    apply_manifests(&client, &yaml, MANAGER).await;
    let np = docs_of(&yaml, "NetworkPolicy");
    assert_eq!(np.len(), 1);
    let ingress = &np[0]["spec"]["ingress"];
    assert_eq!(ingress.as_array().map(Vec::len), Some(1), "{ingress}");
    assert_eq!(ingress[0]["ports"], json!([{"port": 8080, "protocol": "TCP"}]));
    assert_eq!(
        ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["team"],
        "monitoring"
    );
    let image = &docs_of(&yaml, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(
        image.as_str(),
        Some(format!("ghcr.io/artemis-studio/artemis-studio-operator@{digest}").as_str())
    );

    // Issue 44: the listener on the pod's loopback behind a sidecar (the README's kube-rbac-proxy
    // setup): LISTEN from metrics.listenAddress, the sidecar from extraContainers after the
    // operator, the probes through the proxy's TLS; the API server takes the two containers.
    let yaml = bed
        .helm_template(
            &release,
            &ns,
            &[
                "--set",
                "metrics.listenAddress=127.0.0.1",
                "--set",
                "metrics.probeScheme=HTTPS",
                "--set",
                "extraContainers[0].name=kube-rbac-proxy",
                "--set",
                "extraContainers[0].image=quay.io/brancz/kube-rbac-proxy:v0.19.1",
            ],
        )
        .expect("render with the listener on 127.0.0.1 and a sidecar");
    apply_manifests(&client, &yaml, MANAGER).await;
    let rendered = pod_spec_of(&yaml);
    assert_eq!(env_value(&rendered, "LISTEN").as_deref(), Some("127.0.0.1:8080"));
    let containers: Vec<&str> = rendered["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(containers, ["operator", "kube-rbac-proxy"]);
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(
            rendered["containers"][0][probe]["httpGet"]["scheme"], "HTTPS",
            "{probe}"
        );
    }
    let d = deployments.get(&release).await.expect("the Deployment exists");
    assert_eq!(
        d.data["spec"]["template"]["spec"]["containers"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "the sidecar is applied with the operator"
    );
    // An IPv6 address gets its brackets (the binary parses LISTEN as a socket address).
    let yaml = bed
        .helm_template(&release, &ns, &["--set", "metrics.listenAddress=::1"])
        .expect("render with an IPv6 listener");
    assert_eq!(
        env_value(&pod_spec_of(&yaml), "LISTEN").as_deref(),
        Some("[::1]:8080")
    );

    // The ServiceMonitor renders when asked for (the bed has no Prometheus Operator CRD).
    let yaml = bed
        .helm_template(&release, &ns, &["--set", "metrics.serviceMonitor.enabled=true"])
        .expect("render with a ServiceMonitor");
    let sm = docs_of(&yaml, "ServiceMonitor");
    assert_eq!(sm.len(), 1);
    assert_eq!(sm[0]["spec"]["endpoints"][0]["path"], "/metrics");

    delete_cluster_scoped(&client, &release).await;
    delete_namespace(&client, &ns).await;
    delete_namespace(&client, &watched).await;
}

#[tokio::test]
async fn two_releases_name_their_cluster_wide_objects_apart() {
    let bed = TestBed::get();
    let names = |release: &str, ns: &str| -> BTreeSet<String> {
        let yaml = bed.helm_template(release, ns, &[]).expect("render");
        ["ClusterRole", "ClusterRoleBinding"]
            .iter()
            .flat_map(|k| docs_of(&yaml, k))
            .filter_map(|d| d["metadata"]["name"].as_str().map(String::from))
            .collect()
    };
    let a = names("studio-a", "team-a");
    let b = names("studio-b", "team-b");
    assert!(
        a.contains("studio-a-viewer") && a.contains("studio-a-operator"),
        "{a:?}"
    );
    assert!(
        a.iter().all(|n| n.starts_with("studio-a-")),
        "not named after the release: {a:?}"
    );
    assert!(
        a.is_disjoint(&b),
        "two releases collide on {:?}",
        a.intersection(&b).collect::<Vec<_>>()
    );
}

/// A client configuration that acts as `user` in `groups` (impersonated by the admin).
async fn impersonating_config(bed: &TestBed, user: &str, groups: &[&str]) -> Config {
    let kc = Kubeconfig::read_from(bed.var("TESTBED_KUBECONFIG")).expect("read kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    config
}

/// A client that acts as `user` in `groups` (impersonated by the admin).
async fn impersonating(bed: &TestBed, user: &str, groups: &[&str]) -> Client {
    Client::try_from(impersonating_config(bed, user, groups).await).expect("kube client")
}

/// A person: `user`, member of no group but `system:authenticated`.
async fn as_user(bed: &TestBed, user: &str) -> Client {
    impersonating(bed, user, &["system:authenticated"]).await
}

async fn bind(client: &Client, ns: &str, cluster_role: &str, user: &str) {
    let rb: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": format!("{user}-{cluster_role}"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .expect("rolebinding json");
    Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rb)
        .await
        .unwrap_or_else(|e| panic!("bind {user} to {cluster_role}: {e}"));
}

fn kind_api(client: &Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = kube::discovery::ApiResource {
        group: "artemis-studio.io".into(),
        version: "v1alpha1".into(),
        api_version: "artemis-studio.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// Try to create one object of `kind` as the given client: Ok, or the HTTP status code.
async fn try_create(
    client: &Client,
    ns: &str,
    kind: &str,
    plural: &str,
    spec: serde_json::Value,
) -> Result<(), u16> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": kind,
        "metadata": {"name": format!("x-{}", short_id())}, "spec": spec
    }))
    .expect("object json");
    match kind_api(client, ns, kind, plural)
        .create(&PostParams::default(), &obj)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.code),
        Err(e) => panic!("create {kind}: {e}"),
    }
}

/// Install the CRDs only where they are missing: the shared bed's CRDs may be newer (another
/// checkout's tests apply theirs); only their existence matters here.
async fn ensure_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in artemis_studio_operator::api::all_crds() {
        let name = crd.metadata.name.clone().expect("crd name");
        if api.get_opt(&name).await.expect("read CRD").is_none() {
            crate::smoke::install_crds(client).await;
            return;
        }
    }
}

/// connection:close, capture:write and message:replay are their own permissions: a user bound to
/// the topology editor, or to Kubernetes' aggregated `view`, `edit` or even `admin`, cannot create
/// a ConnectionClose, an ArtemisCaptureSubscription or a MessageReplay (though `edit` may create
/// queues); only their own roles grant them. The
/// aggregation itself is real (the bed's kube-controller-manager runs ClusterRole
/// aggregation): `edit` may create queues because the chart's topology editor aggregates into it.
#[tokio::test]
async fn only_their_own_roles_grant_connection_close_capture_and_replay() {
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    ensure_crds(&admin).await;
    let ns = bed.fresh_namespace("chart-rbac").await;
    let release = format!("rbac-{}", short_id());
    let rbac = bed
        .helm_template(&release, &ns, &["--show-only", "templates/rbac.yaml"])
        .expect("render RBAC");
    // The roles that must stay out of every aggregated role carry no aggregation label.
    for role in docs_of(&rbac, "ClusterRole") {
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        if ["-capture-writer", "-connection-closer", "-message-replayer"]
            .iter()
            .any(|own| name.ends_with(own))
        {
            let labels = role["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert!(
                !labels
                    .keys()
                    .any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to")),
                "{name} aggregates: {labels:?}"
            );
        }
    }
    apply_manifests(&admin, &rbac, MANAGER).await;

    // The aggregation controller folds the chart's roles into view/edit/admin.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let grants = |role: ClusterRole, resource: &str, verb: &str| {
        role.rules.unwrap_or_default().iter().any(|r| {
            r.resources
                .as_ref()
                .is_some_and(|rs| rs.iter().any(|x| x == resource))
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for (role, resource, verb) in [
        ("view", "artemisqueues", "list"),
        ("edit", "artemisqueues", "create"),
        ("admin", "artemisclusters", "create"),
    ] {
        wait_until(
            &format!(
                "ClusterRole {role} to aggregate {verb} {resource} (is kube-controller-manager running with clusterrole-aggregation? deploy/dev/testbed status)"
            ),
            Duration::from_secs(30),
            || {
                let roles = roles.clone();
                async move { roles.get(role).await.ok().filter(|r| grants(r.clone(), resource, verb)) }
            },
        )
        .await;
    }

    let id = short_id();
    let users = [
        ("topology-editor", format!("{release}-topology-editor")),
        ("viewer", format!("{release}-viewer")),
        ("view", "view".to_string()),
        ("edit", "edit".to_string()),
        ("admin", "admin".to_string()),
        ("closer", format!("{release}-connection-closer")),
        ("capturer", format!("{release}-capture-writer")),
        ("replayer", format!("{release}-message-replayer")),
    ];
    for (who, role) in &users {
        bind(&admin, &ns, role, &format!("{who}-{id}")).await;
    }
    let queue = || json!({"clusterRef": {"name": "prod"}});
    let close = || json!({"clusterRef": {"name": "prod"}, "target": {"node": "n1", "connectionId": "c1"}});
    let capture = || json!({"clusterRef": {"name": "prod"}, "queues": "orders*"});
    let replay = || json!({"clusterRef": {"name": "prod"}, "subscription": "orders", "row": 1});

    for (who, _) in &users {
        let user = format!("{who}-{id}");
        let client = as_user(&bed, &user).await;
        // A new RoleBinding takes a moment to reach the authorizer.
        let may_queue = matches!(*who, "topology-editor" | "edit" | "admin");
        let may_close = *who == "closer";
        let may_capture = *who == "capturer";
        let may_replay = *who == "replayer";
        let got = wait_until(
            &format!("{user}'s permissions to settle"),
            Duration::from_secs(20),
            || {
                let client = client.clone();
                let ns = ns.clone();
                async move {
                    let q = try_create(&client, &ns, "ArtemisQueue", "artemisqueues", queue()).await;
                    (q.is_ok() == may_queue).then_some(q)
                }
            },
        )
        .await;
        assert!(
            got.is_ok() == may_queue,
            "{user}: create ArtemisQueue gave {got:?}"
        );
        let c = try_create(&client, &ns, "ConnectionClose", "connectioncloses", close()).await;
        let s = try_create(
            &client,
            &ns,
            "ArtemisCaptureSubscription",
            "artemiscapturesubscriptions",
            capture(),
        )
        .await;
        if may_close {
            assert_eq!(c, Ok(()), "{user} may create a ConnectionClose");
        } else {
            assert_eq!(
                c,
                Err(403),
                "{user} must not create a ConnectionClose (connection:close, ADR-0057 D7)"
            );
        }
        if may_capture {
            assert_eq!(s, Ok(()), "{user} may create an ArtemisCaptureSubscription");
        } else {
            assert_eq!(
                s,
                Err(403),
                "{user} must not create an ArtemisCaptureSubscription (capture:write, ADR-0062 D1)"
            );
        }
        let r = try_create(&client, &ns, "MessageReplay", "messagereplays", replay()).await;
        if may_replay {
            assert_eq!(r, Ok(()), "{user} may create a MessageReplay");
        } else {
            assert_eq!(
                r,
                Err(403),
                "{user} must not create a MessageReplay (message:replay, issue 48): it may create queues"
            );
        }
        if *who == "viewer" || *who == "view" {
            kind_api(&client, &ns, "ConnectionClose", "connectioncloses")
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("{user} may read ConnectionCloses: {e}"));
        }
    }

    delete_cluster_scoped(&admin, &release).await;
    delete_namespace(&admin, &ns).await;
}

/// The operator under the chart's own ServiceAccount (a fresh release, its identity
/// impersonated as its token would authenticate) runs each kind's create → Ready → delete flow:
/// an ArtemisCluster to Ready, ArtemisQueues, an ArtemisDivert and an ArtemisCaptureSubscription
/// (finalizers released), a ConnectionClose to completion and its deletion after
/// `ttlSecondsAfterFinished`, and records its Events: the chart's ClusterRole is enough for each
/// flow. And no more than enough: every (resource, verb) the operator's ClusterRole grants was
/// used, as the operator's own `artemis_studio_api_requests_total` counted it, but for an
/// allow-list of rare paths, each with its reason.
#[tokio::test]
async fn the_operator_runs_under_the_charts_service_account() {
    use artemis_studio_operator::api::{ArtemisQueue, ConnectionClose};
    use artemis_studio_operator::controllers;
    let _b = crate::support::brokers_shared().await;
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    ensure_crds(&admin).await;
    let release_ns = bed.fresh_namespace("chart-op").await;
    let ns = bed.fresh_namespace("chart-op-work").await;
    let release = format!("op-{}", short_id());
    let rbac = bed
        .helm_template(&release, &release_ns, &["--show-only", "templates/rbac.yaml"])
        .expect("render RBAC");
    apply_manifests(&admin, &rbac, MANAGER).await;
    let service_account = format!("system:serviceaccount:{release_ns}:{release}");
    let own_group = format!("system:serviceaccounts:{release_ns}");
    let config = impersonating_config(
        &bed,
        &service_account,
        &["system:serviceaccounts", &own_group, "system:authenticated"],
    )
    .await;
    let id = short_id();
    // Before the operator's tasks (their guards are later locals), so they have stopped when it
    // sweeps.
    let _clean = bed.clean_up(&[&id]);
    // Every API request the operator makes is counted by verb and resource, as the binary
    // counts them (artemis_studio_api_requests_total).
    let metrics = std::sync::Arc::new(artemis_studio_operator::telemetry::Metrics::default());
    let client = artemis_studio_operator::telemetry::api_client_with(config, &metrics).expect("client");

    let db = bed.fresh_database().await;
    artemis_studio_operator::store::Store::migrate(&db)
        .await
        .expect("migrate");
    let store = artemis_studio_operator::store::Store::connect(&db)
        .await
        .expect("store");
    let (mut ctx, mut reflectors) = controllers::Context::new(
        client.clone(),
        store,
        format!("chart-{}", short_id()),
        controllers::Namespaces::from_list(vec![ns.clone()]),
        metrics.clone(),
    );
    ctx.capture_pass_interval = Duration::from_secs(2);
    let ctx = std::sync::Arc::new(ctx);
    let subscription_writers = reflectors.take_subscriptions();
    let operator = tokio::spawn(controllers::run_all(ctx.clone(), reflectors));
    // As the binary runs it: capture beside the controllers.
    let capture = tokio::spawn(artemis_studio_operator::capture::run(
        ctx.clone(),
        subscription_writers,
    ));
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _operator = Abort(operator);
    let _capture = Abort(capture);

    // ArtemisCluster: reads its credentials Secret, writes status.
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    crate::support::create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    let cluster = crate::support::wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let node = cluster
        .status
        .as_ref()
        .and_then(|s| s.nodes.first())
        .expect("a node")
        .node_id
        .clone();

    // ArtemisQueue: finalizer, status, an update's Event, then a delete that releases the finalizer.
    let queues: Api<ArtemisQueue> = Api::namespaced(admin.clone(), &ns);
    let name = format!("chart-q-{id}");
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name}, "spec": {"clusterRef": {"name": "c"}}
    }))
    .expect("queue json");
    queues
        .create(&PostParams::default(), &q)
        .await
        .expect("create ArtemisQueue");
    wait_until(
        &format!("ArtemisQueue {name} Ready"),
        Duration::from_secs(90),
        || {
            let queues = queues.clone();
            let name = name.clone();
            async move {
                let q = queues.get(&name).await.ok()?;
                q.status?
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                    .then_some(())
            }
        },
    )
    .await;
    // GitOps: the operator never writes a spec (only status and finalizers), so the objects a
    // repository applied stay at the generation it applied.
    let q = queues.get(&name).await.expect("get ArtemisQueue");
    assert_eq!(
        q.metadata.generation,
        Some(1),
        "the queue's spec was never written"
    );
    let cluster_now = Api::<artemis_studio_operator::api::ArtemisCluster>::namespaced(admin.clone(), &ns)
        .get("c")
        .await
        .expect("get ArtemisCluster");
    assert_eq!(
        cluster_now.metadata.generation,
        Some(1),
        "the cluster's spec was never written"
    );
    // A change to the queue that exists is told by an Event (a create only by its status).
    queues
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "chart = 1"}})),
        )
        .await
        .expect("change the queue's filter");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), &ns);
    wait_until("an Event of the queue's update", Duration::from_secs(60), || {
        let events = events.clone();
        let name = name.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
                .then_some(())
        }
    })
    .await;
    queues
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete ArtemisQueue");
    wait_until(
        &format!("ArtemisQueue {name} deleted"),
        Duration::from_secs(90),
        || {
            let queues = queues.clone();
            let name = name.clone();
            async move {
                queues
                    .get_opt(&name)
                    .await
                    .ok()
                    .and_then(|o| o.is_none().then_some(()))
            }
        },
    )
    .await;

    // ArtemisDivert and ArtemisCaptureSubscription: create → Ready → delete, on two queues.
    let (src, fwd) = (format!("chart.{id}.src"), format!("chart.{id}.fwd"));
    for (object, queue) in [("src", &src), ("fwd", &fwd)] {
        let obj = json!({"clusterRef": {"name": "c"}, "name": queue});
        create_dyn(&admin, &ns, "ArtemisQueue", "artemisqueues", object, obj).await;
        wait_ready_dyn(&admin, &ns, "ArtemisQueue", "artemisqueues", object).await;
    }
    let divert = json!({"clusterRef": {"name": "c"}, "address": src, "forwardingAddress": fwd});
    // The broker's divert is named after the object: with the id, so a sweep finds it.
    let copy = format!("copy-{id}");
    create_dyn(&admin, &ns, "ArtemisDivert", "artemisdiverts", &copy, divert).await;
    wait_ready_dyn(&admin, &ns, "ArtemisDivert", "artemisdiverts", &copy).await;
    let sub = json!({"clusterRef": {"name": "c"}, "queues": src});
    let subscriptions = ("ArtemisCaptureSubscription", "artemiscapturesubscriptions");
    create_dyn(&admin, &ns, subscriptions.0, subscriptions.1, "tap", sub).await;
    wait_ready_dyn(&admin, &ns, subscriptions.0, subscriptions.1, "tap").await;
    delete_and_wait_gone(&admin, &ns, subscriptions.0, subscriptions.1, "tap").await;
    delete_and_wait_gone(&admin, &ns, "ArtemisDivert", "artemisdiverts", &copy).await;
    for object in ["src", "fwd"] {
        delete_and_wait_gone(&admin, &ns, "ArtemisQueue", "artemisqueues", object).await;
    }

    // ConnectionClose: status read afresh and written, then deleted after its TTL.
    let closes: Api<ConnectionClose> = Api::namespaced(admin.clone(), &ns);
    let close: ConnectionClose = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ConnectionClose",
        "metadata": {"name": "gone"},
        "spec": {"clusterRef": {"name": "c"}, "confirm": "nobody", "ttlSecondsAfterFinished": 1,
                 "target": {"node": node, "connectionId": format!("no-such-connection-{}", short_id())}}
    }))
    .expect("close json");
    closes
        .create(&PostParams::default(), &close)
        .await
        .expect("create ConnectionClose");
    wait_until(
        "the finished ConnectionClose deleted by the operator after its TTL",
        Duration::from_secs(90),
        || {
            let closes = closes.clone();
            async move {
                closes
                    .get_opt("gone")
                    .await
                    .ok()
                    .and_then(|o| o.is_none().then_some(()))
            }
        },
    )
    .await;

    // MessageReplay: status read afresh and written (a row that is not stored: Failed by the
    // compare-and-swap), then deleted after its TTL.
    let replays = kind_api(&admin, &ns, "MessageReplay", "messagereplays");
    let replay: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "MessageReplay",
        "metadata": {"name": "unstored"},
        "spec": {"clusterRef": {"name": "c"}, "subscription": "none", "row": 1, "ttlSecondsAfterFinished": 1}
    }))
    .expect("replay json");
    replays
        .create(&PostParams::default(), &replay)
        .await
        .expect("create MessageReplay");
    wait_until(
        "the finished MessageReplay deleted by the operator after its TTL",
        Duration::from_secs(90),
        || {
            let replays = replays.clone();
            async move {
                replays
                    .get_opt("unstored")
                    .await
                    .ok()
                    .and_then(|o| o.is_none().then_some(()))
            }
        },
    )
    .await;

    // ArtemisCluster: deleting it is the API server's business (it has no finalizer).
    Api::<artemis_studio_operator::api::ArtemisCluster>::namespaced(admin.clone(), &ns)
        .delete("c", &DeleteParams::default())
        .await
        .expect("delete ArtemisCluster");

    // Every (resource, verb) the chart's operator ClusterRole grants was used by these flows,
    // as the operator's own request counter saw it, but for the allow-list.
    let role = docs_of(&rbac, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == format!("{release}-operator"))
        .expect("the operator's ClusterRole");
    let granted: BTreeSet<(String, String)> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|rule| {
            let resources: Vec<String> = rule["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect();
            let verbs: Vec<String> = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            resources
                .into_iter()
                .flat_map(move |r| verbs.clone().into_iter().map(move |v| (r.clone(), v)))
        })
        .collect();
    // Granted for rare paths these flows do not take, each with its reason.
    let rare: BTreeSet<(&str, &str)> = [
        // spec.discovery (broker pods by label); these flows name their brokers' URLs.
        ("pods", "list"),
        // An Event that repeats within the recorder's window is patched (its series count).
        ("events", "patch"),
        // A delete whose ArtemisCluster or Secret is gone, in a namespace being deleted (a queue,
        // a divert or a capture subscription; tests/integration/gitops.rs prunes one).
        ("namespaces", "get"),
        // Arming a close of a connection that is there (ADR-0057 D5): a connection that is gone
        // completes without arming (tests/integration/close_once.rs arms real ones).
        ("connectioncloses/status", "update"),
        // After arming, the close's audit id and its result are written (a status patch); a
        // close whose connection is gone completes by the compare-and-swap alone.
        ("connectioncloses/status", "patch"),
        // After arming a replay, its audit id and its result are written (a status patch);
        // a replay of a row that is not stored fails by the compare-and-swap alone
        // (tests/integration/replay.rs sends real ones).
        ("messagereplays/status", "patch"),
    ]
    .into_iter()
    .collect();
    let mut unused = vec![];
    for (resource, verb) in &granted {
        let used = metrics.kube_api.count(verb, resource);
        let allowed = rare.contains(&(resource.as_str(), verb.as_str()));
        println!(
            "{resource} {verb}: {used} request(s){}",
            if allowed { " (rare path)" } else { "" }
        );
        if used == 0 && !allowed {
            unused.push(format!("{resource} {verb}"));
        }
    }
    assert!(
        unused.is_empty(),
        "the chart grants the operator verbs its flows never used (remove them, or allow-list them with the path that needs them): {unused:?}"
    );
    for (resource, verb) in &rare {
        assert!(
            granted.contains(&(resource.to_string(), verb.to_string())),
            "{resource} {verb} is allow-listed but no longer granted: drop it from the list"
        );
    }

    delete_cluster_scoped(&admin, &release).await;
    delete_namespace(&admin, &ns).await;
    delete_namespace(&admin, &release_ns).await;
}

async fn create_dyn(
    client: &Client,
    ns: &str,
    kind: &str,
    plural: &str,
    name: &str,
    spec: serde_json::Value,
) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("object json");
    kind_api(client, ns, kind, plural)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
}

async fn wait_ready_dyn(client: &Client, ns: &str, kind: &str, plural: &str, name: &str) {
    let api = kind_api(client, ns, kind, plural);
    wait_until(
        &format!("{kind} {name} Ready"),
        Duration::from_secs(90),
        || async {
            let o = api.get(name).await.ok()?;
            o.data["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        },
    )
    .await;
}

async fn delete_and_wait_gone(client: &Client, ns: &str, kind: &str, plural: &str, name: &str) {
    let api = kind_api(client, ns, kind, plural);
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {kind} {name}: {e}"));
    wait_until(
        &format!("{kind} {name} deleted"),
        Duration::from_secs(90),
        || async {
            api.get_opt(name)
                .await
                .ok()
                .and_then(|o| o.is_none().then_some(()))
        },
    )
    .await;
}
