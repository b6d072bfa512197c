//! A cluster's access: its spec dereferenced into what can be polled and written with — the
//! credentials and CA read from their Secrets (the one place they are read and validated),
//! the endpoints (static and discovered).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::ClusterAccess;
use crate::api::cluster::ArtemisClusterSpec;
use crate::broker::{Credentials, jolokia};

/// Why a cluster cannot be reached at all: a condition reason and a message naming the fix.
#[derive(Debug)]
pub struct AccessProblem {
    pub reason: &'static str,
    pub message: String,
}

/// The values of `keys` in one Secret, read with one GET, and the Secret's resourceVersion.
async fn secret_values(
    client: &kube::Client,
    ns: &str,
    name: &str,
    keys: &[&str],
    field: &str,
) -> Result<(Vec<Vec<u8>>, String), AccessProblem> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets.get_opt(name).await.map_err(|e| AccessProblem {
        reason: "SecretUnreadable",
        message: format!("{field}: cannot read Secret {ns}/{name}: {e}"),
    })?;
    let secret = secret.ok_or_else(|| AccessProblem {
        reason: "SecretMissing",
        message: format!("{field}: Secret {ns}/{name} does not exist: create it (e.g. kubectl -n {ns} create secret generic {name} --from-literal=username=… --from-literal=password=…)"),
    })?;
    let values = keys
        .iter()
        .map(|key| {
            let value = secret
                .data
                .as_ref()
                .and_then(|d| d.get(*key))
                .map(|b| b.0.clone());
            value.ok_or_else(|| AccessProblem {
                reason: "SecretKeyMissing",
                message: format!(
                    "{field}: Secret {ns}/{name} has no key '{key}': add it, or set the key name in the spec"
                ),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((values, secret.resource_version().unwrap_or_default()))
}

/// The Secrets a cluster's access is read from: the credentials, and the CA when TLS is set.
pub fn secret_names(spec: &ArtemisClusterSpec) -> Vec<String> {
    let mut names = vec![spec.credentials.secret_name.clone()];
    if let Some(tls) = &spec.tls {
        names.push(tls.ca_secret_name.clone());
    }
    names
}

/// What a cluster's Secrets hold now: the credentials, the CA (when TLS is set), and each
/// Secret's resourceVersion.
pub struct SecretMaterial {
    pub credentials: Credentials,
    pub ca: Option<Vec<u8>>,
    pub versions: std::collections::BTreeMap<String, String>,
}

/// Read and validate a cluster's Secrets (one GET each): the cluster's poll and the gate
/// before every broker write use this, so both refuse for the same reasons, in the same words.
pub async fn read_secrets(
    client: &kube::Client,
    ns: &str,
    spec: &ArtemisClusterSpec,
) -> Result<SecretMaterial, AccessProblem> {
    let c = &spec.credentials;
    let keys = [c.username_key.as_str(), c.password_key.as_str()];
    let mut versions = std::collections::BTreeMap::new();
    // One value per key, in order (an absent key is an error above).
    let (values, version) = secret_values(client, ns, &c.secret_name, &keys, "spec.credentials").await?;
    versions.insert(c.secret_name.clone(), version);
    let mut values = values.into_iter();
    let (username, password) = (
        values.next().unwrap_or_default(),
        values.next().unwrap_or_default(),
    );
    let credentials = Credentials {
        username: String::from_utf8_lossy(&username).trim().to_string(),
        password: String::from_utf8_lossy(&password)
            .trim_end_matches(['\n', '\r'])
            .to_string(),
    };
    let ca = match &spec.tls {
        Some(tls) => {
            let (mut values, version) =
                secret_values(client, ns, &tls.ca_secret_name, &[&tls.ca_key], "spec.tls").await?;
            versions.insert(tls.ca_secret_name.clone(), version);
            values.pop()
        }
        None => None,
    };
    Ok(SecretMaterial {
        credentials,
        ca,
        versions,
    })
}

/// Dereference a cluster's spec into something that can be polled.
pub async fn resolve_access(
    client: &kube::Client,
    ns: &str,
    spec: &ArtemisClusterSpec,
    registry: &std::sync::Arc<crate::broker::Registry>,
) -> Result<ClusterAccess, AccessProblem> {
    let secrets = read_secrets(client, ns, spec).await?;
    let http = jolokia::http_client(registry, secrets.ca.as_deref()).map_err(|e| AccessProblem {
        reason: "InvalidTls",
        message: format!("spec.tls.caSecretName: {e}"),
    })?;
    let endpoints = endpoints(client, ns, spec).await?;
    Ok(ClusterAccess {
        http,
        endpoints,
        origin: spec.origin.clone(),
        credentials: secrets.credentials,
        request_timeout: Duration::from_secs(spec.request_timeout_seconds.into()),
        poll_timeout: Duration::from_secs(spec.poll_timeout_seconds.into()),
        secret_versions: secrets.versions,
        ca: secrets.ca.map(Arc::new),
        full_read_interval: Duration::from_secs(spec.full_read_interval_seconds.into()),
    })
}

/// The endpoints to poll: the static list, and the pods discovery finds.
async fn endpoints(
    client: &kube::Client,
    ns: &str,
    spec: &ArtemisClusterSpec,
) -> Result<Vec<String>, AccessProblem> {
    refuse_user_info(spec)?;
    let mut endpoints: Vec<String> = spec.brokers.iter().map(|b| b.url.clone()).collect();
    if let Some(d) = &spec.discovery {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let selector = d
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| AccessProblem {
                reason: "DiscoveryFailed",
                message: format!("spec.discovery: listing pods with labels {selector}: {e}"),
            })?;
        for pod in list {
            if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_ref()) {
                endpoints.push(format!("{}://{}:{}{}", d.scheme, ip, d.port, d.path));
            }
        }
    }
    endpoints.sort();
    endpoints.dedup();
    if endpoints.is_empty() {
        return Err(AccessProblem {
            reason: "NoEndpoints",
            message: "no endpoints: spec.brokers is empty and spec.discovery matched no running pod".into(),
        });
    }
    Ok(endpoints)
}

/// Issue 44: credentials live in the Secret only. Admission refuses a URL with user info (CEL);
/// an object admitted before that rule is refused here, before anything is sent to it, in
/// words that do not repeat the URL (transport errors would echo it into status and logs).
fn refuse_user_info(spec: &ArtemisClusterSpec) -> Result<(), AccessProblem> {
    let carries = |url: &str| {
        reqwest::Url::parse(url).is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
    };
    match spec.brokers.iter().position(|b| carries(&b.url)) {
        Some(i) => Err(AccessProblem {
            reason: "CredentialsInUrl",
            message: format!(
                "spec.brokers[{i}].url carries credentials (user:password@ before the host): nothing is sent to it; remove them from the URL and put them in the Secret that spec.credentials names"
            ),
        }),
        None => Ok(()),
    }
}

/// Which schemes a cluster's endpoints use, as its spec names them (the static URLs and the
/// discovery's scheme): whether the cluster uses TLS, for its status and its capture drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schemes {
    pub https: bool,
    pub http: bool,
}

