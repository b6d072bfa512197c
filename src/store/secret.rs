//! A database setting given on the command line (or its environment) that may hold a password.

/// A setting that may hold a password: its `Debug` (and so `RunArgs`'s) never shows it.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Never fails: a value clap refused would be echoed in its error, password and all; the value
/// is checked at start-up instead (`store::DatabaseConfig`).
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}
