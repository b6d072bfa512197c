//! Issue 22 item 4: trust is part of identity. Behind a TLS proxy the test starts (a private CA's
//! certificate in front of c1's Jolokia), a cluster that trusts that CA and two others on the same
//! URL and credentials — one trusting another CA, one whose CA Secret is not PEM — are polled by
//! one operator at once: the trusting cluster reaches c1 at every poll, the other never does, and
//! the one with a bad CA Secret says `InvalidTls`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::support::{TestBed, brokers_shared, wait_cluster_condition, wait_until};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA and a certificate for localhost it signed; another CA that signed nothing here.
fn certificates(dir: &Path) {
    for ca in ["ca-a", "ca-b"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-subj",
                &format!("/CN=artemis-studio {ca}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("extensions file");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca-a.pem",
            "-CAkey",
            "ca-a.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ],
    );
}

/// A TLS proxy on a free loopback port in front of `upstream` (host:port), serving the
/// certificate the CA "a" signed. Returns its port.
async fn tls_proxy(dir: &Path, upstream: String) -> u16 {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .expect("server certificate")
        .map(|c| c.expect("certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server key");
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate fails the handshake: nothing to do.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}

/// Fresh certificates in a temp dir (`certificates`) and a TLS proxy in front of c1's Jolokia
/// serving the one CA "a" signed: the dir, and c1's Jolokia URL through the proxy.
async fn c1_behind_a_tls_proxy(bed: &TestBed, tag: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("artemis-studio-{tag}-{}", crate::support::short_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    certificates(&dir);
    let upstream = reqwest::Url::parse(&bed.broker("c1").jolokia).expect("c1 url");
    let hostport = format!(
        "{}:{}",
        upstream.host_str().unwrap_or("localhost"),
        upstream.port().unwrap_or(8161)
    );
    let port = tls_proxy(&dir, hostport).await;
    (dir, format!("https://localhost:{port}{}", upstream.path()))
}

async fn secret(admin: &kube::Client, ns: &str, name: &str, data: serde_json::Value) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data
    }))
    .expect("secret json");
    Api::<Secret>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("create secret");
}