pub fn schemes(spec: &ArtemisClusterSpec) -> Schemes {
    let named = spec
        .brokers
        .iter()
        .map(|b| b.url.split_once("://").map_or("", |(s, _)| s))
        .chain(spec.discovery.as_ref().map(|d| d.scheme.as_str()));
    let (mut https, mut http) = (false, false);
    for s in named {
        https |= s.eq_ignore_ascii_case("https");
        http |= s.eq_ignore_ascii_case("http");
    }
    Schemes { https, http }
}

/// What the cluster's connections trust, as `status.trust` says it (issue 44): the CA spec.tls
/// names alone (`jolokia::http_client` loads no public root then), the system's trust store
/// when it names none, and plain http said for what it is.
pub fn trust_statement(spec: &ArtemisClusterSpec) -> String {
    let Schemes { https, http } = schemes(spec);
    let tls = match &spec.tls {
        Some(t) => format!(
            "TLS trusting only the CA in Secret {} (key {}, spec.tls): no public root",
            t.ca_secret_name, t.ca_key
        ),
        None => "TLS trusting the operator's system trust store (the public roots; SSL_CERT_FILE or SSL_CERT_DIR when set): name a CA in spec.tls to trust that CA alone".into(),
    };
    let clear =
        "plain http: the credentials and every management call travel unencrypted; use https endpoints";
    let jolokia = match (https, http) {
        (true, false) => tls,
        (true, true) => format!("{tls}; some endpoints are {clear}"),
        _ => clear.into(),
    };
    // The capture drains (capture::tls::DrainTransport): TLS whenever the cluster uses it.
    let capture = match (&spec.tls, https) {
        (Some(t), _) => format!("AMQPS trusting only the CA in Secret {}", t.ca_secret_name),
        (None, true) => "AMQPS trusting the system trust store".into(),
        (None, false) => "plain AMQP (payloads in clear): name a CA in spec.tls to drain over AMQPS".into(),
    };
    let in_clear = if spec.allow_capture_in_clear {
        ", or plain AMQP from a broker with no TLS acceptor (spec.allowCaptureInClear)"
    } else {
        ""
    };
    format!("Jolokia: {jolokia}. Capture drains: {capture}{in_clear}")
}

