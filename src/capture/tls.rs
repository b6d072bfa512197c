//! AMQPS for the drains (issue 44): the TLS handshake made with exactly the cluster's trust —
//! the CA its `spec.tls` names, alone, or the system's trust store when it names none — and the
//! encrypted stream handed to fe2o3 with the credentials as SASL PLAIN.

use std::sync::Arc;

use fe2o3_amqp::Connection;
use fe2o3_amqp::connection::{ConnectionHandle, OpenError};
use fe2o3_amqp::sasl_profile::SaslProfile;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls;

/// What a TLS connection trusts: the CA the cluster names (PEM) alone, or the system's store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Trust {
    Ca(Arc<Vec<u8>>),
    SystemRoots,
}

/// How a cluster's drains reach its brokers (issue 44): over TLS, with the cluster's trust,
/// whenever the cluster uses TLS (an https endpoint, or a CA in `spec.tls`); in clear
/// otherwise, or where a broker has no TLS acceptor and `spec.allowCaptureInClear` says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainTransport {
    /// Some: over TLS, trusting this.
    pub tls: Option<Trust>,
    pub clear_allowed: bool,
}

impl DrainTransport {
    pub fn of(
        spec: &crate::api::cluster::ArtemisClusterSpec,
        access: &crate::topology::ClusterAccess,
    ) -> Self {
        let https = crate::topology::access::schemes(spec).https;
        let tls = match &access.ca {
            Some(ca) => Some(Trust::Ca(ca.clone())),
            None if https => Some(Trust::SystemRoots),
            None => None,
        };
        DrainTransport {
            tls,
            clear_allowed: spec.allow_capture_in_clear,
        }
    }
}

/// Why a TLS connection was not opened: the trust could not be built, or the transport (TCP,
/// the handshake — an untrusted certificate) failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the CA is not PEM: {0}")]
    NotPem(rustls_pki_types::pem::Error),
    #[error("the CA Secret holds no usable certificate")]
    NoCertificate,
    #[error("{0} is not a name a certificate can be checked against")]
    BadName(String),
    #[error("TLS settings: {0}")]
    Settings(#[from] rustls::Error),
    #[error("{0}")]
    Transport(#[from] std::io::Error),
}

/// Open an AMQP connection over TLS to `host:port`, trusting `trust`, logging in with SASL
/// PLAIN as `username`.
pub async fn open(
    container: &str,
    (host, port): (&str, u16),
    trust: &Trust,
    (username, password): (&str, &str),
) -> Result<Result<ConnectionHandle<()>, OpenError>, TlsError> {
    let host = host.trim_matches(['[', ']']);
    let name = ServerName::try_from(host.to_string()).map_err(|_| TlsError::BadName(host.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(trust)?));
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    let tls = connector.connect(name, tcp).await?;
    let profile = SaslProfile::Plain {
        username: username.to_string(),
        password: password.to_string(),
    };
    Ok(Connection::builder()
        .container_id(container)
        .hostname(host)
        .sasl_profile(profile)
        .open_with_stream(tls)
        .await)
}

/// The client side of the handshake: the named CA's certificates as the only roots, or the
/// system's store.
fn client_config(trust: &Trust) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match trust {
        Trust::Ca(pem) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(TlsError::NotPem)?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsError::NoCertificate);
            }
        }
        Trust::SystemRoots => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(endpoint: &str, ca: bool) -> crate::topology::ClusterAccess {
        crate::topology::ClusterAccess {
            http: crate::broker::jolokia::http_client(&crate::broker::Registry::standalone(), None)
                .unwrap_or_else(|e| panic!("{e}")),
            endpoints: vec![endpoint.into()],
            origin: None,
            credentials: crate::broker::Credentials {
                username: "u".into(),
                password: "p".into(),
            },
            request_timeout: std::time::Duration::from_secs(1),
            poll_timeout: std::time::Duration::from_secs(1),
            secret_versions: Default::default(),
            ca: ca.then(|| Arc::new(b"pem".to_vec())),
            full_read_interval: crate::topology::by_change::FULL_READ_INTERVAL,
        }
    }

    /// Issue 44: TLS whenever the cluster uses it, with its trust; clear only otherwise.
    #[test]
    fn drains_use_tls_whenever_the_cluster_does_with_its_trust() {
        let spec = |url: &str| -> crate::api::cluster::ArtemisClusterSpec {
            serde_json::from_value(
                serde_json::json!({"brokers": [{"url": url}], "credentials": {"secretName": "c"}}),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let t = DrainTransport::of(&spec("https://b/j"), &access("https://b/j", false));
        assert_eq!(t.tls, Some(Trust::SystemRoots));
        let t = DrainTransport::of(&spec("http://b/j"), &access("http://b/j", true));
        assert_eq!(t.tls, Some(Trust::Ca(Arc::new(b"pem".to_vec()))));
        let t = DrainTransport::of(&spec("http://b/j"), &access("http://b/j", false));
        assert_eq!(t.tls, None);
        assert!(!t.clear_allowed);
    }

    #[test]
    fn a_ca_that_is_not_pem_is_named() {
        let e = client_config(&Trust::Ca(Arc::new(b"not a certificate".to_vec())))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("no usable certificate") || e.contains("not PEM"),
            "{e}"
        );
    }
}