#[tokio::test]
async fn clusters_on_one_url_with_different_trust_never_share_a_connection() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let (dir, url) = c1_behind_a_tls_proxy(&bed, "tls").await;

    let ns = bed.fresh_namespace("tls").await;
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let (user, password) = bed.broker_user();
    secret(
        &admin,
        &ns,
        "creds",
        json!({"username": user, "password": password}),
    )
    .await;
    let pem = |f: &str| std::fs::read_to_string(dir.join(f)).expect("pem");
    secret(&admin, &ns, "ca-a", json!({"ca.crt": pem("ca-a.pem")})).await;
    secret(&admin, &ns, "ca-b", json!({"ca.crt": pem("ca-b.pem")})).await;
    secret(
        &admin,
        &ns,
        "ca-bad",
        json!({"ca.crt": "this is not a certificate"}),
    )
    .await;
    let clusters: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
    for (name, ca) in [("trusts", "ca-a"), ("other", "ca-b"), ("bad", "ca-bad")] {
        let c = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name},
            "spec": {"brokers": [{"url": url}], "credentials": {"secretName": "creds"},
                     "tls": {"caSecretName": ca}, "origin": "http://localhost",
                     "pollIntervalSeconds": 1, "requestTimeoutSeconds": 5}
        }))
        .expect("cluster json");
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create cluster");
    }

    // The CA Secret that is not PEM is named for what it is.
    let bad = wait_cluster_condition(&admin, &ns, "bad", "Ready", "False").await;
    let ready = bad
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("Ready");
    assert_eq!(ready.reason, "InvalidTls", "{ready:?}");
    assert!(
        ready.message.contains("spec.tls.caSecretName") && ready.message.contains("PEM"),
        "{ready:?}"
    );
    wait_cluster_condition(&admin, &ns, "trusts", "Ready", "True").await;

    // Fifteen polls of each, side by side on the same URL and credentials: every poll of the
    // trusting cluster reached c1, no poll of the other did.
    let (trusts, other) = (format!("{ns}/trusts"), format!("{ns}/other"));
    let seen: std::sync::Mutex<(BTreeSet<String>, BTreeSet<String>)> = Default::default();
    let (trusting_failures, other_successes) = (
        std::sync::Mutex::new(Vec::<String>::new()),
        std::sync::Mutex::new(0usize),
    );
    wait_until("15 polls of each cluster", Duration::from_secs(120), || async {
        let mut s = seen.lock().expect("seen");
        if let Some(t) = op.ctx.topologies.get(&trusts)
            && s.0.insert(t.polled_at_utc.to_rfc3339())
            && (!t.unreachable.is_empty() || t.live_nodes().count() == 0)
        {
            let why = t
                .unreachable
                .iter()
                .map(|(u, e)| format!("{u}: {e}"))
                .collect::<Vec<_>>();
            trusting_failures.lock().expect("failures").push(why.join("; "));
        }
        if let Some(t) = op.ctx.topologies.get(&other)
            && s.1.insert(t.polled_at_utc.to_rfc3339())
            && t.live_nodes().count() > 0
        {
            *other_successes.lock().expect("successes") += 1;
        }
        (s.0.len() >= 15 && s.1.len() >= 15).then_some(())
    })
    .await;
    // Commands' single calls are coalesced per endpoint: side by side, at the same instant, the
    // two clusters' calls (through the access each resolved) never travel together.
    let client_of = |k: &str| {
        let rt = op.ctx.clusters.get(k).expect("runtime");
        artemis_studio_operator::broker::JolokiaClient::new(
            rt.access.http.clone(),
            url.clone(),
            rt.access.origin.clone(),
            rt.access.credentials.clone(),
            Duration::from_secs(5),
        )
    };
    let (a, b) = (client_of(&trusts), client_of(&other));
    let search = || {
        artemis_studio_operator::broker::JolokiaRequest::search(
            artemis_studio_operator::broker::mbean::broker_search_pattern(),
        )
    };
    for round in 0..30 {
        let (ra, rb) = tokio::join!(a.call(search()), b.call(search()));
        assert!(
            ra.is_ok(),
            "round {round}: the trusting cluster's call failed: {ra:?}"
        );
        assert!(
            rb.is_err(),
            "round {round}: the other CA's call reached c1: {rb:?}"
        );
    }
    let failures = trusting_failures.lock().expect("failures").clone();
    assert!(
        failures.is_empty(),
        "the trusting cluster failed polls: {failures:?}"
    );
    assert_eq!(
        *other_successes.lock().expect("successes"),
        0,
        "the other CA's cluster reached c1"
    );
    let other_status = wait_cluster_condition(&admin, &ns, "other", "Ready", "False").await;
    let ready = other_status
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready");
    assert!(
        ready.message.to_lowercase().contains("certificate") || ready.message.contains("UnknownIssuer"),
        "{ready:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44: a private CA narrows trust, never widens it. CA "a" signed the proxy's
/// certificate and is installed as a public root in the trust store the operator binary uses
/// (`SSL_CERT_FILE`); a cluster naming CA "b" never reaches the broker (the public roots are not
/// trusted beside the CA it names), a cluster naming no CA reaches it through the public roots,
/// and each cluster's `status.trust` says which it uses.
#[tokio::test]
async fn a_named_ca_is_trusted_alone_even_where_another_ca_is_a_public_root() {
    let _b = brokers_shared().await;
    let bed = TestBed::get();
    let (dir, url) = c1_behind_a_tls_proxy(&bed, "trust").await;

    let ns = bed.fresh_namespace("trust").await;
    bed.install_operator_rbac().await;
    let db = bed.fresh_database().await;
    let port = 19_000 + (std::process::id() % 1000) as u16;
    let public_roots = dir.join("ca-a.pem");
    let public_roots = public_roots.to_string_lossy();
    let _operator = bed.spawn_operator(&ns, &db, port, &[("SSL_CERT_FILE", public_roots.as_ref())]);
    let admin = bed.kube_admin().await;
    let (user, password) = bed.broker_user();
    secret(
        &admin,
        &ns,
        "creds",
        json!({"username": user, "password": password}),
    )
    .await;
    let pem = std::fs::read_to_string(dir.join("ca-b.pem")).expect("pem");
    secret(&admin, &ns, "ca-b", json!({"ca.crt": pem})).await;
    let clusters: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
    for (name, tls) in [("named", Some("ca-b")), ("public", None)] {
        let mut spec = json!({"brokers": [{"url": url}], "credentials": {"secretName": "creds"},
            "origin": "http://localhost", "pollIntervalSeconds": 1, "requestTimeoutSeconds": 5});
        if let Some(ca) = tls {
            spec["tls"] = json!({"caSecretName": ca});
        }
        let c = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("cluster json");
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create cluster");
    }

    // Through the public roots: reached, and said so.
    let public = wait_cluster_condition(&admin, &ns, "public", "Ready", "True").await;
    let trust = public.status.and_then(|s| s.trust).unwrap_or_default();
    assert!(trust.contains("system trust store"), "{trust}");
    // The named CA alone: polled (an endpoint problem is evidence of the poll) and refused for
    // the certificate, though its issuer is a public root here.
    let status = wait_until(
        "the cluster naming CA b polled",
        Duration::from_secs(60),
        || async {
            let c = clusters.get("named").await.ok()?;
            c.status.filter(|s| !s.unreachable_endpoints.is_empty())
        },
    )
    .await;
    let trust = status.trust.clone().unwrap_or_default();
    assert!(trust.contains("only the CA in Secret ca-b"), "{trust}");
    let problems: Vec<String> = status
        .unreachable_endpoints
        .iter()
        .map(|p| p.message.clone())
        .collect();
    assert!(
        status.live_nodes == 0
            && problems
                .iter()
                .any(|m| m.to_lowercase().contains("certificate") || m.contains("UnknownIssuer")),
        "the cluster naming CA b reached the broker, or failed for another reason: {problems:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44: credentials live in the Secret only. A broker URL with user info is refused at
/// admission, naming the field and the fix; one without is admitted.
#[tokio::test]
async fn a_broker_url_with_credentials_is_refused_at_admission() {
    let bed = TestBed::get();
    let admin = bed.kube_admin().await;
    crate::smoke::install_crds(&admin).await;
    let ns = bed.fresh_namespace("url-creds").await;
    let clusters: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
    let cluster = |name: &str, url: &str| {
        serde_json::from_value::<artemis_studio_operator::api::ArtemisCluster>(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCluster",
            "metadata": {"name": name},
            "spec": {"brokers": [{"url": url}], "credentials": {"secretName": "creds"}}
        }))
        .expect("cluster json")
    };
    let with_user = cluster("with-user", "https://admin:Qxq7Zzy@broker-0:8161/console/jolokia");
    match clusters.create(&PostParams::default(), &with_user).await {
        Err(kube::Error::Api(e)) => {
            assert!(
                e.message.contains("spec.brokers[].url carries credentials")
                    && e.message.contains("spec.credentials"),
                "{}",
                e.message
            );
        }
        other => panic!("admitted: {other:?}"),
    }
    let plain = cluster("plain", "https://broker-0:8161/console/jolokia");
    clusters
        .create(&PostParams::default(), &plain)
        .await
        .expect("a URL without user info is admitted");
}

/// The bed's CA (`TESTBED_TLS_CA`, which signed the brokers' AMQPS acceptors) in Secret
/// `bed-ca`, named by `cluster`'s spec.tls. The namespace's ArtemisClusters.
async fn name_the_beds_ca(
    f: &crate::queue::Fixture,
    cluster: &str,
) -> Api<artemis_studio_operator::api::ArtemisCluster> {
    let ca = std::fs::read_to_string(f.bed.var("TESTBED_TLS_CA")).expect("the bed's CA");
    secret(&f.admin, &f.ns, "bed-ca", json!({"ca.crt": ca})).await;
    let clusters: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(f.admin.clone(), &f.ns);
    clusters
        .patch(
            cluster,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"tls": {"caSecretName": "bed-ca"}}})),
        )
        .await
        .expect("name the CA");
    clusters
}

