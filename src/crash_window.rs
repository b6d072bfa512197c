//! Test-only crash windows: pause points inside a command where an integration test SIGKILLs
//! the operator (a real crash, not a simulated one). They exist only in builds with the
//! `test-hooks` feature, which the test suite turns on (`deploy/dev/test`); a release build has
//! empty inline functions here and reads no environment variable. In a `test-hooks` build a
//! window opens only when its environment variable names a marker file: the hook writes the
//! marker (what the test waits for) and then sleeps, so the test kills the process there.
//! [`drain_dies`] is the one hook that is not a pause: it makes capture drains die (panic), for
//! the test of their supervision; [`task_ends`] likewise ends one supervised task
//! (`src/supervisor.rs`).

/// One pause point, named by the environment variable that opens it.
#[derive(Debug, Clone, Copy)]
pub enum Window {
    /// A queue or divert fan-out: the first node is written, the others held.
    MidFanout,
    /// A ConnectionClose or MessageReplay armed and its audit intent written, the broker not
    /// yet called.
    AfterArm,
    /// A capture drain's batch committed to Postgres, not yet settled on the broker.
    AfterInsert,
    /// A queue delete on a node: its dependent diverts removed, the queue not yet destroyed.
    AfterDivertsRemoved,
}

#[cfg(feature = "test-hooks")]
mod open {
    use super::Window;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    static FIRST_NODE_TAKEN: AtomicBool = AtomicBool::new(false);

    fn marker(w: Window) -> Option<std::ffi::OsString> {
        std::env::var_os(match w {
            Window::MidFanout => "ARTEMIS_STUDIO_TEST_PAUSE_MID_FANOUT",
            Window::AfterArm => "ARTEMIS_STUDIO_TEST_PAUSE_AFTER_ARM",
            Window::AfterInsert => "ARTEMIS_STUDIO_TEST_PAUSE_AFTER_INSERT",
            Window::AfterDivertsRemoved => "ARTEMIS_STUDIO_TEST_PAUSE_AFTER_DIVERTS_REMOVED",
        })
    }

    pub async fn pause(w: Window, note: &str) {
        if let Some(m) = marker(w) {
            let _ = std::fs::write(m, note);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }

    pub fn mark(w: Window, note: &str) {
        if let Some(m) = marker(w) {
            let _ = std::fs::write(m, note);
        }
    }

    /// The variable names a file; drains die while it exists.
    pub fn drain_dies() -> bool {
        std::env::var_os("ARTEMIS_STUDIO_TEST_DRAIN_DIES").is_some_and(|f| std::path::Path::new(&f).exists())
    }

    /// The variable is `<task>:<file>`: that supervised task (`capture`, `health`) panics once
    /// the file exists (looked for every 100 ms). Never returns otherwise.
    pub async fn task_ends(task: &str) {
        let var = std::env::var("ARTEMIS_STUDIO_TEST_TASK_ENDS").unwrap_or_default();
        match var.split_once(':') {
            Some((t, file)) if t == task => {
                while !std::path::Path::new(file).exists() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("test hook ARTEMIS_STUDIO_TEST_TASK_ENDS={var}");
            }
            _ => std::future::pending().await,
        }
    }

    pub async fn hold_all_but_first_node() {
        if marker(Window::MidFanout).is_some() && FIRST_NODE_TAKEN.swap(true, Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

#[cfg(feature = "test-hooks")]
pub use open::{drain_dies, hold_all_but_first_node, mark, pause, task_ends};

/// Write the window's marker, then sleep (for the test's SIGKILL).
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub async fn pause(_: Window, _: &str) {}

/// Write the window's marker and go on.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn mark(_: Window, _: &str) {}

/// In a fan-out under [`Window::MidFanout`]: the first node goes through, every other waits.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub async fn hold_all_but_first_node() {}

/// Whether a capture drain dies now (panics at its next batch): while the file that
/// `ARTEMIS_STUDIO_TEST_DRAIN_DIES` names exists, every drain of the process does.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn drain_dies() -> bool {
    false
}

/// Panics once the supervised task of this name is to end (`ARTEMIS_STUDIO_TEST_TASK_ENDS`
/// is `<task>:<file>` and the file exists): what the test of supervision kills. Else, and in
/// a release build, never returns.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub async fn task_ends(_: &str) {
    std::future::pending().await
}
