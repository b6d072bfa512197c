//! One AMQP connection and one session per node for all of a process's drains there (issue 25:
//! capture pays per node, not per tap). Each drain attaches its own receiver (its own credit,
//! settlement and failure) to the node's session; the connection lives while a drain uses it
//! and closes with the last one (dropping fe2o3's handles sends Close and End). A connection
//! that broke is replaced by the next drain that attaches; a receiver that failed alone (its
//! queue gone) leaves the others attached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::link::ReceiverAttachError;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::BeginError;
use fe2o3_amqp::{Connection, Receiver, Session};

/// The session's incoming window: large, so link credit alone paces each drain (fe2o3 widens
/// it again at half way).
const SESSION_WINDOW: u32 = 65_536;

/// Where a drain connects, and as whom: one connection per distinct value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LinkKey {
    /// `amqp://host:port` (or `amqps://`, over TLS) of the node's active broker.
    pub url: String,
    pub username: String,
    pub password: String,
    /// For `amqps://`: what the handshake trusts (issue 44: the cluster's own trust).
    pub trust: Trust,
}

pub use super::tls::Trust;

struct Link {
    // Kept for its lifetime: dropping it closes the connection.
    connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
}

impl Link {
    fn broken(&self) -> bool {
        self.connection.is_closed() || self.session.is_ended()
    }
}

/// How long opening a connection, or an attach, may take before the connection is given up.
const ATTACH_WITHIN: Duration = Duration::from_secs(20);

/// Why a drain has no receiver: which step of reaching the node's queue failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The node's AMQP URL does not parse.
    #[error("AMQP URL {url}: {source}")]
    Url {
        url: String,
        #[source]
        source: url::ParseError,
    },
    /// The URL has no place for a username and password.
    #[error("AMQP URL {url} takes no credentials")]
    NoCredentials { url: String },
    /// An `amqps://` connection: its trust could not be built (a CA that is not PEM), or TCP
    /// or the handshake (an untrusted certificate) failed.
    #[error("connect to {url}: {source}")]
    Tls {
        url: String,
        #[source]
        source: super::tls::TlsError,
    },
    /// The AMQP connection (TCP, SASL, Open) failed.
    #[error("connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: OpenError,
    },
    /// Opening the connection and its session took longer than [`ATTACH_WITHIN`].
    #[error("connect to {url}: no answer within {}s", .within.as_secs())]
    ConnectTimedOut { url: String, within: Duration },
    /// The connection opened; its session (Begin) did not.
    #[error("session on {url}: {source}")]
    Session {
        url: String,
        #[source]
        source: BeginError,
    },
    /// The connection just opened is not there (never expected).
    #[error("no connection to {url}")]
    NoConnection { url: String },
    /// The broker refused the receiver's Attach (the queue is gone, or not ours to read).
    #[error("attach to {fqqn}: {source}")]
    Attach {
        fqqn: String,
        #[source]
        source: ReceiverAttachError,
    },
    /// The Attach took longer than [`ATTACH_WITHIN`]: the connection is given up.
    #[error("attach to {fqqn}: no answer within {}s", .within.as_secs())]
    AttachTimedOut { fqqn: String, within: Duration },
}

type Slot = tokio::sync::Mutex<Option<Link>>;

/// What a drain holds while its receiver is attached: the node's connection stays open for it.
pub struct Lease {
    _slot: Arc<Slot>,
}

/// The process's connections, by node and credentials.
#[derive(Clone)]
pub struct NodeLinks {
    /// The connections' container-id prefix: `artemis-studio-capture-<instance>-`, so a broker's
    /// connection list says which installation holds each.
    prefix: String,
    slots: Arc<Mutex<HashMap<LinkKey, Weak<Slot>>>>,
}

impl NodeLinks {
    pub fn new(instance_id: &str) -> Self {
        NodeLinks {
            prefix: container_prefix(instance_id),
            slots: Arc::default(),
        }
    }

