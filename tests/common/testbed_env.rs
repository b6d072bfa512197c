//! Where the running test bed's settings are (`deploy/dev/testbed env` writes them), shared by
//! the integration tests, the benchmark and the faults scenario (each includes this file by
//! `#[path]`).

use std::collections::HashMap;
use std::path::PathBuf;

/// The env file: `ARTEMIS_STUDIO_TESTBED_ENV`, else `testbed/env` under the project's cache
/// (`ARTEMIS_STUDIO_CACHE`, else `$XDG_CACHE_HOME` or `~/.cache`, then `artemis-studio`).
fn env_file() -> PathBuf {
    if let Ok(p) = std::env::var("ARTEMIS_STUDIO_TESTBED_ENV") {
        return PathBuf::from(p);
    }
    let cache = std::env::var("ARTEMIS_STUDIO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            let base = std::env::var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache"));
            base.join("artemis-studio")
        });
    cache.join("testbed").join("env")
}

/// The running test bed's settings, or what to run when it is not up.
pub fn read() -> Result<HashMap<String, String>, String> {
    let path = env_file();
    std::fs::read_to_string(&path)
        .map(|text| vars(&text))
        .map_err(|e| {
            format!(
                "the test bed is not up ({}: {e}); run `deploy/dev/testbed up`",
                path.display()
            )
        })
}

/// The env file's `KEY=value` lines.
fn vars(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