/// The capture connections on a broker of this installation: (clientID, localAddress — the
/// acceptor they came in on).
async fn capture_connections(bed: &TestBed, broker: &str, instance: &str) -> Vec<(String, String)> {
    let prefix = artemis_studio_operator::capture::connection::container_prefix(instance);
    let options = json!({"field": "clientID", "operation": "CONTAINS", "value": prefix}).to_string();
    let r = crate::capture::exec(
        bed,
        &bed.broker(broker),
        "listConnections(java.lang.String,int,int)",
        json!([options, 1, 1000]),
    )
    .await;
    let listed: serde_json::Value =
        serde_json::from_str(r["value"].as_str().unwrap_or("null")).unwrap_or_default();
    listed["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let id = c["clientID"].as_str()?;
            let local = c["localAddress"].as_str()?;
            id.starts_with(&prefix)
                .then(|| (id.to_string(), local.to_string()))
        })
        .collect()
}

/// Issue 44: a cluster that names its CA in spec.tls drains over AMQPS, at the broker's TLS
/// acceptor (the broker's connection list says which acceptor each came in on), trusting that
/// CA; the messages are stored. With the CA Secret switched to another CA, a new tap's drain is
/// refused by the handshake, and the tap says why.
#[tokio::test]
async fn capture_drains_over_tls_with_the_clusters_ca_and_a_wrong_ca_stops_the_drain() {
    let _b = brokers_shared().await;
    let f = crate::queue::fixture("cap-tls", None).await;
    let id = crate::support::short_id();
    f.clean.also(&id);
    let clusters = name_the_beds_ca(&f, "c").await;
    wait_until(
        "the cluster re-polled with its CA",
        Duration::from_secs(60),
        || async {
            let c = clusters.get("c").await.ok()?;
            let s = c.status?;
            (s.observed_generation == c.metadata.generation && s.trust.is_some_and(|t| t.contains("bed-ca")))
                .then_some(())
        },
    )
    .await;

    let address = format!("cap.{id}.tls");
    crate::capture::broker_queue(&f.bed, &address).await;
    f.subscribe("tls", json!({"queues": address})).await;
    f.wait_subscription("tls", "3 taps drained", |s| {
        crate::capture::taps_in(s, artemis_studio_operator::api::capture::TapState::Healthy) == 3
    })
    .await;
    crate::capture::amqp_send(&f.bed, "c1", &address, 5, "over-tls")
        .await
        .expect("AMQP producer");
    f.wait_rows("tls", 5).await;
    let amqps_port = f
        .bed
        .var("TESTBED_C1_AMQPS")
        .rsplit(':')
        .next()
        .map(str::to_string)
        .expect("port");
    let connections = capture_connections(&f.bed, "c1", &f.op.ctx.instance_id).await;
    assert!(
        !connections.is_empty()
            && connections
                .iter()
                .all(|(_, local)| local.ends_with(&format!(":{amqps_port}"))),
        "the capture connections came in on c1's TLS acceptor (port {amqps_port}): {connections:?}"
    );

    // Another CA: a new tap's drain fails its handshake and says so.
    let dir = std::env::temp_dir().join(format!("artemis-studio-wrong-ca-{id}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    certificates(&dir);
    let wrong = std::fs::read_to_string(dir.join("ca-b.pem")).expect("pem");
    Api::<Secret>::namespaced(f.admin.clone(), &f.ns)
        .patch(
            "bed-ca",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"ca.crt": wrong}})),
        )
        .await
        .expect("switch the CA");
    let other = format!("cap.{id}.wrong");
    crate::capture::broker_queue(&f.bed, &other).await;
    f.subscribe("wrong", json!({"queues": other})).await;
    f.wait_subscription("wrong", "a tap that says its drain's handshake failed", |s| {
        s.status.as_ref().is_some_and(|st| {
            st.taps.iter().any(|t| {
                t.state == artemis_studio_operator::api::capture::TapState::Degraded
                    && t.message
                        .as_deref()
                        .is_some_and(|m| m.to_lowercase().contains("certificate"))
            })
        })
    })
    .await;
    for name in ["tls", "wrong"] {
        f.subscriptions()
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .expect("delete");
        f.wait_subscription_gone(name).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44: a cluster that uses TLS whose brokers have no TLS acceptor for AMQP (cluster ha of
/// the bed) is not drained in clear: its taps say so, naming the two ways out. With
/// `spec.allowCaptureInClear` they drain over plain AMQP.
#[tokio::test]
async fn brokers_without_a_tls_acceptor_are_not_drained_in_clear_unless_allowed() {
    let _b = brokers_shared().await;
    let user = crate::support::TestBed::broker_user;
    let f = crate::queue::fixture_on("cap-notls", "ha", user, None).await;
    let id = crate::support::short_id();
    f.clean.also(&id);
    let clusters = name_the_beds_ca(&f, "ha").await;
    let set = |spec: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    "ha",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({ "spec": spec })),
                )
                .await
                .expect("patch the cluster")
        }
    };
    let address = format!("cap.{id}.notls");
    crate::capture::queue_on(&f.bed, &["ha1", "ha2"], &address).await;
    let spec = json!({"clusterRef": {"name": "ha"}, "queues": address});
    f.subscribe("notls", spec).await;
    let no_acceptor = |s: &artemis_studio_operator::api::ArtemisCaptureSubscription| {
        let taps = s.status.as_ref().map(|st| st.taps.clone()).unwrap_or_default();
        !taps.is_empty()
            && taps.iter().all(|t| {
                t.state == artemis_studio_operator::api::capture::TapState::Degraded
                    && t.message.as_deref().is_some_and(|m| {
                        m.contains("has no TLS acceptor") && m.contains("spec.allowCaptureInClear")
                    })
            })
    };
    f.wait_subscription(
        "notls",
        "every tap: no TLS acceptor, not drained in clear",
        no_acceptor,
    )
    .await;

    set(json!({"allowCaptureInClear": true})).await;
    f.wait_subscription("notls", "drained in clear once allowed", |s| {
        let taps = s.status.as_ref().map(|st| st.taps.clone()).unwrap_or_default();
        !taps.is_empty()
            && taps
                .iter()
                .all(|t| t.state == artemis_studio_operator::api::capture::TapState::Healthy)
    })
    .await;
    f.subscriptions()
        .delete("notls", &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    f.wait_subscription_gone("notls").await;
}