#[cfg(test)]
mod tests {
    use super::trust_statement;

    fn spec(urls: &[&str], tls: bool) -> crate::api::cluster::ArtemisClusterSpec {
        let mut v = serde_json::json!({
            "brokers": urls.iter().map(|u| serde_json::json!({"url": u})).collect::<Vec<_>>(),
            "credentials": {"secretName": "c"}
        });
        if tls {
            v["tls"] = serde_json::json!({"caSecretName": "ca"});
        }
        serde_json::from_value(v).unwrap_or_else(|e| panic!("spec: {e}"))
    }

    /// Issue 44: a URL with user info (admitted before the CEL rule) is refused before any
    /// request, naming the field and not repeating the URL.
    #[test]
    fn a_url_with_credentials_is_refused_without_repeating_them() {
        let s = spec(
            &["https://b/j", "https://admin:Secr3t@b:8161/console/jolokia"],
            false,
        );
        let problem = super::refuse_user_info(&s)
            .err()
            .unwrap_or_else(|| panic!("admitted"));
        assert_eq!(problem.reason, "CredentialsInUrl");
        assert!(
            problem.message.contains("spec.brokers[1].url"),
            "{}",
            problem.message
        );
        assert!(
            !problem.message.contains("Secr3t") && !problem.message.contains("admin"),
            "{}",
            problem.message
        );
        assert!(super::refuse_user_info(&spec(&["https://b:8161/console/jolokia"], false)).is_ok());
    }

    /// Issue 44: status says what the connections trust, as the client is built.
    #[test]
    fn the_trust_statement_names_the_ca_alone_the_public_roots_or_plain_http() {
        let named = trust_statement(&spec(&["https://b:8161/console/jolokia"], true));
        assert!(
            named.contains("only the CA in Secret ca (key ca.crt") && named.contains("no public root"),
            "{named}"
        );
        let public = trust_statement(&spec(&["https://b:8161/console/jolokia"], false));
        assert!(
            public.contains("system trust store") && public.contains("spec.tls"),
            "{public}"
        );
        let clear = trust_statement(&spec(&["http://b:8161/console/jolokia"], true));
        assert!(
            clear.starts_with("Jolokia: plain http")
                && clear.contains("Capture drains: AMQPS trusting only the CA in Secret ca"),
            "{clear}"
        );
        let none = trust_statement(&spec(&["http://b:8161/console/jolokia"], false));
        assert!(none.contains("Capture drains: plain AMQP"), "{none}");
        let mixed = trust_statement(&spec(&["https://a/j", "http://b/j"], true));
        assert!(
            mixed.contains("only the CA") && mixed.contains("plain http"),
            "{mixed}"
        );
    }
}
