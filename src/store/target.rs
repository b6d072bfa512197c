//! Which Postgres the store connects to: DATABASE_URL checked before any connection, an
//! optional DATABASE_PASSWORD taken as it is, and a description of the server (host, port,
//! database, user: never the password) that every connection error carries (issue 41 item 6).
//!
//! sqlx parses the URL (`PgConnectOptions::from_url`); this module only refuses the URLs whose
//! parse is known to be wrong. A password with a raw `/`, `?` or `#` ends the URL's authority
//! early: the parser then reports "invalid port number", or worse succeeds with a piece of the
//! password as the host, which a connection error would then print. So such a URL is refused
//! before it is used, naming the part that is wrong and never echoing the URL.

use std::fmt;
use std::sync::Arc;

use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

/// How to write a password that has special characters: shown by every URL error.
const HOW_TO_FIX: &str = "Percent-encode special characters in the user name and password \
    ('/' as %2F, '#' as %23, '?' as %3F, '@' as %40, ':' as %3A, '%' as %25, a space as %20), \
    or leave the password out of the URL and give it as it is in DATABASE_PASSWORD \
    (--database-password). The URL is not shown here: it may hold the password.";

/// The part of DATABASE_URL that is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UrlPart {
    /// No `postgres://` in front.
    Scheme,
    /// The host (or what the parser took for it).
    Host,
    /// The port: what follows the last `:` before the host's end.
    Port,
    /// The database name (the path): it has a `/` or an `@`.
    Database,
    /// A `#` and what follows it (a fragment, which Postgres URLs never have).
    Fragment,
    /// The settings after `?`: one is not a Postgres URL setting, or one holds an `@`.
    Query,
    /// The URL as a whole.
    Whole,
}

impl fmt::Display for UrlPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UrlPart::Scheme => "it must start with postgres:// or postgresql://",
            UrlPart::Host => "its host is not a valid host name or address",
            UrlPart::Port => "its port is not a number",
            UrlPart::Database => "its database name (after the host) contains '/' or '@'",
            UrlPart::Fragment => "it contains '#', which cuts the URL short",
            UrlPart::Query => {
                "a setting after '?' is not one a Postgres URL takes (sslmode, sslrootcert, \
                 sslcert, sslkey, host, hostaddr, port, dbname, user, password, \
                 application_name, options, statement-cache-capacity), or holds an '@'"
            }
            UrlPart::Whole => "it is not a valid URL",
        })
    }
}

/// DATABASE_URL cannot be used: which part is wrong and how to fix it (never the URL itself).
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    /// The URL parser refused it, or sqlx refused one of its settings; `part` says where.
    #[error("DATABASE_URL (--database-url): {part}{}. {HOW_TO_FIX}", cause.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Invalid {
        part: UrlPart,
        /// The parser's own reason, which never contains the input.
        cause: Option<url::ParseError>,
    },
    /// sqlx refused a setting of the URL (e.g. an unknown `sslmode`).
    #[error("DATABASE_URL (--database-url): a connection setting is invalid: {0}")]
    Setting(#[source] sqlx::Error),
}

/// Where the store connects, as errors and logs name it: host and port (or socket), database
/// and user. Never the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseTarget {
    pub host: String,
    pub port: u16,
    pub database: Option<String>,
    pub user: String,
}

impl DatabaseTarget {
    pub fn of(options: &PgConnectOptions) -> DatabaseTarget {
        let host = match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => options.get_host().to_string(),
        };
        DatabaseTarget {
            host,
            port: options.get_port(),
            database: options.get_database().map(str::to_string),
            user: options.get_username().to_string(),
        }
    }
}

impl fmt::Display for DatabaseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)?;
        match &self.database {
            Some(db) => write!(f, ", database {db}")?,
            None => write!(f, ", database {} (the user's)", self.user)?,
        }
        write!(f, ", user {}", self.user)
    }
}

/// The connection settings, checked, with the target they describe. Its `Debug` shows the
/// target only: sqlx's own options print the password.
#[derive(Clone)]
pub struct DatabaseConfig {
    options: PgConnectOptions,
    target: Arc<DatabaseTarget>,
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl DatabaseConfig {
    /// From DATABASE_URL and, when given, DATABASE_PASSWORD, which replaces any password in the
    /// URL and is used as it is (no encoding).
    pub fn new(url: &str, password: Option<&str>) -> Result<DatabaseConfig, DatabaseUrlError> {
        let parsed = checked_url(url)?;
        let mut options = PgConnectOptions::from_url(&parsed).map_err(DatabaseUrlError::Setting)?;
        if let Some(password) = password {
            options = options.password(password);
        }
        let target = Arc::new(DatabaseTarget::of(&options));
        Ok(DatabaseConfig { options, target })
    }

    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    pub fn target(&self) -> &Arc<DatabaseTarget> {
        &self.target
    }
}

/// The URL, parsed, unless its parse is known to have gone wrong (see the module docs).
fn checked_url(raw: &str) -> Result<url::Url, DatabaseUrlError> {
    let invalid = |part, cause| DatabaseUrlError::Invalid { part, cause };
    let url = url::Url::parse(raw).map_err(|e| invalid(part_of(e), Some(e)))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(invalid(UrlPart::Scheme, None));
    }
    if url.fragment().is_some() {
        return Err(invalid(UrlPart::Fragment, None));
    }
    // sqlx takes the whole path as the database name: a second `/` or an `@` there is what is
    // left of a user name or password that ended the authority early.
    let database = url.path().trim_start_matches('/');
    if database.contains('/') || database.contains('@') {
        return Err(invalid(UrlPart::Database, None));
    }
    // sqlx logs an unknown setting with its value: after a password cut short at a `?`, that
    // value is the rest of the password. Refused here, unnamed.
    let known = |key: &str| SETTINGS.contains(&key) || key.starts_with("options[");
    if url.query().is_some_and(|q| q.contains('@')) || url.query_pairs().any(|(k, _)| !known(&k)) {
        return Err(invalid(UrlPart::Query, None));
    }
    Ok(url)
}