    /// A receiver on `source` (an FQQN) with manual credit, on the node's shared session,
    /// opening the connection first when there is none or it broke.
    pub async fn attach(
        &self,
        key: &LinkKey,
        link_name: &str,
        source: &str,
    ) -> Result<(Receiver, Lease), LinkError> {
        let slot = self.slot(key);
        let mut link = slot.lock().await;
        if link.as_ref().is_none_or(Link::broken) {
            *link = None;
            let opened = tokio::time::timeout(ATTACH_WITHIN, self.open(key))
                .await
                .map_err(|_| LinkError::ConnectTimedOut {
                    url: key.url.clone(),
                    within: ATTACH_WITHIN,
                })?;
            *link = Some(opened?);
        }
        let Some(l) = link.as_mut() else {
            return Err(LinkError::NoConnection { url: key.url.clone() });
        };
        let attach = Receiver::builder()
            .name(link_name)
            .source(source)
            .credit_mode(CreditMode::Manual)
            .attach(&mut l.session);
        let receiver = match tokio::time::timeout(ATTACH_WITHIN, attach).await {
            Ok(r) => r.map_err(|e| LinkError::Attach {
                fqqn: source.to_string(),
                source: e,
            })?,
            Err(_) => {
                // A connection that cannot attach in time is not used again: the next drain
                // to attach opens a new one (the others' receivers end with this one).
                *link = None;
                return Err(LinkError::AttachTimedOut {
                    fqqn: source.to_string(),
                    within: ATTACH_WITHIN,
                });
            }
        };
        drop(link);
        Ok((receiver, Lease { _slot: slot }))
    }

    fn slot(&self, key: &LinkKey) -> Arc<Slot> {
        let Ok(mut slots) = self.slots.lock() else {
            return Arc::new(tokio::sync::Mutex::new(None));
        };
        slots.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = slots.get(key).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(tokio::sync::Mutex::new(None));
        slots.insert(key.clone(), Arc::downgrade(&s));
        s
    }

    async fn open(&self, key: &LinkKey) -> Result<Link, LinkError> {
        let url = with_credentials(key)?;
        let container = format!("{}{}", self.prefix, uuid::Uuid::new_v4().simple());
        let opened = match url.scheme() {
            "amqps" => {
                let host = url.host_str().unwrap_or("localhost");
                let at = (host, url.port().unwrap_or(5671));
                let login = (key.username.as_str(), key.password.as_str());
                super::tls::open(&container, at, &key.trust, login)
                    .await
                    .map_err(|source| LinkError::Tls {
                        url: key.url.clone(),
                        source,
                    })?
            }
            _ => Connection::open(container, url).await,
        };
        let mut connection = opened.map_err(|source| LinkError::Connect {
            url: key.url.clone(),
            source,
        })?;
        let session = Session::builder()
            .incoming_window(SESSION_WINDOW)
            .begin(&mut connection)
            .await
            .map_err(|source| LinkError::Session {
                url: key.url.clone(),
                source,
            })?;
        Ok(Link { connection, session })
    }
}

/// The container-id prefix of an installation's capture connections.
pub fn container_prefix(instance_id: &str) -> String {
    format!("artemis-studio-capture-{instance_id}-")
}

/// The node's URL with the credentials in its userinfo, percent-encoded by `url`.
fn with_credentials(key: &LinkKey) -> Result<url::Url, LinkError> {
    let mut url = url::Url::parse(&key.url).map_err(|source| LinkError::Url {
        url: key.url.clone(),
        source,
    })?;
    url.set_username(&key.username)
        .and_then(|()| url.set_password(Some(&key.password)))
        .map_err(|()| LinkError::NoCredentials { url: key.url.clone() })?;
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_in_the_userinfo_percent_encoded() {
        let key = LinkKey {
            url: "amqp://127.0.0.1:5672".into(),
            username: "ad min".into(),
            password: "p@ss:w/rd".into(),
            trust: Trust::SystemRoots,
        };
        let url = with_credentials(&key).expect("url");
        assert_eq!(url.as_str(), "amqp://ad%20min:p%40ss%3Aw%2Frd@127.0.0.1:5672");
    }

    #[test]
    fn a_url_that_cannot_carry_credentials_is_named() {
        let key = LinkKey {
            url: "mailto:ops@example.com".into(),
            username: "u".into(),
            password: "p".into(),
            trust: Trust::SystemRoots,
        };
        let e = with_credentials(&key).expect_err("no userinfo in a mailto: URL");
        assert!(matches!(e, LinkError::NoCredentials { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "AMQP URL mailto:ops@example.com takes no credentials"
        );
    }
}