/// The settings sqlx reads from a Postgres URL's query (`PgConnectOptions::parse_from_url`).
const SETTINGS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The part of the URL a parse error is about.
fn part_of(e: url::ParseError) -> UrlPart {
    use url::ParseError as P;
    match e {
        P::InvalidPort => UrlPart::Port,
        P::EmptyHost
        | P::IdnaError
        | P::InvalidIpv4Address
        | P::InvalidIpv6Address
        | P::InvalidDomainCharacter => UrlPart::Host,
        P::RelativeUrlWithoutBase => UrlPart::Scheme,
        _ => UrlPart::Whole,
    }
}

/// sqlx errors that mean the server could not be reached or refused the session, as opposed to
/// refusing a statement: classified by variant and SQLSTATE class, never by message.
pub fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // 08: connection exception; 28: invalid authorization; 3D000: no such database;
        // 57P01-57P03: the server is shutting down, crashed, or not accepting connections yet.
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08") || c.starts_with("28") || c == "3D000" || c.starts_with("57P0")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> DatabaseUrlError {
        DatabaseConfig::new(url, None).expect_err(url)
    }

    fn part(e: &DatabaseUrlError) -> Option<UrlPart> {
        match e {
            DatabaseUrlError::Invalid { part, .. } => Some(*part),
            DatabaseUrlError::Setting(_) => None,
        }
    }

    #[test]
    fn a_raw_special_character_in_the_password_is_refused_naming_the_part_and_the_fix() {
        let cases = [
            (
                "postgres://user:Qxq@Zzy/Kwk#Jvj@127.0.0.1:5432/db",
                UrlPart::Fragment,
            ),
            ("postgres://user:Qxq/Zzy@127.0.0.1:5432/db", UrlPart::Port),
            ("postgres://user:Qxq?Zzy@127.0.0.1:5432/db", UrlPart::Port),
            ("postgres://user:123/Zzy@127.0.0.1:5432/db", UrlPart::Database),
            ("postgres://user:123?Zzy=Kwk@127.0.0.1:5432/db", UrlPart::Query),
            ("postgres://user@127.0.0.1:5432/db?Zzy=1", UrlPart::Query),
            ("127.0.0.1:5432/db", UrlPart::Scheme),
            ("mysql://user@127.0.0.1/db", UrlPart::Scheme),
        ];
        for (url, want) in cases {
            let e = refused(url);
            assert_eq!(part(&e), Some(want), "{url}: {e}");
            let text = e.to_string();
            assert!(text.contains("DATABASE_URL"), "{text}");
            assert!(
                text.contains("DATABASE_PASSWORD") && text.contains("%23"),
                "{text}"
            );
            for secret in ["Qxq", "Zzy", "Kwk", "Jvj", "123"] {
                assert!(
                    !text.contains(secret),
                    "{url}: the error shows {secret:?}: {text}"
                );
            }
        }
    }

    #[test]
    fn an_encoded_password_and_a_separate_password_both_work() {
        let encoded = DatabaseConfig::new("postgres://user:Qxq%40Zzy%2FKwk%23Jvj@127.0.0.1:5432/db", None)
            .expect("encoded");
        assert_eq!(
            *encoded.target().as_ref(),
            DatabaseTarget {
                host: "127.0.0.1".into(),
                port: 5432,
                database: Some("db".into()),
                user: "user".into()
            }
        );
        let separate = DatabaseConfig::new("postgres://user@127.0.0.1:5432/db", Some("Qxq@Zzy/Kwk#Jvj"))
            .expect("separate");
        assert_eq!(separate.target(), encoded.target());
        // Neither the target nor the config's Debug shows the password.
        for shown in [
            separate.target().to_string(),
            format!("{separate:?}"),
            format!("{encoded:?}"),
        ] {
            assert!(!shown.contains("Zzy") && !shown.contains("Qxq"), "{shown}");
            assert!(shown.contains("127.0.0.1"), "{shown}");
        }
        assert_eq!(
            separate.target().to_string(),
            "127.0.0.1:5432, database db, user user"
        );
    }

    #[test]
    fn known_settings_are_accepted() {
        let c = DatabaseConfig::new(
            "postgres://u@h:5432/db?sslmode=disable&application_name=x&options[search_path]=s",
            None,
        );
        assert!(c.is_ok(), "{c:?}");
    }

    #[test]
    fn a_socket_url_with_the_host_in_its_query_is_accepted() {
        let c = DatabaseConfig::new("postgres:///db?host=/var/run/postgresql", None).expect("socket url");
        assert_eq!(c.target().host, "/var/run/postgresql");
    }
}
